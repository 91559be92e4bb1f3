"""What every sampling draft shares: its Gumbel noise, drawn in blocks, and a NumPy softmax.

A draft samples each token by Gumbel-max over its processed logits (``argmax(logits + G)``
is a draw from ``softmax(logits)``) and reports ``q`` as the softmax of the same logits; the
draft model (``drafts.model_draft``) and the EAGLE-style drafts (``drafts.eagle``) take the
noise from ``draft_noise`` and, on a CPU, their ``q`` from ``softmax_rows``.
"""

from __future__ import annotations

import numpy as np

from ..sampling import NoiseBlocks

__all__ = ["draft_noise", "softmax_rows"]


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
