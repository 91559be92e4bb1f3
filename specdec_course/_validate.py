"""Boundary checks shared by the public functions.

Public functions call these once, on entry, and raise one clear ``ValueError`` that names the
argument and what is wrong with it. Internals trust their callers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

# Probabilities that come out of a float32 softmax sum to 1 within about 1e-6 per thousand
# entries; 1e-4 accepts those and still catches logits, counts or a forgotten normalisation.
SUM_TOLERANCE = 1e-4

ProbLike = torch.Tensor | np.ndarray | Sequence[float]


def as_tensor(x: ProbLike, name: str) -> torch.Tensor:
    """Turn a tensor, numpy array or list into a floating torch tensor (lists -> float64)."""
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, np.ndarray):
        t = torch.from_numpy(np.asarray(x))
    elif isinstance(x, (list, tuple)):
        try:
            t = torch.tensor(x, dtype=torch.float64)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name} must be a list of numbers; got {x!r} ({e})") from None
    else:
        raise ValueError(
            f"{name} must be a torch.Tensor, numpy array or list of floats, not {type(x).__name__}"
        )
    if not t.is_floating_point():
        t = t.to(torch.float64)
    return t


def check_distribution(x: ProbLike, name: str, *, dim: int | None = 1) -> torch.Tensor:
    """Return ``x`` as a floating tensor after checking it is a probability vector.

    ``dim=1`` asks for one distribution of shape ``[V]``; ``dim=None`` accepts any shape whose
    last axis is the vocabulary. Raises ``ValueError`` for a wrong shape, NaN or infinite
    entries, negative entries, or rows that do not sum to 1 within ``SUM_TOLERANCE``.
    """
    t = as_tensor(x, name)
    if dim is not None and t.dim() != dim:
        raise ValueError(
            f"{name} must be a {dim}-D probability vector of shape [V]; got shape {tuple(t.shape)}"
        )
    if t.numel() == 0 or t.shape[-1] == 0:
        raise ValueError(f"{name} is empty; it needs at least one entry")
    # Two reductions cover every check: min is NaN when any entry is NaN, the sum is not
    # finite when any entry is infinite. This runs on every call, so it is kept cheap.
    lo = t.min().item()
    sums = t.sum(dim=-1, dtype=torch.float64)
    if t.dim() == 1:
        total = sums.item()
        worst_sum, finite = total, math.isfinite(total)
    else:
        dev = (sums - 1).abs()
        worst_sum = sums.flatten()[dev.flatten().argmax()].item()
        finite = bool(torch.isfinite(sums).all())
    if math.isnan(lo) or not finite:
        raise ValueError(f"{name} contains NaN or infinite entries; pass finite probabilities")
    if lo < 0:
        raise ValueError(
            f"{name} has negative entries (min {lo:.4g}); "
            "probabilities must be >= 0 (did you pass logits? apply softmax first)"
        )
    if abs(worst_sum - 1) > SUM_TOLERANCE:
        raise ValueError(
            f"{name} must sum to 1 along its last axis; a row sums to {worst_sum:.6g} "
            "(normalise it, e.g. p / p.sum())"
        )
    return t


def check_int(value, name: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """Return ``value`` if it is an int (not a bool) in ``[minimum, maximum]``; else ValueError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        if maximum is not None:
            what = f"an int in [{minimum}, {maximum}]"
        else:
            what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {what}; got {value!r}")
    return value


def check_same_shape(a: torch.Tensor, b: torch.Tensor, na: str, nb: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{na} and {nb} must have the same shape; got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def check_pair(p: ProbLike, q: ProbLike) -> tuple[torch.Tensor, torch.Tensor]:
    """``p`` and ``q`` as checked probability vectors of one shape, ``q`` in ``p``'s dtype."""
    p = check_distribution(p, "p")
    q = check_distribution(q, "q")
    check_same_shape(p, q, "p", "q")
    if p.dtype != q.dtype:
        q = q.to(p.dtype)
    return p, q
