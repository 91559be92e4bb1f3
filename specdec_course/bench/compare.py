"""One method against plain decoding on this machine, and the stored CPU bench's verdict.

``specdec-course generate --compare`` times the chosen method against plain decoding in the
same process (:func:`time_round_robin`); the README and ``generate --help`` name the method
that the stored bench (``data/results/speedup_cpu.json``) found fastest (:func:`fastest_method`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from .._validate import check_int, check_real

__all__ = ["time_round_robin", "fastest_method", "describe_fastest"]

# The names `generate --method` uses for the bench's methods ("draft" is the draft model).
CLI_METHOD = {
    "draft": "speculative",
    "ngram": "ngram",
    "distilled": "distilled",
    "medusa": "medusa",
}


def time_round_robin(runs: dict[str, Callable[[], object]], repeats: int = 5) -> dict[str, float]:
    """Median seconds of each zero-argument callable in ``runs``, over ``repeats`` rounds.

    Every round calls each callable once, in turn, so that a slow moment of the machine hits
    all of them alike (the bench's rule). Returns ``{name: median seconds}``. Raises
    ValueError for no callables or ``repeats`` < 1.
    """
    check_int(repeats, "repeats")
    if not runs:
        raise ValueError("runs is empty: give at least one callable to time")
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) for name, s in seconds.items()}


def fastest_method(record: dict, temperature: float = 1.0) -> dict:
    """The fastest row of a stored ``bench speedup`` record at ``temperature``.

    Returns ``{"method" (as ``generate --method`` names it), "k" (None for Medusa), "tree"
    (Medusa only), "speedup" (measured, over plain decoding), "temperature", "machine",
    "plain_fastest" (True when no method beat plain decoding)}``. Raises ValueError when the
    record holds no run at that temperature.
    """
    check_real(temperature, "temperature", low=0.0)
    runs = [r for r in record.get("results", []) if r.get("temperature") == temperature]
    if not runs:
        temps = sorted({r.get("temperature") for r in record.get("results", [])})
        raise ValueError(
            f"the bench record has no run at temperature {temperature}; it has {temps}"
        )
    res = runs[0]
    rows = [
        {"method": CLI_METHOD[m], "k": r["k"], "tree": None, "speedup": r["measured_speedup"]}
        for m, rs in res["methods"].items()
        for r in rs
    ]
    rows += [
        {"method": "medusa", "k": None, "tree": r["tree"], "speedup": r["measured_speedup"]}
        for r in res.get("medusa", [])
    ]
    best = max(rows, key=lambda r: r["speedup"])
    return {
        **best,
        "temperature": temperature,
        "machine": record.get("machine", "unknown machine"),
        "plain_fastest": best["speedup"] <= 1.0,
    }


def describe_fastest(best: dict) -> str:
    """One sentence for :func:`fastest_method`'s answer, as the README and help print it."""
    if best["plain_fastest"]:
        return (
            f"in the stored CPU bench ({best['machine']}) no method beat plain decoding at "
            f"temperature {best['temperature']:g}: use --method autoregressive"
        )
    how = f"--k {best['k']}" if best["k"] is not None else f"tree {best['tree']}"
    return (
        f"fastest in the stored CPU bench ({best['machine']}) at temperature "
        f"{best['temperature']:g}: --method {best['method']} {how}, "
        f"{best['speedup']:.2f}x plain decoding"
    )
