"""Helpers the exercise notebooks use that are neither a reference nor a check (so they are
also there in the sandbox): the inputs of exercise 05's visible example."""

from __future__ import annotations

import torch

from specdec_course.sampling import exp_noise

__all__ = ["make_race_inputs"]


def make_race_inputs(B: int, K: int, V: int, seed: int, zero_tail: int = 0):
    """Random ``(pos, p, q, e)`` for a check: targets and drafts softmax(2 randn), rejected
    positions uniform in ``0..K-1``; the last ``zero_tail`` ids get probability 0 in both."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(B, K + 1, V, generator=g), -1)
    q = torch.softmax(2 * torch.randn(B, K, V, generator=g), -1)
    if zero_tail:
        p[..., V - zero_tail :] = 0
        q[..., V - zero_tail :] = 0
        p /= p.sum(-1, keepdim=True)
        q /= q.sum(-1, keepdim=True)
    pos = torch.randint(0, K, (B,), generator=g)
    e = exp_noise((B, V), generator=g)
    return pos, p, q, e
