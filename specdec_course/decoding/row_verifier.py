"""How the speculative loop verifies one row: the drafts against the target's scores.

Leviathan et al.'s step 3: accept draft ``j`` with probability ``min(1, p_j(x_j) / q_j(x_j))``
until the first rejection, then draw one token of the target's (from the residual after a
rejection, from the next row of ``p`` when every draft was accepted). ``row_verifier``
chooses the rule once per run; each takes ``(kk, q, logits)`` (the number of drafts, their
``q`` or None, the target's logits ``[kk + 1, V]``) and returns ``(a, token)``: ``a``
drafts accepted, then ``token``.

- ``GreedyVerifier`` (temperature 0): with one-hot ``p`` and ``q`` the rule reduces to
  "accept while the draft is the target's argmax, then emit the argmax"
  (``verifier.greedy_accepted``, the batched loop's greedy case too; tests pin it to
  ``verifier.rejection_sample``); it draws no random numbers.
- ``SampledVerifier``: ``p`` is the softmax of the processed logits; the rule, chosen by the
  loop, is the token rule ``verifier.rejection_sample_row`` or the block rule
  ``block_verifier.block_verify_row`` (Sun et al. 2024). It draws its random numbers from
  the run's generator when built, before the proposer's: float64 uniforms in (0, 1]
  ``[max_new_tokens, k]`` for the accept tests, then one Exp(1) row per iteration for the
  race, in blocks as the run uses them (``sampling.NoiseBlocks``). On a CPU the token rule
  reads ``p``, ``q`` and the drafts through NumPy views of the same memory (made once here).
"""

from __future__ import annotations

import torch

from ..block_verifier import block_verify_row
from ..sampling import NoiseBlocks, SamplingOptions, uniform_open_closed
from ..verifier import greedy_accepted

__all__ = ["GreedyVerifier", "SampledVerifier", "row_verifier"]

# Noise rows drawn at a time (``sampling.NoiseBlocks``): an iteration uses one for the race,
# and a run of 200 new tokens takes 40 to 100 iterations.
_BLOCK = 32


class GreedyVerifier:
    """Temperature 0: the drafts ``drafts[:kk]`` kept while they are the target's argmax."""

    def __init__(self, drafts: torch.Tensor):
        host = drafts.device.type == "cpu"  # .tolist() of a NumPy view costs less
        xs = drafts.numpy() if host else drafts
        self.xs = [xs[:j] for j in range(drafts.numel() + 1)]  # the drafts of each kk

    def __call__(self, kk: int, q, logits: torch.Tensor) -> tuple[int, int]:
        best = logits.argmax(-1).tolist()
        a = greedy_accepted(self.xs[kk].tolist(), best) if kk else 0
        return a, best[a]


class SampledVerifier:
    """Temperature > 0: ``rule`` (``verifier.rejection_sample_row``, the token rule, or
    ``block_verifier.block_verify_row``) on ``drafts[:kk]``, with ``p`` the processed
    softmax of the target's logits."""

    def __init__(
        self,
        rule,
        sampling: SamplingOptions,
        drafts: torch.Tensor,
        max_new_tokens: int,
        generator: torch.Generator | None,
        dtype: torch.dtype,
        vocab_size: int,
    ):
        dev, k, V = drafts.device, drafts.numel(), vocab_size
        host = dev.type == "cpu"
        self.U = uniform_open_closed((max_new_tokens, k), generator=generator).tolist()
        self.R = NoiseBlocks(
            V, max_new_tokens, block=_BLOCK, generator=generator, device=dev, host=host
        )
        self.verify_row = rule
        self.sampling, self.processed = sampling, sampling.changes_logits
        # p for kk drafts is written into probs[kk] (no allocation per iteration), in the
        # dtype the processed logits take (filters compute in float32).
        if self.processed:
            dtype = sampling.logits(torch.zeros(1, V, dtype=dtype, device=dev)).dtype
        probs = torch.empty(k + 1, V, dtype=dtype, device=dev)
        self.probs = [probs[: j + 1] for j in range(k + 1)]
        # The token rule reads p and q through NumPy views on a CPU: p's are made once here;
        # q's is remade only when the proposer returns another tensor (the n-gram draft
        # returns views of one buffer, the draft model a new softmax each time).
        numpy = host and rule is not block_verify_row  # the block rule reads tensors
        self.probs_h = [t.numpy() for t in self.probs] if numpy else None
        self.q_last = self.q_h = None
        xs = drafts.numpy() if numpy else drafts
        self.xs = [xs[:j] for j in range(k + 1)]  # the drafts of each kk
        self.it = 0

    def __call__(self, kk: int, q, logits: torch.Tensor) -> tuple[int, int]:
        p = self.sampling.logits(logits) if self.processed else logits
        p = torch.softmax(p, -1, out=self.probs[kk])
        if self.probs_h is not None:
            p = self.probs_h[kk]
            if q is not None and q is not self.q_last:
                self.q_last, self.q_h = q, q.numpy()
            q = None if q is None else self.q_h
        new, a = self.verify_row(self.xs[kk], q, p, self.U[self.it], self.R.row())
        self.it += 1
        return a, new[a]


def row_verifier(
    rule,
    sampling: SamplingOptions,
    target,
    drafts: torch.Tensor,
    max_new_tokens: int,
    generator: torch.Generator | None,
):
    """The verifier for a run of ``target`` whose drafts are written into ``drafts``
    (``[k]``): greedy at temperature 0, else ``rule`` (the token rule
    ``verifier.rejection_sample_row`` or the block rule ``block_verifier.block_verify_row``)
    with its random numbers drawn now (see the module docstring)."""
    if sampling.greedy:
        return GreedyVerifier(drafts)
    dtype, V = target.lm_head.weight.dtype, target.config.vocab_size
    return SampledVerifier(rule, sampling, drafts, max_new_tokens, generator, dtype, V)
