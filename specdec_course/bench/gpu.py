"""The GPU check (``specdec-course bench gpu``, run by ``tools/gpu_check.sh``): one command
that measures what the course claims for a GPU and stores it for machines without one.

It runs, in order and in one process:

1. the verifier sweep (``bench.verifier_sweep``: B in {1, 8, 32, 64, 128}, K in {1, 4, 8}, V in
   {65, 32000, 128256}, ``triton.testing.do_bench``, the byte model and the fraction of the
   GPU's peak bandwidth) against the PyTorch reference, with FlashInfer's
   ``chain_speculative_sampling`` timed beside it where it is installed (``bench.flashinfer``);
2. the speedup benchmark (``bench.speedup``) on the GPU for the draft model, the n-gram
   draft and Medusa, with CUDA graphs for plain decoding and the draft loops;
3. a summary that holds the figures the course quotes against its goals (the verifier at
   B = 64, K = 4, V = 128256 reaching half the peak bandwidth and beating the reference at
   every size; the draft-model pair's speedup at k = 3).

Records go to ``data/results/{verifier,speedup,gpu_check}-<gpu>-<date>.{json,png}``; lessons
04, 05 and 07 show the newest of them. On a GPU the whole check takes a few minutes (the
sweep about one, FlashInfer at most ``flashinfer_timeout`` seconds, the speedups two).

``dry=True`` runs the same pipeline on the CPU: the kernels under the Triton interpreter at
tiny sizes with a wall-clock stand-in for ``do_bench``, a few tokens of decoding, no CUDA
graphs and no FlashInfer, and records named ``*-cpu-dry-<date>`` in a temporary folder, so
that the check's code runs in every CI run (well under a minute) and cannot rot.
"""

from __future__ import annotations

import datetime as _dt
import json
import tempfile
import time
from pathlib import Path

import torch

from .. import devices
from .records import machine_name, record_stem

__all__ = [
    "GOALS",
    "GPU_SPEEDUP",
    "DRY_SPEEDUP",
    "run_gpu_check",
    "format_gpu_check",
    "gpu_speedup_report",
    "load_gpu_check",
]

# What the course promises for a GPU (issue-level acceptance figures), checked by `summary`.
GOALS = {
    "verifier_case": (64, 4, 128256),  # (B, K, V) where the kernel must stream near peak
    "verifier_peak_fraction": 0.5,
    "speedup_k": 3,  # the draft-model pair's speedup is quoted at this k
    "reference_speedup_consumer_gpu": 1.60,  # the seed's figure for such a pair
}
# The speedup benchmark's settings on a GPU (about two minutes with graphs) and in the dry
# run (seconds on a CPU).
GPU_SPEEDUP = {"ks": (1, 2, 3, 4, 6), "repeats": 3, "max_new_tokens": 200, "prompts": 4}
DRY_SPEEDUP = {"ks": (2,), "repeats": 1, "max_new_tokens": 8, "prompts": 1}
_TEMPERATURES = (1.0, 0.0)


def _wall_ms(fn) -> float:
    # The dry run's stand-in for do_bench: one call, timed. Its figures mean nothing; the
    # run only proves that the pipeline around them works.
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _verifier(dry: bool, out: Path, flashinfer_timeout: float, progress: bool):
    from .flashinfer import time_flashinfer
    from .verifier_sweep import (
        BATCHES,
        DRAFTS,
        DRY,
        VOCABS,
        run_verifier_sweep,
        save_verifier_results,
    )

    if dry:
        sweep = DRY
        cases, meta = run_verifier_sweep(
            **sweep,
            device="cpu",
            progress=progress,
            timer=_wall_ms,
            timer_name="one call on the wall clock (dry run: the interpreter, not a GPU)",
        )
        meta["gpu"] = "cpu-dry"
        meta["flashinfer"] = "not timed in the dry run"
    else:
        cases, meta = run_verifier_sweep(BATCHES, DRAFTS, VOCABS, progress=progress)
        times, meta["flashinfer"] = time_flashinfer(
            [(c.B, c.K, c.V) for c in cases], timeout=flashinfer_timeout
        )
        for c in cases:
            c.flashinfer_us = times.get((c.B, c.K, c.V))
        if progress:
            print(meta["flashinfer"], flush=True)
    paths = save_verifier_results(cases, meta, out)
    return cases, meta, paths


def _speedup(dry: bool, dev: torch.device, machine: str, out: Path, progress: bool):
    from ..data import CharTokenizer
    from ..drafts.distilled import load_distilled
    from ..drafts.ngram import NgramDraft
    from ..medusa import load_heads
    from ..model import load_pretrained
    from .forward import forward_costs
    from .speedup import measure_speedup, validation_prompts
    from .speedup_record import save_speedup_results

    cfg = DRY_SPEEDUP if dry else GPU_SPEEDUP
    target = load_pretrained("target", device=dev)
    drafts = {
        "draft": load_pretrained("draft", device=dev),
        "ngram": NgramDraft(device=dev),
        "distilled": load_distilled(device=dev),
    }
    heads = load_heads(target=target)
    prompts = validation_prompts(CharTokenizer(target.vocab), n=cfg["prompts"])
    sizes = (1, 2) if dry else (1, 2, 4, 8, 16)
    costs = forward_costs(target, drafts["draft"], sizes=sizes, repeats=3 if dry else 200)
    results = []
    for temperature in _TEMPERATURES[:1] if dry else _TEMPERATURES:
        res = measure_speedup(
            target,
            drafts,
            prompts,
            ks=cfg["ks"],
            medusa_heads=heads,
            trees=("chain",) if dry else ("chain", "small", "large"),
            temperature=temperature,
            repeats=cfg["repeats"],
            max_new_tokens=cfg["max_new_tokens"],
            progress=progress,
            cuda_graphs=dev.type == "cuda",
        )
        results.append(res)
    command = "specdec-course bench gpu" + (" --dry" if dry else "")
    name = record_stem("speedup", machine, out).name
    paths = save_speedup_results(costs, results, command, out, device=dev, name=name)
    return results, paths


def _summary(cases, meta, speedups, dry: bool) -> dict:
    """The figures the course quotes, beside its goals (None where a goal cannot be judged:
    the dry run, a GPU whose peak bandwidth is unknown, a case not in the sweep)."""
    B, K, V = GOALS["verifier_case"]
    at = next((c for c in cases if (c.B, c.K, c.V) == (B, K, V)), None)
    frac = None if at is None else at.triton_peak_fraction
    slowest = min(cases, key=lambda c: c.speedup)
    sampled = speedups[0]  # temperature 1.0 comes first
    row = next((r for r in sampled["methods"]["draft"] if r["k"] == GOALS["speedup_k"]), None)
    best = {m: max(r["measured_speedup"] for r in rows) for m, rows in sampled["methods"].items()}
    if sampled.get("medusa"):
        best["medusa"] = max(r["measured_speedup"] for r in sampled["medusa"])
    goal = GOALS["verifier_peak_fraction"]
    return {
        "dry": dry,
        "verifier_peak_fraction_at_goal_case": frac,
        "verifier_reaches_goal": None if dry or frac is None else frac >= goal,
        "verifier_slowest_speedup_over_torch": slowest.speedup,
        "verifier_slowest_case": [slowest.B, slowest.K, slowest.V],
        "verifier_beats_torch_everywhere": None if dry else slowest.speedup > 1.0,
        "flashinfer": meta.get("flashinfer"),
        "draft_pair_speedup_at_k": None if row is None else row["measured_speedup"],
        "best_measured_speedup": best,
    }


def run_gpu_check(
    *,
    dry: bool = False,
    out: str | Path | None = None,
    flashinfer_timeout: float = 150.0,
    progress: bool = True,
) -> dict:
    """Run the GPU check (the module docstring says what it measures) and store its records.

    ``dry=False`` needs a CUDA GPU and writes to ``out`` (default ``data/results/``);
    ``dry=True`` runs on the CPU and writes to ``out`` (default: a new temporary folder).
    Returns the summary record (also written as ``gpu_check-<gpu>-<date>.json``) with
    ``"files"``: every path written. Raises ValueError without a GPU when not dry.
    """
    if dry:
        dev = torch.device("cpu")
        out_dir = Path(out) if out else Path(tempfile.mkdtemp(prefix="gpu-check-dry-"))
        machine = "cpu-dry"
    else:
        if not torch.cuda.is_available():
            raise ValueError(
                "the GPU check needs a CUDA GPU and this machine has none; run "
                "`specdec-course bench gpu --dry` to exercise it on the CPU"
            )
        dev = devices.device("cuda")
        out_dir = Path(out) if out else None
        machine = machine_name(dev)
    t0 = time.perf_counter()
    cases, meta, vpaths = _verifier(dry, out_dir, flashinfer_timeout, progress)
    t1 = time.perf_counter()
    speedups, spaths = _speedup(dry, dev, machine, out_dir, progress)
    t2 = time.perf_counter()
    summary = _summary(cases, meta, speedups, dry)
    summary.update(
        machine=machine,
        date=_dt.date.today().isoformat(),
        goals={k: list(v) if isinstance(v, tuple) else v for k, v in GOALS.items()},
        seconds={"verifier": t1 - t0, "speedup": t2 - t1},
    )
    path = record_stem("gpu_check", machine, out_dir).with_suffix(".json")
    files = [str(p) for p in (*vpaths.values(), *spaths, path)]
    summary["files"] = files
    path.write_text(json.dumps(summary, indent=1))
    return summary


def format_gpu_check(summary: dict) -> str:
    """The summary of :func:`run_gpu_check` as lines of text, each goal with its verdict."""

    def verdict(ok) -> str:
        return {True: "met", False: "NOT met", None: "not judged"}[ok]

    goals = summary["goals"]
    B, K, V = goals["verifier_case"]
    frac = summary["verifier_peak_fraction_at_goal_case"]
    slow = summary["verifier_slowest_case"]
    k = summary["goals"]["speedup_k"]
    pair = summary["draft_pair_speedup_at_k"]
    lines = [
        f"GPU check on {summary['machine']} ({summary['date']})"
        + (": dry run on the CPU, figures meaningless" if summary["dry"] else ""),
        f"  verifier at B={B} K={K} V={V}: "
        + ("peak unknown" if frac is None else f"{frac:.0%} of peak bandwidth")
        + f" (goal {summary['goals']['verifier_peak_fraction']:.0%}: "
        f"{verdict(summary['verifier_reaches_goal'])})",
        f"  verifier over PyTorch, slowest case B={slow[0]} K={slow[1]} V={slow[2]}: "
        f"x{summary['verifier_slowest_speedup_over_torch']:.2f} "
        f"(goal > 1 everywhere: {verdict(summary['verifier_beats_torch_everywhere'])})",
        f"  FlashInfer: {summary['flashinfer']}",
        f"  draft-model pair at k={k}, temperature 1: "
        + ("not measured" if pair is None else f"x{pair:.2f}")
        + f" (the seed's consumer-GPU figure: x{goals['reference_speedup_consumer_gpu']:.2f})",
        "  best measured speedup: "
        + ", ".join(f"{m} x{v:.2f}" for m, v in summary["best_measured_speedup"].items()),
        "  seconds: " + ", ".join(f"{k_} {v:.0f}" for k_, v in summary["seconds"].items()),
    ]
    return "\n".join(lines)


NO_GPU_RECORD = (
    "No GPU results are stored yet: this course was built on machines without a GPU. Run "
    "`bash tools/gpu_check.sh` on a CUDA machine and commit data/results/ to see them here."
)


def gpu_speedup_report(methods=("draft", "ngram"), directory: str | Path | None = None) -> str:
    """The newest stored GPU speedup record (``bench gpu``) as text, or ``NO_GPU_RECORD``.

    For each temperature: the record's tables (``format_speedup_table``) and the best
    measured speedup of each of ``methods`` (names of the record's drafts, or "medusa").
    Lessons 04 and 07 print it, so that a CPU machine shows what a GPU measured.
    """
    from .speedup_record import format_speedup_table, load_gpu_speedup_results

    record = load_gpu_speedup_results(directory)
    if record is None:
        return NO_GPU_RECORD
    lines = [f"{record['machine']} | {record['date']} | {record['command']}"]
    for res in record["results"]:
        lines.append(format_speedup_table(res))
        best = []
        for m in methods:
            if m == "medusa":
                rows = [dict(r, k=r["tree"]) for r in res.get("medusa", [])]
            else:
                rows = res["methods"].get(m, [])
            if rows:
                top = max(rows, key=lambda r: r["measured_speedup"])
                best.append(f"{m} x{top['measured_speedup']:.2f} (k = {top['k']})")
        lines.append(f"best at temperature {res['temperature']}: " + ", ".join(best))
    return "\n".join(lines)


def load_gpu_check(directory: str | Path | None = None) -> dict | None:
    """The newest stored ``gpu_check-<gpu>-<date>.json`` summary, or None if none is stored."""
    from .records import newest_record

    path = newest_record("gpu_check", directory)
    return None if path is None else json.loads(path.read_text())
