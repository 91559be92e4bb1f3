"""What the three checks of exercise 03 share: the tolerances, the small model's configuration,
and two helpers for the cases' words and the buffers an in-place call returns."""

from __future__ import annotations

import torch

from specdec_course.model import GPTConfig

ATOL = 1e-5
# Logits of the check's model reach about 4; float32 reordering moves them by about 1e-6,
# a wrong mask or scale by more than 0.1.
LOGIT_ATOL = 1e-4
CFG = GPTConfig(vocab_size=13, block_size=24, n_layer=1, n_head=2, n_embd=12)


def _lengths_text(lengths) -> str:
    return "[" + ", ".join(str(int(n)) for n in lengths) + "]"


def _like(a, b: torch.Tensor) -> bool:
    """``a`` is a tensor of ``b``'s shape and dtype (what an in-place output must stay)."""
    return isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
