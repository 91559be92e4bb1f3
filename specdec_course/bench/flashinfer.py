"""FlashInfer's fused verifier beside ours, where it is installed: ``chain_speculative_sampling``.

FlashInfer (flashinfer-ai/flashinfer) ships a one-launch CUDA kernel for the same rule
(Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling").
It draws its own random numbers and computes other outputs (the accepted count of every
position taken alone), so its tokens are not compared with ours; it is timed on the same
inputs with the same timer, as a production point of reference.

It is optional: the course installs without it, and its kernels may compile on first use
(minutes). So the timing runs in a child process with a time limit (``time_flashinfer``),
and a missing package, a failed compile or an overrun becomes a reason in the results, not
a failure of the GPU check. Its signature changed across versions (older ones took the
uniforms as an argument); ``_call`` adapts to what it finds.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["flashinfer_version", "time_flashinfer"]


def flashinfer_version() -> str | None:
    """The installed FlashInfer's version, or None when it is not importable."""
    try:
        import flashinfer
    except Exception:  # not installed, or installed for another torch / CUDA
        return None
    return getattr(flashinfer, "__version__", "unknown")


def _call(fn, ins):
    """A function that runs ``fn`` (``chain_speculative_sampling``) on verifier inputs."""
    import torch

    q = ins.draft_probs.float()
    p = ins.target_probs.float()
    ids = ins.draft_token_ids.clamp_min(0).to(torch.int32)
    B, K = ids.shape
    params = inspect.signature(fn).parameters
    if "uniform_samples" in params:  # FlashInfer before 0.2.3 took the uniforms
        u = torch.rand(B, K + 1, device=p.device)
        return lambda: fn(q, ids, u, p)
    return lambda: fn(q, ids, p)


def _child(cases_file: str, out_file: str, seed: int) -> None:
    """Child-process side: time FlashInfer on each ``[B, K, V]`` case, write JSON times."""
    from flashinfer.sampling import chain_speculative_sampling
    from triton.testing import do_bench

    from .verifier_sweep import _make_inputs

    times = {}
    for B, K, V in json.loads(Path(cases_file).read_text()):
        run = _call(chain_speculative_sampling, _make_inputs(B, K, V, "cuda", seed))
        run()  # the first call may compile; do_bench's warm-up would count it otherwise
        times[f"{B},{K},{V}"] = do_bench(run, warmup=25, rep=100, return_mode="median") * 1e3
        Path(out_file).write_text(json.dumps(times))  # partial results survive a time-out


def time_flashinfer(cases, *, seed: int = 0, timeout: float = 240.0) -> tuple[dict, str]:
    """Microseconds of ``chain_speculative_sampling`` per ``(B, K, V)`` in ``cases``.

    Inputs are those of ``run_verifier_sweep`` (same seed, same construction), on CUDA.
    Returns ``(times, note)``: ``times`` maps ``(B, K, V)`` to microseconds for the cases
    measured, ``note`` says what ran or why nothing did (not installed, failed, timed out:
    the cases finished before a time-out are kept). Never raises for FlashInfer's sake.
    """
    version = flashinfer_version()
    if version is None:
        return {}, "FlashInfer is not installed (pip install flashinfer-python)"
    with tempfile.TemporaryDirectory() as tmp:
        cases_file, out_file = Path(tmp) / "cases.json", Path(tmp) / "times.json"
        cases_file.write_text(json.dumps([list(c) for c in cases]))
        code = (
            "from specdec_course.bench.flashinfer import _child; "
            f"_child({str(cases_file)!r}, {str(out_file)!r}, {int(seed)})"
        )
        try:
            proc = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=dict(os.environ),
            )
            note = f"FlashInfer {version}: chain_speculative_sampling, do_bench median"
            if proc.returncode != 0:
                note = f"FlashInfer {version} failed: {proc.stderr.strip()[-600:]}"
        except subprocess.TimeoutExpired:
            note = f"FlashInfer {version}: stopped after {timeout:.0f} s (kernel compilation?)"
        raw = json.loads(out_file.read_text()) if out_file.is_file() else {}
    times = {tuple(int(x) for x in key.split(",")): us for key, us in raw.items()}
    return times, note
