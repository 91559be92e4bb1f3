"""One method against plain decoding on this machine, and the stored CPU bench's verdict.

``specdec-course generate --compare`` times the chosen method against plain decoding in the
same process (:func:`time_round_robin`); the README and ``generate --help`` name the method
that the stored bench (``data/results/speedup_cpu.json``) found fastest (:func:`fastest_method`),
and ``generate`` runs each method at the setting that bench found best (:func:`stored_best`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from .._validate import check_int, check_real

__all__ = ["time_round_robin", "fastest_method", "describe_fastest", "stored_best", "BENCH_METHOD"]

# The names `generate --method` uses for the bench's methods ("draft" is the draft model).
CLI_METHOD = {
    "draft": "speculative",
    "ngram": "ngram",
    "distilled": "distilled",
    "medusa": "medusa",
    "eagle": "eagle",  # bench speedup --method all measures it too
    "fused": "fused",
    "recurrent": "recurrent",
}
# The methods whose best setting is read from ``bench eagle``'s record.
EAGLE_RECORD = ("eagle", "fused", "recurrent")
# ... and back: the stored record's name for each ``generate --method``.
BENCH_METHOD = {cli: bench for bench, cli in CLI_METHOD.items()}


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


def stored_best(method: str, temperature: float, *, speedup=None, eagle=None) -> dict:
    """The best setting of ``generate --method`` in the stored CPU benches, for ``temperature``.

    ``method`` as ``generate`` names it (``"speculative"``, ``"ngram"``, ``"distilled"``,
    ``"medusa"``, ``"eagle"``, ``"fused"``, ``"recurrent"``). The record read is ``speedup``
    (default: the stored ``bench speedup`` record, ``data/results/speedup_cpu.json``) or, for
    the EAGLE-style drafts (``EAGLE_RECORD``), ``eagle``
    (default: ``data/results/eagle_cpu.json``). When the record has no run at
    ``temperature``, the run at the nearest stored temperature is used, and the answer says
    so. Returns ``{"method", "k" (None for Medusa), "tree" (Medusa only), "speedup"
    (measured over plain decoding), "temperature" (the stored run's), "exact" (False when
    that is not ``temperature``), "machine", "record" (its file name)}``. Raises
    FileNotFoundError when the record is missing, ValueError for another method or a record
    without the method.
    """
    from .eagle_race import RESULTS_FILE, load_eagle_results
    from .speedup_record import load_speedup_results

    check_real(temperature, "temperature", low=0.0)
    if method not in BENCH_METHOD:
        raise ValueError(f"method must be one of {sorted(BENCH_METHOD)}; got {method!r}")
    if method in EAGLE_RECORD:
        record, name = (eagle if eagle is not None else load_eagle_results()), RESULTS_FILE
        runs = record.get("runs", [])
    else:
        record = speedup if speedup is not None else load_speedup_results()
        name, runs = "speedup_cpu.json", record.get("results", [])
    if not runs:
        raise ValueError(f"the stored record {name} holds no runs")
    run = min(runs, key=lambda r: (abs(r["temperature"] - temperature), r["temperature"]))
    key = BENCH_METHOD[method]
    if method in EAGLE_RECORD:
        best = run["methods"].get(key)
        if best is None:
            raise ValueError(f"the stored record {name} has no {key!r} rows")
        k, tree, sp = best["best_k"], None, best["best_speedup"]
    elif method == "medusa":
        rows = run.get("medusa") or []
        if not rows:
            raise ValueError(f"the stored record {name} has no Medusa rows")
        row = max(rows, key=lambda r: r["measured_speedup"])
        k, tree, sp = None, row["tree"], row["measured_speedup"]
    else:
        rows = run["methods"].get(key)
        if not rows:
            raise ValueError(f"the stored record {name} has no {key!r} rows")
        row = max(rows, key=lambda r: r["measured_speedup"])
        k, tree, sp = row["k"], None, row["measured_speedup"]
    return {
        "method": method,
        "k": k,
        "tree": tree,
        "speedup": sp,
        "temperature": run["temperature"],
        "exact": run["temperature"] == temperature,
        "machine": record.get("machine", "unknown machine"),
        "record": name,
    }
