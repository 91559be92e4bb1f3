"""The CPU speedup benchmark (``specdec-course bench speedup``): measured ratios in one run.

Plain decoding and speculative decoding (and Medusa) decode the same fixed validation prompts
in alternation, batch 1, one thread, so that machine load hits every method alike; each
speedup is a ratio of medians measured in the same run, printed beside what Theorem 3.8
predicts from the measured acceptance rate and draft cost, and beside the cost-aware ceiling
that prices the (k + 1)-token target call at its measured cost.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import torch

from ..paths import results_dir

__all__ = [
    "SPEEDUP_KS",
    "FORWARD_SIZES",
    "time_forward",
    "forward_costs",
    "validation_prompts",
    "measure_speedup",
    "measure_medusa",
    "format_speedup_table",
    "format_medusa_table",
    "save_speedup_results",
]


def save_speedup_results(
    forward_costs: dict, results: list[dict], command: str, out: str | Path | None = None
) -> Path:
    """Write the ``bench speedup`` record (costs, tables, machine, date) as JSON.

    The file is ``speedup_cpu.json`` in ``out`` (default ``data/results/``), which lesson 04
    reads. Returns its path.
    """
    import platform

    out_dir = Path(out) if out else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "speedup_cpu.json"
    payload = {
        "command": command,
        "machine": f"{platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} thread, torch {torch.__version__}",
        "date": _dt.date.today().isoformat(),
        "forward_costs": forward_costs,
        "results": results,
    }
    path.write_text(json.dumps(payload, indent=1))
    return path


SPEEDUP_KS = tuple(range(1, 9))
FORWARD_SIZES = (1, 2, 4, 8, 16)  # the sizes `bench speedup` prints


def _forward_timer(model, n_new: int, context: int):
    """A function that runs one cached forward over ``n_new`` tokens and returns seconds."""
    import time

    ids = torch.randint(
        model.config.vocab_size, (1, context + n_new), generator=torch.Generator().manual_seed(0)
    )
    cache = model.new_cache(1)
    with torch.inference_mode():
        model(ids[:, :context], cache)
    new = ids[:, context:]

    @torch.inference_mode()
    def once() -> float:
        cache.crop(context)
        t0 = time.perf_counter()
        model.decode_hidden(new, cache)
        return time.perf_counter() - t0

    return once


def time_forward(model, n_new: int, *, context: int = 64, repeats: int = 200) -> float:
    """Median seconds of one cached forward over ``n_new`` new tokens after ``context`` ones."""
    import statistics

    once = _forward_timer(model, n_new, context)
    for _ in range(10):  # warm up allocator and caches
        once()
    return statistics.median(once() for _ in range(repeats))


def forward_costs(target, draft, sizes=FORWARD_SIZES, repeats: int = 200) -> dict:
    """Cost of one cached forward over 1, 2, 4, ... new tokens, for both models.

    The sizes and models are timed round-robin (one call each per round, ``repeats``
    rounds) and the median per size is kept, so a slow moment of the machine hits all of
    them alike. Returns ``{"sizes", "target_s", "draft_s", "target_rel", "c"}``: seconds
    per call, the target's cost relative to one token (1.0 = extra tokens are free: the
    memory-bound premise), and ``c`` = draft call / target call for one token.
    """
    import statistics

    sizes = list(sizes)
    timers = [(_forward_timer(target, n, 64), _forward_timer(draft, n, 64)) for n in sizes]
    runs = [([], []) for _ in sizes]
    for r in range(repeats + 10):
        for (tt, dt), (ts, ds) in zip(timers, runs):
            a, b = tt(), dt()
            if r >= 10:  # the first rounds warm up allocator and caches
                ts.append(a)
                ds.append(b)
    t = [statistics.median(ts) for ts, _ in runs]
    d = [statistics.median(ds) for _, ds in runs]
    return {
        "sizes": sizes,
        "target_s": t,
        "draft_s": d,
        "target_rel": [x / t[0] for x in t],
        "c": d[0] / t[0],
    }


def validation_prompts(tokenizer, n: int = 4, length: int = 32) -> list[torch.Tensor]:
    """``n`` fixed ``length``-character prompts, evenly spaced through the validation split."""
    from ..data import load_corpus, train_val_split

    _, val = train_val_split(tokenizer.encode(load_corpus()))
    step = (val.numel() - length) // n
    return [val[i * step : i * step + length].clone() for i in range(n)]


def measure_speedup(
    target,
    draft,
    prompts,
    *,
    max_new_tokens: int = 200,
    ks=SPEEDUP_KS,
    temperature: float = 1.0,
    repeats: int = 3,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """Plain target decoding against speculative decoding for each k, in one run.

    Every repeat decodes every prompt once with ``generate`` and once per ``k`` with
    ``speculative_generate`` (interleaved, so that a slow moment of the machine hits all of
    them alike); times are summed over prompts and the median over repeats is reported.
    For each k: acceptance rate alpha (accepted / verified drafts), mean accepted drafts per
    iteration, tokens per target call, the measured cost ratio c, the speedup Theorem 3.8
    predicts from those alpha and c, the measured speedup and measured / predicted.

    ``c`` is measured in the same run, as the loops spend it: seconds per draft step inside
    ``speculative_generate`` (one draft call and the sampling of its token) over seconds per
    token of ``generate`` (one target call and the sampling of its token). The forward-only
    ratio of ``forward_costs`` is reported beside it as ``c_forward``.
    """
    import statistics
    import time

    from .. import theory
    from ..decoding import SpecStats, generate, speculative_generate

    ks = list(ks)
    base_t = []
    spec_t = {k: [] for k in ks}
    agg = {k: SpecStats(k=k) for k in ks}
    base_tokens = 0
    gen = torch.Generator().manual_seed(seed)
    bar = range(repeats)
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(bar, desc=f"speedup T={temperature}")
    for _ in bar:
        tb = 0.0
        ts = dict.fromkeys(ks, 0.0)
        for prompt in prompts:
            t0 = time.perf_counter()
            generate(target, prompt, max_new_tokens, temperature=temperature, generator=gen)
            tb += time.perf_counter() - t0
            base_tokens += max_new_tokens
            for k in ks:
                t0 = time.perf_counter()
                _, st = speculative_generate(
                    target,
                    draft,
                    prompt,
                    max_new_tokens,
                    k=k,
                    temperature=temperature,
                    generator=gen,
                    timings=True,
                )
                ts[k] += time.perf_counter() - t0
                agg[k].add(st)
        base_t.append(tb)
        for k in ks:
            spec_t[k].append(ts[k])
    fc = forward_costs(target, draft, sizes=range(1, max(ks) + 2), repeats=100)
    c_forward = fc["c"]
    t_fwd, d_fwd = fc["target_s"], fc["draft_s"]
    base = statistics.median(base_t)
    per_token = sum(base_t) / base_tokens  # seconds per token of plain decoding
    draft_s = sum(agg[k].seconds["draft"] for k in ks)
    draft_calls = sum(agg[k].draft_calls for k in ks)
    c = (draft_s / max(1, draft_calls)) / per_token
    rows = []
    for k in ks:
        a = agg[k]
        alpha = a.acceptance_rate
        measured = base / statistics.median(spec_t[k])
        predicted = theory.speedup(min(alpha, 1.0), k, c)
        tokens = theory.expected_tokens(min(alpha, 1.0), k)
        rows.append(
            {
                # What the forwards alone allow: Theorem 3.8's count of tokens, but the target
                # call priced at its measured cost over k + 1 tokens and nothing else in the loop.
                "forward_ceiling": tokens * t_fwd[0] / (k * d_fwd[0] + t_fwd[k]),
                "k": k,
                "alpha": alpha,
                "mean_accepted": a.mean_accepted,
                "tokens_per_target_call": a.tokens_per_target_call,
                "c": c,
                "predicted_speedup": predicted,
                "measured_speedup": measured,
                "measured_over_predicted": measured / predicted,
                "seconds": statistics.median(spec_t[k]),
            }
        )
    return {
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "prompts": len(prompts),
        "repeats": repeats,
        "baseline_seconds": base,
        "c": c,
        "c_forward": c_forward,
        "rows": rows,
    }


def format_speedup_table(result: dict) -> str:
    lines = [
        f"temperature {result['temperature']}: plain decoding {result['baseline_seconds']:.3f}s "
        f"for {result['prompts']} x {result['max_new_tokens']} characters, "
        f"c = {result['c']:.3f} (forward only: {result['c_forward']:.3f})",
        " k | alpha | mean acc | tok/call | predicted | measured | meas/pred | forward ceiling",
        "---+-------+----------+----------+-----------+----------+-----------+----------------",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['k']:2d} | {r['alpha']:.3f} | {r['mean_accepted']:8.3f} | "
            f"{r['tokens_per_target_call']:8.3f} | {r['predicted_speedup']:8.3f}x | "
            f"{r['measured_speedup']:7.3f}x | {r['measured_over_predicted']:9.3f} | "
            f"{r['forward_ceiling']:14.3f}x"
        )
    return "\n".join(lines)


def measure_medusa(
    target,
    prompts,
    *,
    max_new_tokens: int = 200,
    temperature: float = 1.0,
    repeats: int = 3,
    trees=None,
) -> list[dict]:
    """Medusa (shipped heads) against plain decoding for each tree shape, in one run.

    Each tree is timed by ``medusa.run_medusa``, which alternates plain decoding and Medusa
    on every prompt, so each speedup is a ratio of times measured side by side.
    """
    from .. import medusa

    heads = medusa.load_heads(target=target)
    rows = []
    for name, tree in (trees or medusa.TREES).items():
        r = medusa.run_medusa(
            target,
            heads,
            prompts,
            max_new_tokens,
            tree=tree,
            temperature=temperature,
            repeats=repeats,
        )
        rows.append(
            {
                "tree": name,
                "nodes": r["tree_size"],
                "mean_accepted_length": r["mean_accepted_length"],
                "tokens_per_target_call": r["tokens_per_target_call"],
                "measured_speedup": r["speedup"],
            }
        )
    return rows


def format_medusa_table(result: dict) -> str:
    lines = [
        f"Medusa, temperature {result['temperature']}:",
        " tree  | nodes | accepted length | tok/call | measured speedup",
        "-------+-------+-----------------+----------+-----------------",
    ]
    for r in result["medusa"]:
        lines.append(
            f" {r['tree']:5s} | {r['nodes']:5d} | {r['mean_accepted_length']:15.3f} | "
            f"{r['tokens_per_target_call']:8.3f} | {r['measured_speedup']:15.3f}x"
        )
    return "\n".join(lines)
