"""When speculation pays, measured on the CPU (``specdec-course bench beyond``; lessons 08, 09).

Three measurements, each a set of ratios taken in one run (round-robin, one thread, every
method decoding the same prompts from the same seeds, so machine load hits all alike):

- ``measure_dynamic``: plain decoding against the draft model at every fixed ``k`` and
  under the dynamic policies (Hugging Face's heuristic, the confidence stop, the alpha/cost
  controller); speedup and mean drafts per iteration.
- ``measure_batch`` (in ``bench.batch_sizes``): tokens per second of plain and speculative
  decoding for ``B`` rows at once (``decoding.batched``), at several ``k``; the ``B`` where
  the best ``k`` stops paying,
  beside what a ``(k + 1)``-token target call costs relative to a one-token one at that ``B``
  (the reason: at batch 1 it is nearly free, at large ``B`` it is not). ``batch_ceiling``
  turns those call costs into what a loop without overhead of its own could gain at each
  ``B``, and where that falls below 1.
- ``measure_block``: accepted drafts per target call with token-wise and with block
  verification (``block_verifier``), same prompts and seeds.

Times are the decoding thread's CPU time (``time.thread_time``; torch runs its ops on the
calling thread at one thread), not wall time: on a shared machine another process's work
then delays a method without being charged to it, and the ratios hold under load.

``save_beyond_results`` writes ``data/results/beyond_cpu.json``; ``load_beyond_results``
reads it back.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from .._validate import check_int, check_real
from ._args import check_run
from .records import load_record, save_record

__all__ = [
    "DYNAMIC_KS",
    "marginal_cost",
    "measure_dynamic",
    "measure_block",
    "save_beyond_results",
    "load_beyond_results",
]

DYNAMIC_KS = tuple(range(1, 9))
RESULTS_FILE = "beyond_cpu.json"
_clock = time.thread_time  # see the module docstring


def marginal_cost(costs: dict) -> float:
    """The cost of one more drafted token in one-token target steps, from ``forward_costs``.

    ``costs``: :func:`bench.forward_costs`'s record (sizes 1 and 8 at least). One more draft
    costs a draft step plus what one more position adds to the target's call (the slope of
    the target's cost between 1 and 8 new tokens). This is the ``c`` ``ControllerK`` takes.
    Raises ValueError when the record lacks sizes 1 and 8."""
    sizes = costs.get("sizes", [])
    if 1 not in sizes or 8 not in sizes:
        raise ValueError("marginal_cost needs forward_costs measured at sizes 1 and 8")
    i1, i8 = sizes.index(1), sizes.index(8)
    t1 = costs["target_s"][i1]
    slope = (costs["target_s"][i8] - t1) / 7
    return (costs["draft_s"][i1] + max(slope, 0.0)) / t1


def _policies(draft, c: float) -> dict:
    """Name -> (proposer, k_policy, k_max) for the dynamic rows."""
    from ..decoding import ControllerK, HeuristicK
    from ..drafts import ModelProposer

    k_max = max(DYNAMIC_KS)
    return {
        "heuristic": (draft, HeuristicK(5), k_max),
        "confidence stop 0.4": (ModelProposer(draft, p_min=0.4), None, k_max),
        "heuristic + stop 0.4": (ModelProposer(draft, p_min=0.4), HeuristicK(5), k_max),
        "controller": (draft, ControllerK(c), k_max),
    }


def measure_dynamic(
    target,
    draft,
    prompts,
    *,
    c: float,
    temperature: float = 1.0,
    repeats: int = 5,
    max_new_tokens: int = 200,
    seed: int = 0,
) -> dict:
    """Plain decoding against fixed ``k`` (``DYNAMIC_KS``) and the dynamic policies.

    ``c``: the controller's cost ratio (:func:`marginal_cost`). Every repeat decodes every
    prompt with each method in turn from the same seed (a round); a row's speedup is the
    median over rounds of plain's time over its time. Returns ``{"temperature", "c", "rows":
    [{"name", "k_max", "alpha", "mean_k", "tokens_per_target_call", "speedup"}],
    "best_fixed", "best_dynamic"}``
    (``mean_k``: drafts per iteration).
    """
    check_run(target=target, drafts={"draft": draft}, prompts=prompts, repeats=repeats)
    check_run(max_new_tokens=max_new_tokens, seed=seed, temperature=temperature)
    check_real(c, "c", low=0.0, hint=" (the cost of a drafted token / a target step)")
    from ..decoding import SpecStats, generate, speculative_generate

    methods = {f"fixed k={k}": (draft, None, k) for k in DYNAMIC_KS}
    methods.update(_policies(draft, c))
    names = ["plain", *methods]
    rounds: list[dict] = []  # one per (repeat, prompt): every method's seconds, adjacent in time
    agg = {name: SpecStats(k=m[2]) for name, m in methods.items()}
    for rep in range(repeats):
        for i, prompt in enumerate(prompts):
            s = seed + 1000 * rep + i
            t = dict.fromkeys(names, 0.0)
            g = torch.Generator().manual_seed(s)
            t0 = _clock()
            generate(target, prompt, max_new_tokens, temperature=temperature, generator=g)
            t["plain"] = _clock() - t0
            for name, (proposer, policy, k) in methods.items():
                g = torch.Generator().manual_seed(s)
                t0 = _clock()
                _, st = speculative_generate(
                    target,
                    proposer,
                    prompt,
                    max_new_tokens,
                    k=k,
                    temperature=temperature,
                    generator=g,
                    k_policy=policy,
                )
                t[name] = _clock() - t0
                agg[name].add(st)
            rounds.append(t)
    rows = []
    for name, (_, _, k) in methods.items():
        st = agg[name]
        rows.append(
            {
                "name": name,
                "k_max": k,
                "alpha": min(st.acceptance_rate, 1.0),
                "mean_k": st.drafted / max(1, st.iterations),
                "tokens_per_target_call": st.tokens_per_target_call,
                # the median over rounds of plain / method: each ratio is taken within
                # seconds, so a slow spell of the machine cancels out of it
                "speedup": statistics.median(r["plain"] / r[name] for r in rounds),
            }
        )
    fixed = [r for r in rows if r["name"].startswith("fixed")]
    dynamic = [r for r in rows if not r["name"].startswith("fixed")]
    return {
        "temperature": temperature,
        "c": c,
        "repeats": repeats,
        "max_new_tokens": max_new_tokens,
        "prompts": len(prompts),
        "rows": rows,
        "best_fixed": max(fixed, key=lambda r: r["speedup"])["name"],
        "best_dynamic": max(dynamic, key=lambda r: r["speedup"])["name"],
    }


def measure_block(
    target, draft, prompts, *, ks=(2, 4, 6, 8), runs: int = 3, max_new_tokens: int = 200
) -> dict:
    """Accepted drafts per target call, token-wise against block verification (temperature 1).

    Both verifiers decode every prompt ``runs`` times from the same seeds. Returns ``{"rows":
    [{"k", "token_accepted", "block_accepted", "gain", "diff", "diff_se"}]}`` (mean accepted
    drafts per iteration; ``gain`` = block / token, ``diff`` = block - token). ``diff_se`` is
    the standard error of ``diff`` with each (run, prompt) decode as one unit, both verifiers'
    decodes of a unit paired (same seed): the iterations of one decode are not independent,
    the decodes are. ``units`` = runs x prompts."""
    check_run(target=target, drafts={"draft": draft}, prompts=prompts, ks=ks)
    check_int(runs, "runs")
    check_int(max_new_tokens, "max_new_tokens")
    from ..decoding import SpecStats, speculative_generate

    rows = []
    for k in ks:
        agg = {v: SpecStats(k=k) for v in ("token", "block")}
        units = {v: [] for v in agg}  # (accepted, iterations) of each decode
        for r in range(runs):
            for i, prompt in enumerate(prompts):
                for v in agg:
                    g = torch.Generator().manual_seed(1000 * r + i)
                    _, st = speculative_generate(
                        target, draft, prompt, max_new_tokens, k=k, generator=g, verify=v
                    )
                    agg[v].add(st)
                    units[v].append((st.accepted, st.iterations))
        tok, blk = agg["token"].mean_accepted, agg["block"].mean_accepted
        rows.append(
            {
                "k": k,
                "token_accepted": tok,
                "block_accepted": blk,
                "token_tokens_per_call": agg["token"].tokens_per_target_call,
                "block_tokens_per_call": agg["block"].tokens_per_target_call,
                "gain": blk / tok,
                "diff": blk - tok,
                "diff_se": _paired_ratio_se(units["block"], units["token"]),
            }
        )
    return {
        "runs": runs,
        "prompts": len(prompts),
        "units": runs * len(prompts),
        "max_new_tokens": max_new_tokens,
        "rows": rows,
    }


def _paired_ratio_se(a: list, b: list) -> float:
    """Standard error of sum(a.num)/sum(a.den) - sum(b.num)/sum(b.den) over paired units.

    ``a``, ``b``: one (numerator, denominator) per unit, unit i of ``a`` paired with unit i of
    ``b``. The linearised (delta-method) residual of a ratio estimator R = sum x / sum n at a
    unit is (x - R n) / mean(n); the difference's residual is a's minus b's, and its standard
    error is sqrt(sum e^2 / (m (m - 1))) over the m units. 0.0 for fewer than 2 units."""
    m = len(a)
    if m < 2:
        return 0.0

    def residuals(u):
        num, den = sum(x for x, _ in u), sum(n for _, n in u)
        r, mean_n = num / max(den, 1), max(den, 1) / m
        return [(x - r * n) / mean_n for x, n in u]

    e = [ea - eb for ea, eb in zip(residuals(a), residuals(b))]
    return (sum(v * v for v in e) / (m * (m - 1))) ** 0.5


def save_beyond_results(record: dict, command: str, out: str | Path | None = None) -> Path:
    """Write ``record`` (the three measurements) with the command, machine and date as
    ``beyond_cpu.json`` in ``out`` (default ``data/results/``). Returns the path."""
    return save_record(RESULTS_FILE, command, record, out)


def load_beyond_results(directory: str | Path | None = None) -> dict:
    """The stored ``bench beyond`` record (``data/results/beyond_cpu.json``).

    Raises FileNotFoundError (with the command that makes it) when it is missing."""
    return load_record(RESULTS_FILE, "specdec-course bench beyond", directory)
