"""A character-level GPT with a preallocated key/value cache.

The model follows nanoGPT (Karpathy, github.com/karpathy/nanoGPT), itself the GPT-2 design
(Radford et al. 2019) on the transformer of Vaswani et al. 2017: pre-norm blocks, learned
position embeddings, GELU MLP, and an output layer tied to the token embedding.

The cache is what speculative decoding needs (Leviathan et al. 2023): feed one or several
new tokens at a time, and roll back the rejected ones by moving a pointer. ``KVCache`` holds
preallocated buffers ``[n_layer, B, n_head, block_size, head_dim]`` for keys and values and
an integer ``length``; a cached forward writes the new keys/values in place at
``length .. length + T_new`` and attends over ``0 .. length + T_new``.

Presets: ``TARGET`` (4 layers) and ``DRAFT`` (1 layer) share the vocabulary and a context of
256 characters. ``load_pretrained("target" | "draft")`` loads the shipped checkpoints.
The model holds no state derived from its weights: the decoding loops' fast steps are built
from it by ``specdec_course.fast``.
"""

from __future__ import annotations

from .cache import KVCache
from .checkpoints import load_checkpoint, load_pretrained, rebuild_command, save_checkpoint
from .checks import check_model
from .config import DRAFT, PRESETS, TARGET, GPTConfig, preset
from .gpt import CharGPT

__all__ = [
    "GPTConfig",
    "CharGPT",
    "KVCache",
    "TARGET",
    "DRAFT",
    "PRESETS",
    "save_checkpoint",
    "load_checkpoint",
    "load_pretrained",
    "rebuild_command",
    "preset",
    "check_model",
]
