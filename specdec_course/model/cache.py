"""The preallocated key/value cache: rollback is a pointer move."""

from __future__ import annotations

import torch

from .._validate import check_int
from .config import GPTConfig


class KVCache:
    """Preallocated keys and values for every layer, plus how many positions are filled.

    Invariant: after ``crop(n)`` the cache holds exactly the first ``n`` positions; a later
    forward overwrites positions ``n, n+1, ...`` in place. Rollback therefore copies nothing.

    ``k`` and ``v`` have shape ``[n_layer, batch_size, n_head, block_size, head_dim]``;
    ``length`` is the number of positions filled (the same for every row of the batch).
    """

    def __init__(
        self,
        config: GPTConfig,
        batch_size: int = 1,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ):
        if not isinstance(config, GPTConfig):
            raise ValueError(f"config must be a GPTConfig; got {type(config).__name__}")
        check_int(batch_size, "batch_size")
        shape = (config.n_layer, batch_size, config.n_head, config.block_size, config.head_dim)
        self.config = config
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions (``0 <= n <= length``); raises ValueError otherwise."""
        # The message names cache.length and n in this form: grading.ex04 reads them back
        # to explain an off-by-one in a student's rollback.
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.length:
            raise ValueError(
                f"crop(n) needs an int 0 <= n <= cache.length ({self.length}); got {n!r}"
            )
        self.length = n

    def reset(self) -> None:
        """Empty the cache (same as ``crop(0)``)."""
        self.length = 0

    def __repr__(self) -> str:
        return (
            f"KVCache(length={self.length}, capacity={self.capacity}, "
            f"batch_size={self.batch_size}, n_layer={self.k.shape[0]})"
        )
