"""The Llama's speed path on a CPU: its products through oneDNN with packed weights.

A decode step of SmolLM2 is ~120 matrix products of a few rows (the tokens scored) by a
weight matrix. On a CPU, ATen's own bfloat16 product at a few rows is compute-bound and grows
with every row; oneDNN's (the library ``torch.ops.mkldnn`` calls) reads a weight laid out
once, at load time, in the blocks its kernel wants, and uses the CPU's bfloat16 dot-product
instructions (AVX512-BF16, AMX, ARM's BF16). This module swaps the blocks' ``nn.Linear``
for :class:`PackedLinear` and packs the tied head: the same arithmetic on the same weights,
so ``model.py`` stays the plain Llama (as gpt-fast's ``quantize.py`` swaps its Linear layers
for int8 ones beside ``model.py``).

Measured on the course's 2-core CPU (Intel Xeon, AVX512-BF16, torch 2.13), one cached call
after a 300-token context, 2 threads: ATen's bfloat16 path (the loops run with oneDNN off)
took 28 ms for 1 token and 111 ms for 9; packed, 26 and 43 ms; float32, 30 and 64 ms.
``llm.loading``'s docstring says why float32 stays the default all the same (a row's result
depends on the rows beside it, and bfloat16 makes that visible in greedy text).

float32 takes both paths, by the number of rows: ATen's (MKL's) product is the fastest at one
to three rows, the calls of plain decoding; from four rows on, the verification calls of
speculative decoding, MKL switches to a kernel that adds about 8 ms a row (a sixth of a
one-row call), and oneDNN's packed product, about 3. Measured on the
course's 2-core CPU, one thread, the whole model after a 300-token context (``bench llm``
records it as ``call_costs``): ATen 52 ms for 1 token, 84 for 4 and 121 for 9; packed 56, 64
and 82. :class:`SplitLinear` keeps both copies of the weights (twice the memory: 1.1 GB
instead of 540 MB) to give each call the cheaper one. The two kernels sum in other orders, a
few units in the last place of float32, as ATen's own one-row and several-row kernels already
do (``llm.loading``'s docstring).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn import functional as F

__all__ = ["PackedLinear", "SplitLinear", "ATEN_ROWS", "can_pack", "native_bf16", "pack"]


def native_bf16() -> bool:
    """True where this CPU multiplies bfloat16 natively (x86: AVX512-BF16 or AMX-BF16; Arm:
    the BF16 extension), read from ``/proc/cpuinfo`` (False where it cannot be read). oneDNN
    runs bfloat16 elsewhere too, by converting to float32, with no gain over float32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set()
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags.update(line.split(":", 1)[1].split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def can_pack(dtype: torch.dtype) -> bool:
    """True where oneDNN runs ``dtype`` products on this CPU: float32 with oneDNN built in,
    bfloat16 also needs a CPU it supports bfloat16 on."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


# float32 products of at most this many rows go through ATen (MKL), more through oneDNN.
ATEN_ROWS = 3


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


class SplitLinear(PackedLinear):
    """A float32 ``nn.Linear`` without bias that takes ATen's product for a few rows (at most
    :data:`ATEN_ROWS`) and oneDNN's packed one for more; keeps both copies of the weight."""

    def __init__(self, weight: torch.Tensor):
        super().__init__(weight)
        # The same Parameter object as the Linear's (or the tied table's): counted once.
        if not isinstance(weight, nn.Parameter):
            weight = nn.Parameter(weight, requires_grad=False)
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() <= ATEN_ROWS * self.in_features:
            return F.linear(x, self.weight)
        return super().forward(x)


def pack(model):
    """``model`` (an ``llm.llama.Llama``) with every block's products and its head packed for
    oneDNN: :class:`PackedLinear` in bfloat16, :class:`SplitLinear` in float32. Returns the
    model unchanged where :func:`can_pack` is False."""
    if not can_pack(model.compute_dtype) or model.lm_head.weight.device.type != "cpu":
        return model
    kind = PackedLinear if model.compute_dtype == torch.bfloat16 else SplitLinear
    for block in model.layers:
        for parent in (block.attention, block.feed_forward):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, kind(child.weight))
    model.head_product = kind(model.head_weight)
    return model
