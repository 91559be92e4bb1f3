"""A roofline *model* of a GPU forward call (no measurement); ``bench.roofline_methods`` turns
it into the speedups it predicts per method.

Speculative decoding assumes that a target call over ``k + 1`` new tokens costs about what a
one-token call costs (Leviathan et al. 2023, Theorem 3.8). On a GPU that holds because a
decoding call is bound by the bytes it must read, not by its arithmetic. This module prices
one call of a named model shape on a named GPU by those bytes and flops, at the GPU's
published peaks; lessons 04, 05, 07 and 08 show it where no GPU record is stored
(``bench.gpu_speedup_report``), and ``specdec-course bench roofline`` prints it. Every
function here is named ``modelled_*`` and every heading it prints says "model".

The model, for one call of ``T`` new tokens per sequence, ``B`` sequences, ``L`` tokens
already in each sequence's KV cache (``d`` the width, ``n`` the layers, ``kv`` the width of
the keys (= of the values), ``f`` the FFN width, ``V`` the vocabulary, ``s = 2`` bytes per
bf16 value):

- **weights, once per call**: every layer's projections (``2 d^2 + 2 d kv + 3 d f`` for a
  Llama layer: q, o, k, v, gate, up, down; no biases) and its two RMSNorm vectors, the final
  norm, the LM head (``d V``) and any ``extra_params`` (EAGLE's ``2d -> d`` projection),
  times ``s``. The embedding table is not streamed: a call looks up ``B T`` of its rows;
- **KV cache**: read ``B L`` positions, write ``B T``: ``(L + T) B 2 n kv s`` bytes;
- **activations**: every projection reads its input and writes its output once (elementwise
  ops fused into them), ``9 d + 2 kv + 3 f`` values per layer and token, plus the embedding
  row read and the ``V`` logits written: ``B T (n (9 d + 2 kv + 3 f) + d + V) s`` bytes
  (the extra parameters' activations are left out: a few ``d`` per token);
- **flops**: two per weight of every product per token (the norm vectors excluded), plus
  attention's ``4 (L + T) d`` per layer and token (``Q K^T`` and ``A V`` over the context and
  the whole block, as a tree or a chain is verified);
- **time** ``= max(bytes / bandwidth, flops / peak) + overhead``, the overhead a fixed
  per-call cost (kernel launches) that the caller states, 0 unless given;
- **memory**: every parameter and the KV cache after the call must be resident; a call
  that would not fit in the GPU's memory is priced all the same and marked (``fits``).

The **ridge** is the smallest ``T`` at which the flops take as long as the bytes: below it a
call's time barely grows with ``T``, above it grows in proportion. For Llama-3-8B on an H200
it lies near ``peak / bandwidth`` ~ 206 tokens per call, since every bf16 weight (2 bytes)
does 2 flops per token.

What it leaves out, and why the figures are an optimistic bound: real kernels reach a
fraction of either peak (the verifier benchmark, ``bench.verifier_sweep``, measures one such
fraction), small batches leave multiprocessors idle, and the host, the sampler and the
verifier add time (lesson 05's byte model prices the verifier). A stored GPU record
(``tools/gpu_check.sh``) replaces all of it with measurements.

Published figures (vendor datasheets; tensor-core "with sparsity" figures halved to dense):

- NVIDIA H200 SXM (H200 Tensor Core GPU datasheet, 2024): 141 GB HBM3e at 4.8 TB/s; BF16
  tensor core 1,979 TFLOPS with sparsity, 989 dense.
- NVIDIA H100 SXM (H100 Tensor Core GPU datasheet, 2023): 80 GB HBM3 at 3.35 TB/s; BF16
  tensor core 1,979 TFLOPS with sparsity, 989 dense.
- NVIDIA GeForce RTX 4090 (Ada Lovelace architecture whitepaper, 2022): 24 GB GDDR6X at
  1,008 GB/s; BF16 tensor core with FP32 accumulate 165.2 TFLOPS dense.

Model shapes (the configs published with the weights): Llama-3-8B (Meta, 2024: 32 layers,
d 4096, 32 heads of 128 with 8 KV heads, FFN 14336, vocabulary 128256, untied LM head:
8.03 B parameters) and Llama-3.2-1B (Meta, 2024: 16 layers, d 2048, 32 heads of 64 with 8
KV heads, FFN 8192, the same vocabulary, tied embeddings: 1.24 B parameters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .._validate import check_int

__all__ = [
    "GPUSpec",
    "ModelShape",
    "ModelledCall",
    "GPUS",
    "SHAPES",
    "DEFAULT_CONTEXT",
    "eagle_draft_shape",
    "medusa_heads_shape",
    "scaled_draft_shape",
    "modelled_call",
    "modelled_ratio",
    "modelled_ridge",
    "format_modelled_ratios",
]

# Tokens already in each sequence's KV cache when the priced call runs (a mid-length chat
# turn); every function takes ``context=`` to change it.
DEFAULT_CONTEXT = 1024


def _positive(value, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number; got {value!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{name} must be a positive finite number; got {value!r}")
    return v


@dataclass(frozen=True)
class GPUSpec:
    """A GPU's published peaks: ``bandwidth`` in bytes/s, dense bf16 ``peak_flops`` in flop/s,
    ``source`` of both figures, and its ``memory`` in bytes (0: not checked)."""

    name: str
    bandwidth: float
    peak_flops: float
    source: str
    memory: float = 0.0

    def __post_init__(self):
        _positive(self.bandwidth, "GPUSpec.bandwidth (bytes/s)")
        _positive(self.peak_flops, "GPUSpec.peak_flops (flop/s)")
        if not (self.memory >= 0 and math.isfinite(self.memory)):
            raise ValueError(f"GPUSpec.memory must be a number of bytes >= 0; got {self.memory!r}")


@dataclass(frozen=True)
class ModelShape:
    """A Llama-style decoder's shape: ``n_layer`` layers of width ``d_model``, ``n_head`` query
    heads and ``n_kv_head`` key/value heads of ``d_model // n_head``, a gated FFN of width
    ``d_ff``, a ``vocab``-row embedding and LM head (``tied_embeddings``: one matrix for both),
    ``extra_params`` more weights read by every call (EAGLE's feature projection, Medusa's
    heads) and ``bytes_per_param`` (2: bf16). Raises ValueError for a shape that cannot be."""

    name: str
    n_layer: int
    d_model: int
    n_head: int
    n_kv_head: int
    d_ff: int
    vocab: int
    tied_embeddings: bool = False
    extra_params: int = 0
    bytes_per_param: int = 2

    def __post_init__(self):
        check_int(self.n_layer, "ModelShape.n_layer", minimum=0)
        for field in ("d_model", "n_head", "n_kv_head", "d_ff", "vocab", "bytes_per_param"):
            check_int(getattr(self, field), f"ModelShape.{field}")
        check_int(self.extra_params, "ModelShape.extra_params", minimum=0)
        if self.d_model % self.n_head:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})"
            )
        if self.n_head % self.n_kv_head:
            raise ValueError(
                f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})"
            )

    @property
    def kv_dim(self) -> int:
        """Width of one position's keys (and of its values) in one layer."""
        return self.n_kv_head * (self.d_model // self.n_head)

    @property
    def layer_matmul_params(self) -> int:
        d, kv, f = self.d_model, self.kv_dim, self.d_ff
        return 2 * d * d + 2 * d * kv + 3 * d * f  # q, o; k, v; gate, up, down

    @property
    def matmul_params(self) -> int:
        """Weights that take part in a product per token: layers, LM head, extra."""
        return (
            self.n_layer * self.layer_matmul_params + self.d_model * self.vocab + self.extra_params
        )

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one call streams: the products' weights and the norm vectors."""
        norms = (2 * self.n_layer + 1) * self.d_model
        return (self.matmul_params + norms) * self.bytes_per_param

    @property
    def parameters(self) -> int:
        """Every parameter, the embedding table included (once when tied)."""
        embedding = 0 if self.tied_embeddings else self.d_model * self.vocab
        return self.weight_bytes // self.bytes_per_param + embedding

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one position adds to the KV cache: keys and values in every layer."""
        return 2 * self.n_layer * self.kv_dim * self.bytes_per_param

    @property
    def activation_values_per_token(self) -> int:
        d, kv, f = self.d_model, self.kv_dim, self.d_ff
        return self.n_layer * (9 * d + 2 * kv + 3 * f) + d + self.vocab


GPUS = {
    "h200": GPUSpec(
        "NVIDIA H200 SXM",
        4.8e12,
        989e12,
        "H200 datasheet: HBM3e 4.8 TB/s; BF16 1,979 TFLOPS with sparsity = 989 dense",
        141e9,
    ),
    "h100": GPUSpec(
        "NVIDIA H100 SXM",
        3.35e12,
        989e12,
        "H100 datasheet: HBM3 3.35 TB/s; BF16 1,979 TFLOPS with sparsity = 989 dense",
        80e9,
    ),
    "rtx4090": GPUSpec(
        "NVIDIA GeForce RTX 4090",
        1.008e12,
        165.2e12,
        "Ada Lovelace whitepaper: GDDR6X 1,008 GB/s; BF16 (FP32 accumulate) 165.2 TFLOPS dense",
        24e9,
    ),
}

SHAPES = {
    "llama-3-8b": ModelShape("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256),
    "llama-3.2-1b": ModelShape("Llama-3.2-1B", 16, 2048, 32, 8, 8192, 128256, tied_embeddings=True),
}


def eagle_draft_shape(target: ModelShape) -> ModelShape:
    """EAGLE's draft for ``target`` (Li et al. 2024): one decoder layer of the target's shape
    over ``fc(concat(feature, embedding))``, the ``2d -> d`` projection with its bias as extra
    weights, and the target's own LM head, read again by every draft step. It owns no
    embedding table (it looks up the target's), so ``tied_embeddings``; its ``parameters``
    still count the shared LM head: an upper bound on the memory it adds."""
    d = target.d_model
    return replace(
        target,
        name=f"EAGLE draft of {target.name}",
        n_layer=1,
        tied_embeddings=True,
        extra_params=2 * d * d + d,
    )


def medusa_heads_shape(target: ModelShape, n_heads: int) -> ModelShape:
    """``n_heads`` Medusa-1 heads on ``target`` (Cai et al. 2024), as this course builds them
    (``medusa.MedusaHeads``): each a residual block (``d x d`` and a bias) and an LM head of its
    own (``d x V``). No layers: the heads read the target's last hidden state once per call."""
    check_int(n_heads, "n_heads")
    d, V = target.d_model, target.vocab
    extra = n_heads * (d * d + d) + (n_heads - 1) * d * V  # one LM head is the shape's own
    name = f"{n_heads} Medusa heads on {target.name}"  # no embedding table of their own
    return replace(target, name=name, n_layer=0, tied_embeddings=True, extra_params=extra)


def scaled_draft_shape(target: ModelShape, fraction: float, name: str) -> ModelShape:
    """A draft known only by its cost relative to its own target: each drafted token streams
    ``fraction`` of the weights a step of ``target`` multiplies (``matmul_params``), and it keeps
    no KV cache. That is how the model prices a draft that is not a decoder, such as the
    course's recurrent draft, whose fraction is measured on the course's own pair. The LM
    head is the least it reads. Raises ValueError for a fraction that is not positive."""
    fraction = _positive(fraction, "fraction")
    extra = max(0, round(fraction * target.matmul_params) - target.d_model * target.vocab)
    return replace(target, name=name, n_layer=0, tied_embeddings=True, extra_params=extra)


def _gpu(gpu: GPUSpec | str) -> GPUSpec:
    if isinstance(gpu, GPUSpec):
        return gpu
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; use one of {sorted(GPUS)} or a GPUSpec")
    return GPUS[gpu]


def _shape(shape: ModelShape | str) -> ModelShape:
    if isinstance(shape, ModelShape):
        return shape
    if shape not in SHAPES:
        raise ValueError(
            f"unknown model shape {shape!r}; use one of {sorted(SHAPES)} or a ModelShape"
        )
    return SHAPES[shape]


def _overhead(overhead_s) -> float:
    try:
        v = float(overhead_s)
    except (TypeError, ValueError):
        raise ValueError(
            f"overhead_s must be a number of seconds >= 0; got {overhead_s!r}"
        ) from None
    if not (v >= 0 and math.isfinite(v)):
        raise ValueError(f"overhead_s must be a finite number of seconds >= 0; got {overhead_s!r}")
    return v


@dataclass(frozen=True)
class ModelledCall:
    """One call as the roofline model prices it (a model, not a measurement)."""

    tokens: int  # new tokens per sequence
    batch: int
    context: int
    bytes: int
    flops: int
    memory_s: float  # bytes / bandwidth
    compute_s: float  # flops / peak
    overhead_s: float
    resident_bytes: int  # all weights (the embedding table too) and the KV cache after the call
    fits: bool  # resident_bytes within the GPU's memory (True when its memory is not given)

    @property
    def time_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.overhead_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def modelled_call(
    shape: ModelShape | str,
    gpu: GPUSpec | str,
    tokens: int,
    batch: int = 1,
    context: int = DEFAULT_CONTEXT,
    overhead_s: float = 0.0,
) -> ModelledCall:
    """The roofline model's price of one call of ``shape`` on ``gpu`` (a model, no timing).

    ``tokens`` new tokens for each of ``batch`` sequences with ``context`` tokens already
    cached, plus a fixed ``overhead_s`` per call. Bytes, flops and time as in the module
    docstring. ``shape`` and ``gpu`` are objects or keys of ``SHAPES`` / ``GPUS``. Raises
    ValueError for an unknown name, ``tokens`` or ``batch`` below 1, a negative ``context`` or
    a negative or infinite ``overhead_s``.
    """
    shape, gpu = _shape(shape), _gpu(gpu)
    T, B = check_int(tokens, "tokens"), check_int(batch, "batch")
    L = check_int(context, "context", minimum=0)
    overhead = _overhead(overhead_s)
    s = shape.bytes_per_param
    nbytes = (
        shape.weight_bytes
        + B * (L + T) * shape.kv_bytes_per_token
        + B * T * shape.activation_values_per_token * s
    )
    attention = 4 * shape.n_layer * shape.d_model * (L + T)
    flops = B * T * (2 * shape.matmul_params + attention)
    resident = shape.parameters * s + B * (L + T) * shape.kv_bytes_per_token
    return ModelledCall(
        T,
        B,
        L,
        nbytes,
        flops,
        nbytes / gpu.bandwidth,
        flops / gpu.peak_flops,
        overhead,
        resident,
        not gpu.memory or resident <= gpu.memory,
    )


def modelled_ratio(
    shape: ModelShape | str,
    gpu: GPUSpec | str,
    tokens: int,
    batch: int = 1,
    context: int = DEFAULT_CONTEXT,
    overhead_s: float = 0.0,
) -> float:
    """The model's ``time(tokens) / time(1)`` for one call at ``batch``: what Theorem 3.8 takes
    to be 1. Same arguments and errors as ``modelled_call``."""
    one = modelled_call(shape, gpu, 1, batch, context, overhead_s)
    return modelled_call(shape, gpu, tokens, batch, context, overhead_s).time_s / one.time_s


def modelled_ridge(
    shape: ModelShape | str,
    gpu: GPUSpec | str,
    batch: int = 1,
    context: int = DEFAULT_CONTEXT,
    max_tokens: int = 1 << 24,
) -> int | None:
    """The smallest ``tokens`` per sequence at which the model's call is compute bound (its
    flops take at least as long as its bytes), or None if none up to ``max_tokens``.

    Tokens per call are ``batch`` times this. Found by bisection: compute minus memory time
    is a convex quadratic in ``tokens`` (attention's flops grow with ``L + T``), so once it
    is negative at 1 it crosses zero at most once above 1. Raises ValueError as
    ``modelled_call`` does.
    """
    check_int(max_tokens, "max_tokens")

    def compute_bound(t: int) -> bool:
        c = modelled_call(shape, gpu, t, batch, context)
        return c.compute_s >= c.memory_s

    if compute_bound(1):
        return 1
    if not compute_bound(max_tokens):
        return None
    lo, hi = 1, max_tokens  # memory bound at lo, compute bound at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi


def format_modelled_ratios(
    shape: ModelShape | str = "llama-3-8b",
    gpu: GPUSpec | str = "h200",
    batches=(1, 16, 64),
    tokens=(1, 2, 4, 8, 16, 64, 256),
    context: int = DEFAULT_CONTEXT,
    overhead_s: float = 0.0,
) -> str:
    """A text table of the model's ``time(n) / time(1)`` (``n`` new tokens per sequence) per
    batch size, the one-token call's time, and the ridge, under a heading that says it is a
    model. A ratio marked ``*`` is for a call whose weights and KV cache would not fit in the
    GPU's memory."""
    shape, gpu = _shape(shape), _gpu(gpu)
    lines = [
        f"ROOFLINE MODEL (not a measurement): {shape.name}, bf16, on {gpu.name} "
        f"({gpu.bandwidth / 1e12:.2f} TB/s, {gpu.peak_flops / 1e12:.0f} TFLOP/s dense bf16, "
        f"{gpu.memory / 1e9:.0f} GB), {context} tokens cached, {overhead_s * 1e6:.0f} us "
        "overhead per call",
        "call time over a one-token call, n new tokens per sequence:",
        "   B | one-token call | "
        + " | ".join(f"{f'n={t}':<7s}" for t in tokens)
        + " | ridge (n per seq)",
    ]
    for B in batches:
        one = modelled_call(shape, gpu, 1, B, context, overhead_s)
        ridge = modelled_ridge(shape, gpu, B, context)
        cells = " | ".join(
            f"{modelled_ratio(shape, gpu, t, B, context, overhead_s):6.2f}"
            + ("*" if not modelled_call(shape, gpu, t, B, context).fits else " ")
            for t in tokens
        )
        lines.append(
            f"{B:4d} | {one.time_s * 1e3:8.2f} ms    | {cells} | "
            + ("none" if ridge is None else f"{ridge} (= {ridge * B} per call)")
        )
    if "*" in "".join(lines[3:]):
        lines.append(f"* does not fit in {gpu.memory / 1e9:.0f} GB (weights and KV cache)")
    return "\n".join(lines)
