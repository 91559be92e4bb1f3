"""The Llama's speed path on a CPU: its products through oneDNN with packed weights.

A decode step of SmolLM2 is ~120 matrix products of a few rows (the tokens scored) by a
weight matrix. oneDNN (the library ``torch.ops.mkldnn`` calls) reads a weight laid out once,
at load time, in the blocks its kernel wants; in bfloat16 it uses the CPU's bfloat16
dot-product instructions (AVX512-BF16, AMX, ARM's BF16), where ATen's own bfloat16 product at
a few rows is compute-bound and grows with every row. This module swaps the blocks'
``nn.Linear`` for :class:`PackedLinear` (bfloat16) or :class:`SplitLinear` (float32) and packs
the tied head: the same arithmetic on the same weights, so ``llama.py`` stays the plain Llama
(as gpt-fast's ``quantize.py`` swaps its Linear layers beside ``model.py``).

**float32: which kernel serves a call of T rows is measured here** (``llm.kernels``, once per
machine, cached on disk). The candidates (:data:`KERNELS`):

- ``"aten"``: ``F.linear`` (MKL's product): a one-row kernel, another for two or three rows and
  another from four rows on (on the course's AMD EPYC a call of 2 or 3 rows cost twice a call
  of 1, and 2.5 times a call of 4);
- ``"packed"``: oneDNN's product on the packed weight;
- ``"packed2"``, ``"packed4"``: the same, a call of fewer rows than 2 (or 4) padded with zero
  rows to that many. oneDNN takes another kernel for one row, on the EPYC for the 1536-wide
  ``w2`` only, which breaks row invariance; and there its kernels for one and two rows were
  slower than those for three and more (the 121 products of a step, one thread, thread CPU
  time on a busy machine: 43 ms for 1 row, 49 for 2, 35 for 4).

Greedy speculative text equals plain greedy text when a row's logits do not depend on how many
rows its call holds (the verification call scores k + 1 rows, plain decoding one). A kernel
gives that only if every call size reduces a row in the same order; ``llm.kernels`` checks it
bit for bit on this CPU, and where one kernel does, every call size takes it (mixing two
kernels would not: they sum in different orders). Where none does, each call size takes the
cheapest, and rows differ from a one-row call by a few units in float32's last place.
:func:`force` overrides the choice (tests, and the lesson that shows it).

The path is applied from outside the model (``llm.loading`` calls :func:`pack` on the plain
Llama), behind a version guard: the oneDNN ops it calls are torch's private ones, so
:func:`can_pack` first checks that they exist and compute ``F.linear``; where they do not, or
with ``SPECDEC_PACKED=0``, the model keeps ATen's products and loses only speed.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..devices import cpu_info

__all__ = [
    "KERNELS",
    "MIN_ROWS",
    "PackedLinear",
    "SplitLinear",
    "can_pack",
    "force",
    "kernel_for",
    "native_bf16",
    "pack",
]

KERNELS = ("aten", "packed", "packed2", "packed4")
MIN_ROWS = {"aten": 1, "packed": 1, "packed2": 2, "packed4": 4}  # a smaller call is padded


def native_bf16() -> bool:
    """True where this CPU multiplies bfloat16 natively (x86: AVX512-BF16 or AMX-BF16; Arm:
    the BF16 extension), from ``devices.cpu_info`` (False where the flags cannot be read). oneDNN
    runs bfloat16 elsewhere too, by converting to float32, with no gain over float32."""
    return bool(set(cpu_info()[1].split()) & {"avx512_bf16", "amx_bf16", "bf16"})


@functools.cache
def _private_ops_work() -> bool:
    """The version guard: the two private ops this module calls
    (``torch.ops.mkldnn._reorder_linear_weight`` and ``_linear_pointwise``, not part of
    torch's public API) exist in this torch and compute ``F.linear`` on a small product.
    False (and the model keeps ATen's products) where a torch release renamed or changed
    them."""
    try:
        g = torch.Generator().manual_seed(0)
        w, x = torch.randn(24, 16, generator=g), torch.randn(3, 16, generator=g)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.allclose(y, F.linear(x, w), rtol=1e-4, atol=1e-5))
    except (AttributeError, RuntimeError, TypeError):
        return False


def can_pack(dtype: torch.dtype) -> bool:
    """True where oneDNN runs ``dtype`` products on this CPU: float32 with oneDNN built in,
    bfloat16 also needs a CPU it supports bfloat16 on; both need the private ops to pass the
    version guard, and ``SPECDEC_PACKED=0`` in the environment turns the path off (every
    product then ATen's ``F.linear``)."""
    if os.environ.get("SPECDEC_PACKED", "1") == "0" or not torch.backends.mkldnn.is_available():
        return False
    if not _private_ops_work():
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class _Choice:
    """The process's kernel choice: ``tables[threads][T - 1]`` names the kernel of a call of
    ``T`` rows on that many threads (the last entry serves every longer call), ``calibrate`` a
    function that measures it for the thread count torch has now (set by :func:`pack`),
    ``forced`` :func:`force`'s override."""

    def __init__(self):
        self.tables: dict = {}
        self.calibrate = None
        self.forced: str | None = None


_choice = _Choice()


def _check_kernel(kernel) -> None:
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS} or None; got {kernel!r}")


class force:
    """Serve every float32 call with ``kernel`` (one of :data:`KERNELS`), or go back to the
    measured choice with ``None``. A call, or a context manager that restores the previous
    setting on exit: ``with llm.packed.force("aten"): ...``."""

    def __init__(self, kernel: str | None):
        _check_kernel(kernel)
        self.previous = _choice.forced
        _choice.forced = kernel

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        _choice.forced = self.previous


def set_table(table, threads: int) -> None:
    """Install a measured choice for ``threads`` threads (``llm.kernels`` calls it): one kernel
    name per call size, from one row up."""
    table = tuple(table)
    if not table:
        raise ValueError("the kernel table needs at least one entry")
    for k in table:
        _check_kernel(k)
    _choice.tables[threads] = table


def kernel_for(rows: int) -> str:
    """The kernel that serves a float32 call of ``rows`` rows now: the forced one, else the
    one measured for torch's thread count (measured first, on a count not seen before)."""
    if _choice.forced is not None:
        return _choice.forced
    table = _choice.tables.get(torch.get_num_threads())
    if table is None:
        if _choice.calibrate is None:
            return "packed"
        _choice.calibrate()
        table = _choice.tables[torch.get_num_threads()]
    return table[min(rows, len(table)) - 1]


class PackedLinear(nn.Module):
    """``nn.Linear`` without bias whose weight oneDNN has laid out for its kernel (read-only:
    the packed tensor is opaque; keep the original to train or save)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def product(kernel: str, x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor):
    """``x @ weight.T`` by ``kernel`` (``packed`` is ``weight`` as oneDNN laid it out)."""
    if kernel == "aten":
        return F.linear(x, weight)
    width = x.shape[-1]
    rows, least = x.numel() // width, MIN_ROWS[kernel]
    if rows >= least:
        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    padded = x.new_zeros(least, width)
    padded[:rows] = x.reshape(rows, width)
    y = torch.ops.mkldnn._linear_pointwise(padded, packed, None, "none", [], "")
    return y[:rows].reshape(*x.shape[:-1], y.shape[-1])


class SplitLinear(PackedLinear):
    """A float32 ``nn.Linear`` without bias that keeps the weight twice, as it is (ATen's
    product) and packed (oneDNN's), and gives each call the kernel :func:`kernel_for` names
    for its number of rows."""

    def __init__(self, weight: torch.Tensor):
        super().__init__(weight)
        # The same Parameter object as the Linear's (or the tied table's): counted once.
        if not isinstance(weight, nn.Parameter):
            weight = nn.Parameter(weight, requires_grad=False)
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = kernel_for(x.numel() // self.in_features)
        return product(kernel, x, self.weight, self.packed)


def pack(model):
    """``model`` (an ``llm.llama.Llama``) with every block's products and its head packed for
    oneDNN: :class:`PackedLinear` in bfloat16; in float32 :class:`SplitLinear`, with the kernel
    for each call size measured on this machine (``llm.kernels.calibrate``, read from its cache
    where this machine measured it before). Returns the model unchanged where :func:`can_pack`
    is False."""
    if not can_pack(model.compute_dtype) or model.lm_head.weight.device.type != "cpu":
        return model
    kind = PackedLinear if model.compute_dtype == torch.bfloat16 else SplitLinear
    for block in model.layers:
        for parent in (block.attention, block.feed_forward):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, kind(child.weight))
    model.head_product = kind(model.head_weight)
    if kind is SplitLinear:
        from . import kernels

        def calibrate() -> None:
            kernels.calibrate(model)

        _choice.calibrate = calibrate
        calibrate()
    return model
