"""Benchmarks, reported as ratios measured in one run: ``specdec-course bench verifier|speedup``.

``bench verifier`` times the Triton verifier (``kernels.rejection_sample_triton``'s kernels)
against the PyTorch reference (``verifier.rejection_sample_prepared``) on a CUDA GPU with
``triton.testing.do_bench`` over B in {1, 8, 64, 256}, K in {1, 4, 8} and V in {32000, 128256},
and reports the bandwidth each achieves against the GPU's peak memory bandwidth.

Byte model (what a verifier must read, whatever its implementation). The work is memory
bound: a handful of flops per byte. Per row with ``n`` drafts, ``m`` accepted and a vocabulary
of ``V`` (``s`` bytes per probability, 4 for float32):

- verify: the draft id (8 B), its uniform (8 B), ``p_j(x)`` and ``q_j(x)`` (``s`` each) for
  every position it examines, ``min(m + 1, n)`` of them;
- race, at position ``m`` only: the target row ``V * s``, the noise row ``V * 4``, and the
  draft row ``V * s`` when draft ``m`` was rejected (the bonus needs no draft row);
- writes: ``(K + 1) * 8`` bytes of token ids and 8 bytes of ``num_accepted``.

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
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .paths import results_dir

__all__ = [
    "VerifierCase",
    "BYTE_MODEL",
    "verifier_bytes",
    "peak_bandwidth_gbps",
    "run_verifier_sweep",
    "interpreter_sweep",
    "save_verifier_results",
    "load_verifier_results",
    "plot_verifier_results",
    "roofline_floor_us",
    "save_speedup_results",
    "time_forward",
    "forward_costs",
    "validation_prompts",
    "measure_speedup",
    "measure_medusa",
    "format_speedup_table",
    "format_medusa_table",
]

BATCHES = (1, 8, 64, 256)
DRAFTS = (1, 4, 8)
VOCABS = (32000, 128256)
QUICK = {"batches": (1, 64, 256), "drafts": (4,), "vocabs": (32000, 128256)}

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
    from .verifier import prepare_inputs

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
) -> tuple[list[VerifierCase], dict]:
    """Time Triton against PyTorch; return ``(cases, metadata)``.

    Inputs are checked and their random numbers drawn once, outside the timed region, so
    both sides time exactly the sampling (``kernels.launch`` against
    ``verifier.rejection_sample_prepared``); tokens are compared before timing. ``timer``
    (a function of a callable returning milliseconds) defaults to
    ``triton.testing.do_bench`` (median); ``device="cpu"`` with a stand-in timer exercises
    the pipeline under the interpreter (tests do this). Raises ``ValueError`` when
    ``device`` is ``"cuda"`` and there is no CUDA device.
    """
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "the verifier benchmark needs a CUDA GPU; without one run "
            "`specdec-course bench verifier` for the interpreter sweep"
        )
    import triton

    from .kernels import launch, launch_config
    from .verifier import rejection_sample_prepared

    timer_doc = "stand-in timer"
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
                br, bv = launch_config(B, V, ins.target_probs.device)
                ref = rejection_sample_prepared(ins)
                got = launch(ins, block_rows=br, block_vocab=bv)
                if not (
                    torch.equal(ref.token_ids, got.token_ids)
                    and torch.equal(ref.num_accepted, got.num_accepted)
                ):
                    raise RuntimeError(f"Triton and PyTorch disagree at B={B}, K={K}, V={V}")
                t_tri = timer(
                    lambda ins=ins, br=br, bv=bv: launch(ins, block_rows=br, block_vocab=bv)
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
                )
                cases.append(case)
                if progress:
                    print(
                        f"B={B:4d} K={K} V={V:6d}: triton {case.triton_us:8.1f} us, "
                        f"torch {case.torch_us:8.1f} us, x{case.speedup:5.2f}, "
                        f"{case.triton_gbps:7.1f} GB/s",
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


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def save_verifier_results(
    cases: list[VerifierCase], meta: dict, out_dir: str | Path | None = None
) -> dict[str, Path]:
    """Write ``verifier-<gpu>-<date>.{json,csv,png}`` to ``out_dir`` (default data/results)."""
    out = Path(out_dir) if out_dir else results_dir()
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"verifier-{_slug(meta['gpu'])}-{meta['date']}"
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
    fig = plot_verifier_results(cases, meta)
    fig.savefig(paths["png"], dpi=120, bbox_inches="tight")
    return paths


def load_verifier_results(directory: str | Path | None = None):
    """The newest stored ``verifier-*.json`` as ``(cases, meta)``, or ``None`` if none."""
    d = Path(directory) if directory else results_dir()
    files = sorted(d.glob("verifier-*.json"), key=lambda p: (p.stem[-10:], p.name))
    if not files:
        return None
    data = json.loads(files[-1].read_text())
    return [VerifierCase(**c) for c in data["cases"]], data["meta"]


def roofline_floor_us(nbytes: int, gbps: float) -> float:
    """The shortest possible time (us) to move ``nbytes`` at ``gbps``: the memory roofline."""
    return nbytes / (gbps * 1e9) * 1e6


def plot_verifier_results(cases: list[VerifierCase], meta: dict):
    """Two panels: achieved bandwidth against bytes moved (with the peak as the roofline),
    and Triton's speedup over PyTorch per configuration. Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for V, marker in zip(sorted({c.V for c in cases}), "os^"):
        sel = [c for c in cases if c.V == V]
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
    labels = [f"B{c.B} K{c.K}\nV{c.V // 1000}k" for c in cases]
    ax2.bar(range(len(cases)), [c.speedup for c in cases], color="C0")
    ax2.axhline(1.0, color="k", lw=1)
    ax2.set_xticks(range(len(cases)), labels, fontsize=6, rotation=90)
    ax2.set(ylabel="PyTorch time / Triton time", title="Speedup of the Triton verifier")
    fig.tight_layout()
    return fig


def interpreter_sweep(seed: int = 0) -> list[dict]:
    """Kernel vs reference under the Triton interpreter on small shapes: identical tokens?

    For machines without CUDA; no timing. Returns one dict per case with ``identical``.
    """
    from .kernels import rejection_sample_triton
    from .verifier import rejection_sample

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


# ------------------------------------------------------------------------ speculative speedup

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
    from .data import load_corpus, train_val_split

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

    from . import theory
    from .decoding import SpecStats, generate, speculative_generate

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
    from . import medusa

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
