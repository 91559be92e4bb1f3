"""The shape of a ``CharGPT`` and the two presets: the 4-layer target, the 1-layer draft."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .._validate import check_int


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a ``CharGPT``. ``n_embd`` must be divisible by ``n_head``."""

    vocab_size: int = 65
    block_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 88
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            check_int(getattr(self, name), f"GPTConfig.{name}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1); got {self.dropout!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# Widths chosen to land on the pair's sizes (388K and 108K parameters, tied embeddings, with
# a 65-symbol vocabulary) while keeping 4 heads; the draft is narrower as well as shallower.
TARGET = GPTConfig(n_layer=4, n_head=4, n_embd=88)
DRAFT = GPTConfig(n_layer=1, n_head=4, n_embd=80)
PRESETS = {"target": TARGET, "draft": DRAFT}


def preset(name: str, vocab_size: int | None = None) -> GPTConfig:
    """The preset config ``name`` ("target" or "draft"), optionally with another vocab size."""
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}; got {name!r}")
    cfg = PRESETS[name]
    return cfg if vocab_size is None else replace(cfg, vocab_size=vocab_size)
