"""A batch whose rows hold different lengths: one KV cache, a length per row, a mask.

Batched speculative decoding accepts a different number of drafts in every row, so after one
iteration row 0 may hold 40 committed tokens and row 1 only 37. ``KVCache`` has one length for
the whole batch; ``RaggedCache`` keeps a length per row over the same preallocated buffers.
Row ``b``'s new tokens take positions ``lengths[b], lengths[b] + 1, ...``: their keys and
values are written at those slots of the row (``CharGPT.decode_hidden(..., slots=...)``),
their position embeddings are those positions, and a mask lets each new token see exactly
the slots ``0 .. its own position`` of its row. Slots past a row's length hold whatever a
rejected draft left there; the mask hides them and the next call overwrites them (as in
gpt-fast, where rollback costs nothing). Invariant: after ``crop(lengths)`` row ``b`` holds
exactly its first ``lengths[b]`` positions.
"""

from __future__ import annotations

import torch

from .gpt import CharGPT, check_model

__all__ = ["RaggedCache", "ragged_forward"]


class RaggedCache:
    """A ``KVCache`` for ``batch_size`` rows with a length per row (int64 ``lengths [B]``)."""

    def __init__(self, model: CharGPT, batch_size: int):
        check_model(model)
        self.kv = model.new_cache(batch_size)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.kv.k.device)

    @property
    def batch_size(self) -> int:
        return self.kv.batch_size

    def crop(self, lengths: torch.Tensor) -> None:
        """Keep row ``b``'s first ``lengths[b]`` positions (each at most its current length).

        Raises ValueError for another shape or a length beyond the row's."""
        lengths = torch.as_tensor(lengths, dtype=torch.long, device=self.lengths.device)
        if lengths.shape != self.lengths.shape or bool(
            ((lengths < 0) | (lengths > self.lengths)).any()
        ):
            raise ValueError(
                f"crop needs one length per row, 0 <= lengths[b] <= the row's length "
                f"({self.lengths.tolist()}); got {lengths.tolist()}"
            )
        self.lengths = lengths

    def __repr__(self) -> str:
        return f"RaggedCache(lengths={self.lengths.tolist()}, capacity={self.kv.capacity})"


def ragged_forward(model: CharGPT, idx: torch.Tensor, cache: RaggedCache) -> torch.Tensor:
    """Hidden states ``[B, T, n_embd]`` of ``T`` new tokens per row, after each row's cache.

    ``idx`` int64 ``[B, T]``: row ``b``'s tokens take positions ``lengths[b] .. lengths[b] +
    T - 1``; every row's length grows by ``T``. Unchecked (a decoding loop's fast path): the
    caller makes sure ``max(lengths) + T <= block_size`` and the ids are in the vocabulary.
    Multiply by ``model.lm_head.weight`` for logits.
    """
    B, T = idx.shape
    lengths = cache.lengths
    slots = lengths[:, None] + torch.arange(T, device=idx.device)  # [B, T]: positions
    span = int(lengths.max()) + T
    # Token t of row b sees its row's slots 0 .. lengths[b] + t (its past and itself).
    mask = torch.arange(span, device=idx.device) <= slots[:, :, None]  # [B, T, span]
    cache.kv.length = span - T  # decode_hidden attends over 0 .. length + T
    h = model.decode_hidden(idx, cache.kv, slots, mask[:, None], slots=slots)
    cache.lengths = lengths + T
    return h
