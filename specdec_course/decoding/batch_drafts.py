"""How the batched speculative loop drafts: ``K`` tokens for every row, and the ``q`` of each.

``speculative_generate_batch`` asks its drafter for one iteration's drafts with
``propose(K, lo, hi, slots, G)``: the drafter writes every row's pending token and its ``K``
drafts into the target's input ``feed [k + 1, B]`` (rows are columns there: one call scores
them all), and ``q(K)`` afterwards gives the distributions they were drawn from, ``[B, K,
V]``. Three drafters, chosen once (``batch_drafter``):

- ``TableDrafts``: an n-gram table (``ngram.NgramDraft``, ``distilled.load_distilled()``):
  every row's drafts looked up from its own context, ``q`` the table rows they were drawn
  from (NumPy);
- ``FoldedDrafts``: one row with a one-layer draft model, its folded step
  (``fast.folded``: NumPy on a CPU), as the batch-1 loop takes;
- ``RaggedDrafts``: the draft model's lean ragged step for a batch (``fast.ragged``).

Draft cache invariant (see ``batched``): with ``n_b`` tokens committed in row ``b`` the
draft's cache holds ``x[0 .. n_b - 3]``, and a proposal starts by feeding the last two
committed tokens. Gumbel-max sampling over the processed logits, with the noise ``G`` the
loop draws for the iteration; ``G`` is None at temperature 0.
"""

from __future__ import annotations

import numpy as np
import torch

from ..fast import FoldedStep, batch_steps, draft_step
from ..sampling import SamplingOptions

__all__ = ["TableDrafts", "FoldedDrafts", "RaggedDrafts", "batch_drafter"]


class TableDrafts:
    """An n-gram table's drafts for every row (``draft.propose_rows``)."""

    def __init__(self, draft, smp: SamplingOptions, out, n, feed, k: int):
        B = out.shape[0]
        self.draft, self.smp, self.greedy = draft, smp, smp.greedy
        self.q_rows = draft.sampling_rows(smp)
        self.toks = np.empty((B, k), dtype=np.int64)
        self.rows = np.empty((B, k), dtype=np.int64)
        self.out_h, self.n_h, self.feed_h = out.numpy(), n.numpy(), feed.numpy()
        self.b = np.arange(B)

    def prefill(self, ids: torch.Tensor) -> None:
        pass  # no model, no cache

    def propose(self, K: int, lo: int, hi: int, slots, G) -> None:
        out_h, n_h, feed_h = self.out_h, self.n_h, self.feed_h
        self.draft.propose_rows(self.smp, out_h, n_h, K, G, self.toks, self.rows)
        feed_h[0] = out_h[self.b, n_h - 1]
        feed_h[1 : K + 1] = self.toks[:, :K].T

    def q(self, K: int) -> np.ndarray:
        return self.q_rows[self.rows[:, :K]]  # [B, K, V] (NumPy), the rows drawn from


class _ModelDrafts:
    # What the two model drafters share: logits per draft [k, B, V] and q from them.

    def __init__(self, draft, smp: SamplingOptions, out, n, feed, k: int, dtype):
        B, V = out.shape[0], draft.config.vocab_size
        self.smp, self.greedy = smp, smp.greedy
        self.out, self.n, self.feed = out, n, feed
        self.out_h, self.feed_h = out.numpy(), feed.numpy()
        self.logits = torch.empty(k, B, V, dtype=dtype)  # the target's logits dtype
        self.logits_h = self.logits.numpy()

    def q(self, K: int) -> torch.Tensor:
        return self.smp.logits(self.logits[:K]).softmax(-1).transpose(0, 1)  # [B, K, V]


class FoldedDrafts(_ModelDrafts):
    """One row, a one-layer draft's folded step (``fast.folded``), token by token."""

    def __init__(self, draft, smp, out, n, feed, k: int, dtype, fold: FoldedStep):
        super().__init__(draft, smp, out, n, feed, k, dtype)
        self.fold, self.cache = fold, fold.new_cache()

    def prefill(self, ids: torch.Tensor) -> None:
        if ids.shape[1] > 2:
            self.fold.feed(ids[0, : ids.shape[1] - 2], self.cache)

    def propose(self, K: int, lo: int, hi: int, slots, G) -> None:
        fold, fc, smp, lg, lg_h = self.fold, self.cache, self.smp, self.logits, self.logits_h
        fc.length = lo - 2
        fold.feed(self.out[0, lo - 2 : lo - 1], fc)
        x = self.feed_h[0, 0] = self.out_h[0, lo - 1]
        for j in range(K):
            lj = lg[j]
            fold.step(int(x), fc, lj)
            if self.greedy:
                x = lg_h[j, 0].argmax()
            elif not smp.changes_logits:
                x = (lg_h[j, 0] + G.numpy()[j, 0]).argmax()
            else:
                x = int(torch.argmax(smp.logits(lj) + G[j]))
            self.feed_h[j + 1, 0] = x


class RaggedDrafts(_ModelDrafts):
    """Every row at once, the draft model's lean ragged step (``fast.ragged``)."""

    def __init__(self, draft, smp, out, n, feed, k: int, dtype):
        super().__init__(draft, smp, out, n, feed, k, dtype)
        self.steps = batch_steps(draft, out.shape[0])

    def prefill(self, ids: torch.Tensor) -> None:
        if ids.shape[1] > 2:
            self.steps.prefill(ids[:, : ids.shape[1] - 2])

    def propose(self, K: int, lo: int, hi: int, slots, G) -> None:
        ds, feed, smp = self.steps, self.feed, self.smp
        last2 = self.out.gather(1, slots[:, :2])
        feed[0] = last2[:, 1]
        for j in range(K):
            lj = self.logits[j]
            if j == 0:
                ds.step(last2, slots[:, :2], hi, lj, last=True)
            else:
                ds.step(feed[j : j + 1].t(), slots[:, j + 1 : j + 2], hi + j, lj)
            torch.argmax(lj if self.greedy else smp.logits(lj) + G[j], -1, out=feed[j + 1])


def batch_drafter(draft, table: bool, smp: SamplingOptions, out, n, feed, k: int, dtype):
    """The drafter for ``draft`` (an n-gram table when ``table``, else a ``CharGPT``) over
    the loop's buffers: ``out [B, S]`` (committed ids), ``n [B]`` (committed lengths),
    ``feed [k + 1, B]`` (the target's input); a model's logits are kept in ``dtype`` (the
    target's). Call ``prefill(ids)`` before the first ``propose``."""
    if table:
        return TableDrafts(draft, smp, out, n, feed, k)
    fold = draft_step(draft) if out.shape[0] == 1 else None
    if isinstance(fold, FoldedStep):
        return FoldedDrafts(draft, smp, out, n, feed, k, dtype, fold)
    return RaggedDrafts(draft, smp, out, n, feed, k, dtype)
