"""The checks of ``CharGPT.forward``'s inputs: ids, cache, positions and mask, each with a
ValueError that says what to do. The model's own code is the arithmetic."""

from __future__ import annotations

import torch

from .._validate import check_int, check_token_batch
from ..devices import check_same_device

__all__ = ["check_forward", "check_generate", "check_model"]


def check_forward(model, idx, cache=None, attn_mask=None, position_ids=None) -> torch.Tensor:
    """Check ``model.forward(idx, cache, attn_mask=..., position_ids=...)``'s arguments and
    return the positions ``[T]`` (or ``position_ids``) the new tokens take."""
    B, T = check_token_batch(idx)
    cfg, w = model.config, model.lm_head.weight
    if idx.device != w.device:
        check_same_device("idx", idx.device, "the model", w.device)
    if cache is not None and cache.k.device != w.device:
        check_same_device("the cache", cache.k.device, "the model", w.device)
    V = cfg.vocab_size
    if idx.min() < 0 or idx.max() >= V:
        raise ValueError(f"idx holds ids outside [0, {V}); encode text with the tokenizer")
    start = 0 if cache is None else cache.length
    if start + T > cfg.block_size:
        raise ValueError(
            f"{start} cached + {T} new tokens exceed the context of "
            f"{cfg.block_size} positions (block_size); positions past it were never "
            "trained. Shorten the prompt or generate fewer tokens."
        )
    if cache is not None and cache.batch_size != B:
        raise ValueError(f"cache has batch size {cache.batch_size} but idx has {B} rows")
    if cache is None and (attn_mask is not None or position_ids is not None):
        raise ValueError("attn_mask and position_ids need a cache (pass cache=model.new_cache())")
    if attn_mask is not None and (
        attn_mask.dtype != torch.bool or tuple(attn_mask.shape) != (T, start + T)
    ):
        raise ValueError(
            f"attn_mask must be bool of shape [T_new, cache.length + T_new] = "
            f"[{T}, {start + T}]; got {tuple(attn_mask.shape)} {attn_mask.dtype}"
        )
    if position_ids is None:
        return torch.arange(start, start + T, device=idx.device)
    pos = position_ids
    if pos.shape[-1] != T or pos.dtype != torch.long:
        raise ValueError(
            f"position_ids must be int64 with last dim T={T}; got {tuple(pos.shape)} {pos.dtype}"
        )
    if pos.min() < 0 or pos.max() >= cfg.block_size:
        raise ValueError(f"position_ids must lie in [0, {cfg.block_size})")
    return pos


def check_generate(model, idx, max_new_tokens: int, temperature: float) -> None:
    """Check ``CharGPT.generate``'s arguments: the result must fit in ``block_size``."""
    check_int(max_new_tokens, "max_new_tokens", minimum=0)
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0; got {temperature!r}")
    check_forward(model, idx, None)
    total = idx.shape[1] + max_new_tokens
    if total > model.config.block_size:
        raise ValueError(
            f"prompt ({idx.shape[1]}) + max_new_tokens ({max_new_tokens}) = {total} exceeds "
            f"block_size {model.config.block_size}; generate fewer tokens"
        )


def check_model(model, name: str = "model"):
    """Return ``model`` if it is a ``CharGPT``, or another decoder whose class declares that it
    has everything the decoding loops read (``course_decoder = True``: ``config.vocab_size``
    and ``block_size``, ``lm_head.weight``, ``new_cache``, ``forward(idx, cache)``,
    ``lean_step``; ``llm.llama.Llama``); else ValueError naming the argument."""
    from .gpt import CharGPT  # the model module imports these checks

    if not isinstance(model, CharGPT) and not getattr(type(model), "course_decoder", False):
        raise ValueError(
            f"{name} must be a CharGPT (e.g. model.load_pretrained('target')); "
            f"got {type(model).__name__}"
        )
    return model
