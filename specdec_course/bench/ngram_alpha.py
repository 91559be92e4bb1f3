"""Acceptance of an n-gram draft against the target on validation text, and the sweep over
orders and discounts that chose the default (lesson 07)."""

from __future__ import annotations

import torch

from .. import data as D
from ..drafts.ngram.ngram_draft import DEFAULT_DISCOUNT, NgramDraft
from ..sampling import process_logits

__all__ = ["measure_alpha", "order_sweep"]


def _target_probs(target, ids: torch.Tensor, n_windows: int, temperature: float):
    x, _ = D.eval_windows(ids, target.config.block_size, n_windows)
    with torch.inference_mode():
        return x, process_logits(target(x), temperature).double()  # [N, T, V]


def _alpha(draft: NgramDraft, x: torch.Tensor, P: torch.Tensor, temperature: float) -> float:
    L = draft.order - 1
    if L:  # position t predicts x[t + 1] from x[t - L + 1 .. t]: needs t >= L - 1
        q = draft.batch_probs(x.unfold(1, L, 1).reshape(-1, L))
        p = P[:, L - 1 :].reshape(-1, P.shape[-1])
    else:
        q = draft.probs([]).expand(x.numel(), -1)
        p = P.reshape(-1, P.shape[-1])
    if temperature != 1.0:
        q = process_logits(q.clamp_min(1e-300).log().float(), temperature).double()
    return torch.minimum(p, q).sum(-1).mean().item()


def measure_alpha(
    target, draft: NgramDraft, ids: torch.Tensor, *, n_windows: int = 32, temperature=1.0
) -> float:
    """Mean ``sum(min(p, q))`` over the positions of ``n_windows`` windows of ``ids``.

    ``p`` is the target's next-character distribution after the window's prefix, ``q`` the
    n-gram's after the same prefix (its last ``order - 1`` characters), both processed with
    ``temperature`` (0: one-hot argmaxes, alpha = agreement). The first ``order - 2``
    positions of each window, whose context is shorter than the n-gram's, are left out.
    """
    x, P = _target_probs(target, ids, n_windows, temperature)
    return _alpha(draft, x, P, temperature)


def order_sweep(
    target,
    orders=range(1, 9),
    discounts=(DEFAULT_DISCOUNT,),
    *,
    n_windows: int = 32,
    temperature: float = 1.0,
) -> list[dict]:
    """Acceptance against ``target`` on validation text for each order and discount.

    Each n-gram counts the training split (counts only, no drafting tables); alpha is
    measured on ``n_windows`` validation windows, the target's distributions computed once.
    Returns rows ``{"order", "discount", "alpha", "contexts", "build_s"}``.
    """
    train_ids, val_ids = D.corpus_split()
    x, P = _target_probs(target, val_ids, n_windows, temperature)
    rows = []
    for order in orders:
        for d in discounts:
            ng = NgramDraft(order, d, ids=train_ids, tables=False)
            rows.append(
                {
                    "order": order,
                    "discount": d,
                    "alpha": _alpha(ng, x, P, temperature),
                    "contexts": ng.contexts,
                    "build_s": ng.build_seconds,
                }
            )
    return rows
