"""How every sampling draft draws a token and reports its ``q``: the draft's honesty rule, once.

A draft samples each token by Gumbel-max over its *processed* logits (the same temperature /
top-k / top-p as the target's ``p``; ``argmax(logits + G)`` is a draw from ``softmax(logits)``)
and reports ``q`` as the softmax of those same logits. The verifier is exact for any ``q``,
but only if ``q`` is the distribution the token was really drawn from: a draft that samples
from one set of logits and reports another breaks exactness (``drafts.proposer.audit_proposer``
catches it). ``DraftSampler`` holds the rule: the logits rows a draft writes into, the
Gumbel noise (``draft_noise``: ``k`` rows per proposal, drawn in blocks from the run's
generator), the draw of each token (a tensor path, and a NumPy path over the same memory on a
CPU), and ``q``. The draft model (``drafts.model_draft``), the EAGLE-style drafts
(``drafts.eagle``) and the real model's feature draft (``llm.draft``) all use it.

``ConfidenceStop`` is the one confidence stop a proposer may apply (``ModelProposer``'s
``p_min``, ``llm.draft.FeatureDraftProposer``'s ``stop_below``): the proposal ends where the
draft is unsure, judged from the draft's own numbers only, so the output's law is unchanged.
"""

from __future__ import annotations

import numpy as np
import torch

from ..sampling import NoiseBlocks

__all__ = ["DraftSampler", "ConfidenceStop", "draft_noise", "softmax_rows"]


def softmax_rows(logits: np.ndarray, out: np.ndarray, ones: np.ndarray) -> np.ndarray:
    """The softmax of each row of ``logits`` (``[k, V]``, NumPy) written into ``out``: a
    NumPy draft's ``q``. ``ones`` is a ``[V]`` vector of ones of ``out``'s dtype (the row
    sums are one dot product: NumPy's axis reductions cost several microseconds at this
    size). ``-inf`` logits (filtered out) give 0. Returns ``out``."""
    np.subtract(logits, logits.max(axis=1, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= (out @ ones)[:, None]
    return out


def draft_noise(sampling, generator, max_new_tokens: int, k: int, V: int, device, host=False):
    """A draft's Gumbel noise, ``k`` rows per proposal, drawn in blocks of 16 proposals as
    the run uses them (``sampling.NoiseBlocks``; NumPy views with ``host``, CPU only);
    ``None`` at temperature 0 or ``k = 0``. There are never more proposals than new tokens
    (an iteration emits at least one)."""
    if sampling.greedy or k < 1:
        return None
    limit = max(max_new_tokens, 1) * k
    return NoiseBlocks(
        V, limit, block=16 * k, generator=generator, device=device, gumbel=True, host=host
    )


class DraftSampler:
    """One generation's draws of a draft: ``k`` logits rows, their noise, the tokens and ``q``.

    Built in a proposer's ``start`` (``sampling`` the loop's ``SamplingOptions``, noise from
    ``generator``, ``V`` the draft's vocabulary, ``dtype`` and ``device`` its logits', or
    ``like``: a tensor, e.g. its head's weight, to take both from). With
    ``host`` (a CPU and float32 / float64) the noise rows are NumPy arrays and ``logits_np``
    is a NumPy view of ``logits``, for a draft whose steps run in NumPy.

    Per proposal: ``begin(k)`` takes its ``k`` noise rows (none at temperature 0); the draft
    writes draft ``j``'s raw logits into ``row(j)`` (``[1, V]``, or ``logits_np[j]``), then
    ``draw(j, slot)`` (tensors: the token into ``slot``, a one-element int64 tensor) or
    ``draw_host(j)`` (NumPy: returns the token) processes that row in place and draws from
    it; ``q(k)`` (``torch.softmax``) or ``q_host(k)`` (``softmax_rows``, into one buffer:
    valid until the next proposal) is the softmax of the processed rows, ``None`` at
    temperature 0 (the drafts are then the argmax, a one-hot ``q``).
    """

    def __init__(
        self,
        sampling,
        generator,
        max_new_tokens: int,
        k: int,
        V: int,
        *,
        dtype=None,
        device=None,
        like: torch.Tensor | None = None,
        host: bool = False,
    ):
        if like is not None:  # the logits in the dtype and on the device of a weight
            dtype, device = like.dtype, like.device
        self.sampling = sampling
        # Identity processing (temperature 1, no filters, or greedy): no op per draft.
        self.processed = sampling.changes_logits
        rows = max(k, 1)
        self.logits = torch.empty(rows, V, dtype=dtype, device=device)
        self.rows = [self.logits[j : j + 1] for j in range(rows)]
        self.logits_np = self.logits.numpy() if host else None
        self.noise = draft_noise(sampling, generator, max_new_tokens, k, V, device, host)
        self.g = None
        if host:
            q = torch.empty(rows, V, dtype=dtype)
            self._q_np, self._q_views = q.numpy(), [q[:j] for j in range(rows + 1)]
            self._ones = np.ones(V, self._q_np.dtype)

    def begin(self, k: int) -> None:
        """A new proposal of ``k`` drafts: its noise rows (none at temperature 0)."""
        self.g = None if self.noise is None else self.noise.take(k)

    def row(self, j: int) -> torch.Tensor:
        """Draft ``j``'s logits row ``[1, V]``, for the draft to write its raw logits into."""
        return self.rows[j]

    def draw(self, j: int, slot: torch.Tensor) -> None:
        """Draft ``j`` into ``slot``: Gumbel-max over row ``j``, processed in place first."""
        row = self.rows[j]
        if self.processed:
            row.copy_(self.sampling.logits(row))
        g = self.g
        torch.argmax(row if g is None else row + g[j], dim=-1, out=slot)

    def draw_host(self, j: int) -> int:
        """Draft ``j`` in NumPy (``logits_np[j]``, NumPy noise): the same first-index argmax
        of the same IEEE float sums as :meth:`draw`, so the same token."""
        if self.processed:
            row = self.rows[j]
            row.copy_(self.sampling.logits(row))
        lg, g = self.logits_np[j], self.g
        return int(lg.argmax() if g is None else (lg + g[j]).argmax())

    def q(self, k: int) -> torch.Tensor | None:
        """The ``q`` of the first ``k`` drafts: the softmax of their processed logits."""
        return None if self.g is None else self.logits[:k].softmax(-1)

    def q_host(self, k: int) -> torch.Tensor | None:
        """:meth:`q` computed in NumPy into one buffer (a tensor view of it, the same for the
        same ``k``, so the loop reuses its NumPy view)."""
        if self.g is None:
            return None
        softmax_rows(self.logits_np[:k], self._q_np[:k], self._ones)
        return self._q_views[k]


class ConfidenceStop:
    """Stop a proposal where the draft is unsure: its top probability below ``threshold``.

    ``chain=False`` judges each draft by its own top probability (``ModelProposer``'s
    ``p_min``, with ``keep=True`` Hugging Face's ``assistant_confidence_threshold``, which
    keeps the token it checks; with ``keep=False`` llama.cpp's ``--draft-p-min``, which drops
    the candidate it checks); ``chain=True`` by the product of the top probabilities so far
    (EAGLE-2's chain confidence: ``FeatureDraftProposer``'s ``stop_below``). ``keep`` says
    whether the unsure draft itself stays in the proposal (``p_min`` keeps it: its step is
    paid for and the target's extra position is nearly free) or is dropped (``stop_below``).
    The length depends on the draft's own distributions only, so sampling stays exact.

    Per proposal: ``start()``, then after each draft ``j`` with top probability ``top``,
    ``cut(j, top)``: the proposal's length if it ends here, else ``None``.
    """

    __slots__ = ("threshold", "chain", "keep", "confidence")

    def __init__(self, threshold: float, *, chain: bool = False, keep: bool = True):
        self.threshold, self.chain, self.keep = threshold, chain, keep
        self.confidence = 1.0

    def start(self) -> None:
        self.confidence = 1.0

    def cut(self, j: int, top: float) -> int | None:
        self.confidence = self.confidence * top if self.chain else top
        if self.confidence < self.threshold:
            return j + 1 if self.keep else j
        return None

    def __repr__(self) -> str:
        kind = "chain" if self.chain else "each draft"
        return f"ConfidenceStop({self.threshold}, {kind}, keep={self.keep})"
