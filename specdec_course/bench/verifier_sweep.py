"""The verifier benchmark (``specdec-course bench verifier``) and its byte model.

It times the Triton verifier (``kernels.rejection_sample_triton``'s kernels)
against the PyTorch reference (``verifier.rejection_sample_prepared``) on a CUDA GPU with
``triton.testing.do_bench`` over B in {1, 8, 32, 64, 128}, K in {1, 4, 8} and V in {65,
32000, 128256} (the course's characters, Llama 2's and Llama 3's vocabularies), and reports
the bandwidth each achieves against the GPU's peak memory bandwidth. FlashInfer's
``chain_speculative_sampling``, where it is installed, is timed on the same inputs by
``bench.flashinfer`` (``bench gpu`` merges its times into the cases).

Byte model (what a verifier must read, whatever its implementation). The work is memory
bound: a handful of flops per byte. Per row with ``n`` drafts, ``m`` accepted and a vocabulary
of ``V`` (``s`` bytes per probability, 4 for float32):

- verify: the draft id (8 B), its uniform (8 B), ``p_j(x)`` and ``q_j(x)`` (``s`` each) for
  every position it examines, ``min(m + 1, n)`` of them;
- race, at position ``m`` only: the target row ``V * s``, the noise row ``V * 4``, and the
  draft row ``V * s`` when draft ``m`` was rejected (the bonus needs no draft row);
- writes: ``(K + 1) * 8`` bytes of token ids and 8 bytes of ``num_accepted``.

(A race split over ``S`` programs also writes and reads ``16 S`` bytes of winners per row:
a few hundred bytes against a row of ``V`` floats, left out of the model.)

A row therefore moves about ``3 V s`` bytes after a rejection and ``2 V s`` after a full
accept, never ``K V`` : the verifier reads one vocabulary row per batch row, not one per
draft. Achieved bandwidth is these bytes divided by the measured time; the same bytes are
used for the PyTorch reference (its "effective" bandwidth: it moves more, in intermediates).

Without CUDA the command says so and runs a small correctness sweep under the Triton
interpreter instead (no timing: the interpreter's speed says nothing about a GPU's).
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .records import newest_record, record_stem, save_figure

__all__ = [
    "VerifierCase",
    "BYTE_MODEL",
    "BATCHES",
    "DRAFTS",
    "VOCABS",
    "QUICK",
    "DRY",
    "verifier_bytes",
    "peak_bandwidth_gbps",
    "run_verifier_sweep",
    "interpreter_sweep",
    "save_verifier_results",
    "load_verifier_results",
    "plot_verifier_results",
    "roofline_floor_us",
]

BATCHES = (1, 8, 32, 64, 128)
DRAFTS = (1, 4, 8)
VOCABS = (65, 32000, 128256)
QUICK = {"batches": (1, 64, 128), "drafts": (4,), "vocabs": (32000, 128256)}
# The dry run of `bench gpu` on a CPU: the same pipeline under the interpreter, tiny sizes.
DRY = {"batches": (1, 3), "drafts": (1, 2), "vocabs": (65, 300)}

BYTE_MODEL = (
    "per row: verify reads id (8 B) + uniform (8 B) + p(x) + q(x) at each examined position; "
    "the race at the stopping position reads the target row (V*s), the Exp(1) noise row (V*4) "
    "and, after a rejection, the draft row (V*s); writes (K+1)*8 + 8 B"
)

# Peak memory bandwidth (GB/s, vendor figures) for GPUs whose properties do not report their
# memory clock; matched against the device name, first match wins.
_PEAK_GBPS = [
    ("H200", 4800.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),
    ("GH200", 4000.0),
    ("B200", 8000.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),
    ("L40S", 864.0),
    ("L40", 864.0),
    ("L4", 300.0),
    ("A10G", 600.0),
    ("A10", 600.0),
    ("T4", 320.0),
    ("V100", 900.0),
    ("RTX 4090", 1008.0),
    ("RTX 3090", 936.0),
]


@dataclass
class VerifierCase:
    """One measured configuration (times in microseconds, bandwidth in GB/s)."""

    B: int
    K: int
    V: int
    triton_us: float
    torch_us: float
    speedup: float  # torch_us / triton_us, measured in the same run
    bytes: int  # by the byte model
    triton_gbps: float
    torch_gbps: float
    triton_peak_fraction: float | None  # of the GPU's peak memory bandwidth
    mean_accepted: float
    splits: int = 1  # programs per row in the race (kernels.launch_config)
    flashinfer_us: float | None = None  # chain_speculative_sampling, where installed


def verifier_bytes(
    num_accepted: torch.Tensor,
    num_drafts: torch.Tensor,
    K: int,
    V: int,
    prob_bytes: int = 4,
    with_draft_probs: bool = True,
) -> int:
    """Bytes the verifier must move for one batch, by ``BYTE_MODEL``.

    ``num_accepted`` and ``num_drafts`` are ``[B]`` tensors (the result and the row lengths).
    """
    m = num_accepted.long().cpu()
    n = num_drafts.long().cpu()
    rejected = m < n
    examined = torch.minimum(m + 1, n)
    q = prob_bytes if with_draft_probs else 0
    verify = examined * (8 + 8 + prob_bytes + q)
    race = V * prob_bytes + V * 4 + rejected.long() * V * q
    writes = (K + 1) * 8 + 8
    return int((verify + race + writes).sum())


def peak_bandwidth_gbps(device: int | str | torch.device = 0) -> tuple[float | None, str]:
    """The GPU's peak memory bandwidth in GB/s and where the figure came from.

    From the device properties when they report memory clock and bus width (double data rate:
    2 * clock * width / 8); otherwise from a table of vendor figures by device name; else
    ``(None, reason)``.
    """
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", None)
    bus_bits = getattr(props, "memory_bus_width", None)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, "device properties (2 x clock x bus)"
    for key, gbps in _PEAK_GBPS:
        if key.lower() in props.name.lower():
            return gbps, f"vendor figure for {key}"
    return None, f"unknown for {props.name!r}"


def _make_inputs(B: int, K: int, V: int, device: str, seed: int):
    from ..verifier import prepare_inputs

    g = torch.Generator(device=device).manual_seed(seed)
    # A draft that resembles the target (its logits plus noise): some drafts are accepted
    # and rows stop at different places, as they do in a real batch.
    logits = 2 * torch.randn(B, K + 1, V, device=device, generator=g)
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits[:, :K] + torch.randn(B, K, V, device=device, generator=g), -1)
    drafts = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, K)
    return prepare_inputs(drafts, q, p, generator=g)


def run_verifier_sweep(
    batches=BATCHES,
    drafts=DRAFTS,
    vocabs=VOCABS,
    *,
    seed: int = 0,
    progress: bool = True,
    device: str = "cuda",
    timer=None,
    timer_name: str = "stand-in timer",
) -> tuple[list[VerifierCase], dict]:
    """Time Triton against PyTorch; return ``(cases, metadata)``.

    Inputs are checked and their random numbers drawn once, outside the timed region, so
    both sides time exactly the sampling (``kernels.launch`` against
    ``verifier.rejection_sample_prepared``); tokens are compared before timing. ``timer``
    (a function of a callable returning milliseconds, described by ``timer_name``) defaults
    to ``triton.testing.do_bench`` (median); ``device="cpu"`` with a stand-in timer exercises
    the pipeline under the interpreter (tests and the dry run of ``bench gpu`` do this).
    Raises ``ValueError`` when ``device`` is ``"cuda"`` and there is no CUDA device.
    """
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "the verifier benchmark needs a CUDA GPU; without one run "
            "`specdec-course bench verifier` for the interpreter sweep"
        )
    import triton

    from ..kernels import launch, launch_config
    from ..verifier import rejection_sample_prepared

    timer_doc = timer_name
    if timer is None:
        from triton.testing import do_bench

        timer_doc = "triton.testing.do_bench: median over 100 ms of repeats, 25 ms warm-up"

        def timer(fn):
            return do_bench(fn, warmup=25, rep=100, return_mode="median")

    on_gpu = device == "cuda"
    peak, peak_source = peak_bandwidth_gbps() if on_gpu else (None, "not a GPU")
    cases = []
    for V in vocabs:
        for K in drafts:
            for B in batches:
                ins = _make_inputs(B, K, V, device, seed)
                br, bv, S = launch_config(B, V, ins.target_probs.device)
                ref = rejection_sample_prepared(ins)
                got = launch(ins, block_rows=br, block_vocab=bv, splits=S)
                if not (
                    torch.equal(ref.token_ids, got.token_ids)
                    and torch.equal(ref.num_accepted, got.num_accepted)
                ):
                    raise RuntimeError(f"Triton and PyTorch disagree at B={B}, K={K}, V={V}")
                t_tri = timer(
                    lambda ins=ins, br=br, bv=bv, S=S: launch(
                        ins, block_rows=br, block_vocab=bv, splits=S
                    )
                )
                t_ref = timer(lambda ins=ins: rejection_sample_prepared(ins))
                nbytes = verifier_bytes(
                    ref.num_accepted,
                    (ins.draft_token_ids >= 0).sum(1),
                    K,
                    V,
                    prob_bytes=ins.target_probs.element_size(),
                )
                tri_gbps = nbytes / (t_tri * 1e-3) / 1e9
                case = VerifierCase(
                    B=B,
                    K=K,
                    V=V,
                    triton_us=t_tri * 1e3,
                    torch_us=t_ref * 1e3,
                    speedup=t_ref / t_tri,
                    bytes=nbytes,
                    triton_gbps=tri_gbps,
                    torch_gbps=nbytes / (t_ref * 1e-3) / 1e9,
                    triton_peak_fraction=None if peak is None else tri_gbps / peak,
                    mean_accepted=float(ref.num_accepted.float().mean()),
                    splits=S,
                )
                cases.append(case)
                if progress:
                    frac = "" if peak is None else f" ({case.triton_peak_fraction:.0%} of peak)"
                    print(
                        f"B={B:4d} K={K} V={V:6d}: triton {case.triton_us:8.1f} us, "
                        f"torch {case.torch_us:8.1f} us, x{case.speedup:5.2f}, "
                        f"{case.triton_gbps:7.1f} GB/s{frac}",
                        flush=True,
                    )
                del ins, ref, got
    meta = {
        "gpu": torch.cuda.get_device_name() if on_gpu else device,
        "date": _dt.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "peak_gbps": peak,
        "peak_source": peak_source,
        "byte_model": BYTE_MODEL,
        "timer": timer_doc,
        "inputs": "float32 targets softmax(2 randn), drafts sampled from draft probabilities "
        "softmax(target logits + randn); random numbers drawn before timing",
    }
    return cases, meta


def save_verifier_results(
    cases: list[VerifierCase], meta: dict, out_dir: str | Path | None = None
) -> dict[str, Path]:
    """Write ``verifier-<gpu>-<date>.{json,csv,png}`` to ``out_dir`` (default data/results)."""
    stem = record_stem("verifier", meta["gpu"], out_dir, meta["date"])
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": stem.with_suffix(".json"),
        "csv": stem.with_suffix(".csv"),
        "png": stem.with_suffix(".png"),
    }
    rows = [asdict(c) for c in cases]
    paths["json"].write_text(json.dumps({"meta": meta, "cases": rows}, indent=1) + "\n")
    with paths["csv"].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    save_figure(
        lambda: plot_verifier_results(cases, meta), paths["png"], dpi=120, bbox_inches="tight"
    )
    return paths


def load_verifier_results(directory: str | Path | None = None):
    """The newest stored ``verifier-*.json`` as ``(cases, meta)``, or ``None`` if none."""
    path = newest_record("verifier", directory)
    if path is None:
        return None
    data = json.loads(path.read_text())
    return [VerifierCase(**c) for c in data["cases"]], data["meta"]


def roofline_floor_us(nbytes: int, gbps: float) -> float:
    """The shortest possible time (us) to move ``nbytes`` at ``gbps``: the memory roofline."""
    return nbytes / (gbps * 1e9) * 1e6


def plot_verifier_results(cases: list[VerifierCase], meta: dict):
    """Two panels: achieved bandwidth against bytes moved (with the peak as the roofline),
    and Triton's speedup over PyTorch per configuration. Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for V, marker in zip(sorted({c.V for c in cases}), "os^v"):
        sel = [c for c in cases if c.V == V]
        fi = [c for c in sel if c.flashinfer_us]
        if fi:
            ax1.scatter(
                [c.bytes for c in fi],
                [c.bytes / (c.flashinfer_us * 1e-6) / 1e9 for c in fi],
                marker=marker,
                color="C2",
                label=f"FlashInfer, V={V}",
            )
        ax1.scatter(
            [c.bytes for c in sel],
            [c.triton_gbps for c in sel],
            marker=marker,
            color="C0",
            label=f"Triton, V={V}",
        )
        ax1.scatter(
            [c.bytes for c in sel],
            [c.torch_gbps for c in sel],
            marker=marker,
            color="C1",
            label=f"PyTorch, V={V}",
        )
    if meta.get("peak_gbps"):
        ax1.axhline(
            meta["peak_gbps"], color="k", ls="--", lw=1, label=f"peak {meta['peak_gbps']:.0f} GB/s"
        )
    ax1.set(
        xscale="log",
        yscale="log",
        xlabel="bytes moved (byte model)",
        ylabel="achieved bandwidth (GB/s)",
        title=f"Verifier on {meta['gpu']}",
    )
    ax1.legend(fontsize=7)
    labels = [
        f"B{c.B} K{c.K}\nV{c.V // 1000}k" if c.V >= 1000 else f"B{c.B} K{c.K}\nV{c.V}"
        for c in cases
    ]
    ax2.bar(range(len(cases)), [c.speedup for c in cases], color="C0", label="over PyTorch")
    if any(c.flashinfer_us for c in cases):
        ax2.scatter(
            range(len(cases)),
            [c.flashinfer_us / c.triton_us if c.flashinfer_us else float("nan") for c in cases],
            color="C2",
            marker="_",
            s=80,
            label="over FlashInfer",
        )
        ax2.legend(fontsize=7)
    ax2.axhline(1.0, color="k", lw=1)
    ax2.set_xticks(range(len(cases)), labels, fontsize=6, rotation=90)
    ax2.set(ylabel="their time / Triton time", yscale="log", title="Speedup of the Triton verifier")
    fig.tight_layout()
    return fig


def interpreter_sweep(seed: int = 0) -> list[dict]:
    """Kernel vs reference under the Triton interpreter on small shapes: identical tokens?

    For machines without CUDA; no timing. Returns one dict per case with ``identical``.
    """
    from ..kernels import rejection_sample_triton
    from ..verifier import rejection_sample

    rows = []
    for B, K, V in [(4, 1, 16), (8, 4, 65), (8, 8, 1000), (4, 3, 8193)]:
        g = torch.Generator().manual_seed(seed)
        logits = 2 * torch.randn(B, K + 1, V, generator=g)
        p = torch.softmax(logits, -1)
        q = torch.softmax(logits[:, :K] + torch.randn(B, K, V, generator=g), -1)
        drafts = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, K)
        drafts[0, K // 2 :] = -1  # one ragged row
        for mode, qq in (("draft probs", q), ("one-hot", None)):
            ref = rejection_sample(drafts, qq, p, generator=torch.Generator().manual_seed(seed))
            got = rejection_sample_triton(
                drafts, qq, p, generator=torch.Generator().manual_seed(seed)
            )
            same = torch.equal(ref.token_ids, got.token_ids) and torch.equal(
                ref.num_accepted, got.num_accepted
            )
            rows.append(
                {
                    "B": B,
                    "K": K,
                    "V": V,
                    "drafts": mode,
                    "identical": same,
                    "accepted": ref.num_accepted.tolist(),
                }
            )
    return rows
