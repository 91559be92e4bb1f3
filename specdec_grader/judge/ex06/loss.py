"""Check ``ex06.medusa_loss``: the heads' cross-entropies, each against the token ``k + 1``
places ahead, weighted by ``0.8^k`` and summed, against :func:`specdec_course.medusa.
medusa_loss` over :func:`specdec_course.medusa.head_targets`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from specdec_course import medusa

from .._support import as_number, fmt
from ..context import case_seed
from ..core import Case, call, register


def _reference_loss(logits: torch.Tensor, ids: torch.Tensor, decay: float = 0.8) -> float:
    K = logits.shape[0]
    targets, valid = medusa.head_targets(ids, K)
    return float(medusa.medusa_loss(logits.double(), targets, valid, decay)[0])


def _shifted_loss(logits, ids, shift):
    # Cross-entropies with the labels shifted by k + shift instead of k + 1 (diagnosis only).
    K, B, T, V = logits.shape
    total = 0.0
    for k in range(1, K + 1):
        s = k + shift
        if s >= T or s < 0:
            continue
        ce = nn.functional.cross_entropy(
            logits[k - 1, :, : T - s].reshape(-1, V).double(), ids[:, s:].reshape(-1)
        )
        total += 0.8**k * float(ce)
    return total


def _diagnose_loss(logits, ids, got: float) -> str:
    K = logits.shape[0]
    targets, valid = medusa.head_targets(ids, K)
    _, ce = medusa.medusa_loss(logits.double(), targets, valid)
    ce = ce.tolist()

    def close(x):
        return abs(got - x) <= 1e-5 * max(1.0, abs(x))

    if close(sum(ce)):
        return "every head has weight 1: the heads further ahead should weigh less"
    if close(sum(0.8 ** (k - 1) * c for k, c in enumerate(ce, 1))):
        return "the weights are one power of 0.8 off: the first head's weight is 1 instead of 0.8"
    if close(sum(ce) / K) or close(sum(0.8**k * c for k, c in enumerate(ce, 1)) / K):
        return "you averaged over the heads; the loss is a weighted sum"
    if close(_shifted_loss(logits, ids, 0)):
        return (
            "off by one: each head was scored against the token one place too early (head "
            "1 against what the base head predicts)"
        )
    if close(_shifted_loss(logits, ids, 2)):
        return "off by one: each head was scored against the token one place too late"
    return (
        "wrong loss, and not by a known slip (the weights, the shift by one, an average); "
        "is each head's cross-entropy the mean over exactly its labelled positions?"
    )


@register(
    "ex06.medusa_loss",
    points=3,
    needs="medusa_loss",
    title="the weighted multi-head loss",
    hint="write down, for head 1 and a window of 6 tokens, which positions have a label and "
    "which token each one must guess; then head k. Lesson 06, section 1 shows the targets on "
    "a line of Julius Caesar",
)
def check_medusa_loss(fn) -> Iterator[Case]:
    g = torch.Generator().manual_seed(case_seed(6))
    for K, B, T, V in ((3, 2, 9, 13), (1, 2, 6, 5), (3, 4, 32, 65), (4, 1, 12, 7)):
        logits = 2 * torch.randn(K, B, T, V, generator=g)
        ids = torch.randint(V, (B, T), generator=g)
        name = f"K={K} heads, ids [{B}, {T}], V={V}"
        got_raw = call(name, fn, logits.clone(), ids.clone())
        got = as_number(got_raw)
        exp = _reference_loss(logits, ids)
        if got is None:
            yield Case(
                name,
                False,
                f"{exp:.6g}",
                fmt(got_raw),
                "return a scalar (a number or a 0-d tensor)",
            )
            return
        ok = abs(got - exp) <= 1e-5 * max(1.0, abs(exp))
        yield Case(
            name, ok, f"{exp:.6g}", f"{got:.6g}", "" if ok else _diagnose_loss(logits, ids, got)
        )
        if not ok:
            return
