"""Prompt lookup: a draft that copies from the text itself (Saxena 2023; vLLM's n-gram draft).

When a model summarises, quotes or edits a passage it was given, its output repeats long runs
of that passage. Prompt lookup drafts them for free: take the last ``n`` tokens of the text,
find an earlier place where the same ``n`` tokens occur, and propose the tokens that followed
them there. The rule is vLLM's: the longest suffix n-gram with ``min_n <= n <= max_n`` that
occurs earlier, at its first occurrence (Hugging Face's ``prompt_lookup_num_tokens`` also
tries the longest n first and takes the first match with a continuation).

The drafts are a deterministic function of the committed text, so the distribution they were
drawn from is one-hot: ``q`` has a 1 at the drafted token. The verifier then accepts a draft
``x`` with probability ``p(x)`` and otherwise resamples from ``norm(max(p - q, 0))``, which
keeps the output exactly the target's (lesson 01); at temperature 0 it is the target's
greedy text token for token.

How many tokens to copy is learnt as it goes (``grow=True``, the default): Hugging Face's
heuristic schedule for its assistant drafts (``num_assistant_tokens_schedule="heuristic"``),
the package's one k schedule, ``decoding.dynamic.HeuristicK``. A proposal starts at ``k``
tokens; after each verified proposal the limit grows by 2 (up to ``k``) when every copied
token was accepted and shrinks by 1 (down to 1) otherwise. On text that repeats its input
the limit stays at ``k``; on open chat, where a two-token match is mostly a chance repeat
and its copy is rejected at once, proposals shrink to one token, whose verification costs
little more than a plain step. The length depends only on earlier verdicts, fixed before the
proposal is verified, so the output law is unchanged (lesson 08's dynamic k).
"""

from __future__ import annotations

import numpy as np
import torch

from .._validate import check_int
from ..decoding.dynamic import HeuristicK

__all__ = ["PromptLookup", "lookup"]


def lookup(ctx: np.ndarray, k: int, min_n: int = 1, max_n: int = 4) -> np.ndarray:
    """Up to ``k`` tokens that followed the first earlier occurrence of the longest suffix
    n-gram of ``ctx`` (1-D ids), ``min_n <= n <= max_n``; empty when none occurs."""
    n = ctx.shape[0]
    for s in range(min(max_n, n - 1), min_n - 1, -1):
        pattern = ctx[n - s :]
        # windows starting at 0 .. n - s - 1: each has at least one token after it
        windows = np.lib.stride_tricks.sliding_window_view(ctx[: n - 1], s)
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size:
            start = int(hits[0]) + s
            return ctx[start : min(start + k, n)]
    return ctx[:0]


class PromptLookup:
    """Prompt lookup as a proposer for ``decoding.speculative_generate`` (``drafts.proposer``).

    ``PromptLookup(model, min_n=1, max_n=4, grow=True)``: built for ``model`` (the loop
    refuses another target). ``propose`` copies up to ``k`` tokens (``lookup``; up to the
    learnt limit with ``grow``, the module docstring), fewer where the match is near the end
    of the text, none where nothing matches (the iteration is then a plain step). ``q`` is
    one-hot: ``None`` at temperature 0, else float32 rows with a 1 at each draft. ``commit``
    reads how many copied tokens were accepted and moves the limit; nothing to roll back.
    """

    def __init__(self, model, *, min_n: int = 1, max_n: int = 4, grow: bool = True):
        check_int(min_n, "min_n")
        check_int(max_n, "max_n", minimum=min_n)
        self.target = model
        self.vocab_size = model.config.vocab_size
        self.device = model.lm_head.weight.device
        self.min_n, self.max_n = min_n, max_n
        self.grow = bool(grow)
        self.greedy = True
        self._q = None

    def start(self, ids, n, sampling, generator, max_new_tokens, k) -> None:
        self.greedy = sampling.greedy
        self._q = None if self.greedy else torch.zeros(max(k, 1), self.vocab_size)
        self._set: list[tuple[int, int]] = []
        self.proposals = self.drafted = 0
        self.k = max(k, 1)  # the loop's k: the limit's ceiling
        # The next proposal's length at most: HeuristicK's +2 / -1 from k, within 1 .. k
        # (stays at k without grow).
        self.schedule = HeuristicK(self.k)
        self.schedule.start(self.k)
        self._pending = None  # (n, tokens copied) of the proposal being verified

    def propose(self, ids, n, k, out):
        ctx = ids[:n].numpy() if ids.device.type == "cpu" else ids[:n].cpu().numpy()
        draft = lookup(ctx, min(k, self.limit), self.min_n, self.max_n)
        kk = int(draft.shape[0])
        self._pending = (n, kk)
        self.proposals += 1
        self.drafted += kk
        if kk == 0:
            return 0, None
        out[:kk] = torch.from_numpy(draft)
        if self.greedy:
            return kk, None
        q = self._q
        for j, x in self._set:  # clear the last proposal's ones
            q[j, x] = 0.0
        self._set = [(j, int(x)) for j, x in enumerate(draft)]
        for j, x in self._set:
            q[j, x] = 1.0
        return kk, q[:kk]

    def commit(self, ids, n) -> None:
        """After a verification: ``n`` committed tokens, the proposal's accepted ones and the
        target's own. With ``grow``, a proposal accepted whole raises the limit by 2 (up to
        ``k``); one cut short lowers it by 1 (down to 1)."""
        if self._pending is None or not self.grow:
            return
        before, kk = self._pending
        self._pending = None
        self.schedule.update(kk, min(n - before - 1, kk))  # drafted, accepted

    @property
    def limit(self) -> int:
        """The next proposal's length at most (``schedule.k``)."""
        return self.schedule.k

    def __repr__(self) -> str:
        return f"PromptLookup(min_n={self.min_n}, max_n={self.max_n}, grow={self.grow})"
