"""What lesson 11 shows about the real model that is not decoding itself.

- :func:`gguf_summary`: the GGUF file's size, its tensor types and bits per weight (the
  numbers the float32 model is dequantised from).
- :func:`find_greedy_mismatch`: search prompts for one on which greedy speculative text leaves
  greedy plain text (it happens in bfloat16, whose products are not batch invariant enough to
  keep a near-tie's order; lesson 11, section 4), and say where.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from ..decoding import generate, speculative_generate
from .gguf_load import gguf_path

__all__ = ["GreedyMismatch", "find_greedy_mismatch", "gguf_summary"]


def gguf_summary(path=None) -> dict:
    """``{"mb", "types", "weights", "bits_per_weight"}`` of the GGUF file (default: the one
    ``llm.load`` reads): its size in MB, its tensor types by weight count (most first), the
    number of weights, and the file's bits per weight on average."""
    from gguf import GGUFReader

    path = gguf_path() if path is None else path
    by_type: Counter = Counter()
    for t in GGUFReader(path).tensors:
        by_type[t.tensor_type.name] += int(t.n_elements)
    size = path.stat().st_size
    n = sum(by_type.values())
    return {
        "mb": size / 1e6,
        "types": [name for name, _ in by_type.most_common()],
        "weights": n,
        "bits_per_weight": size * 8 / n,
    }


@dataclass
class GreedyMismatch:
    """Where greedy speculative decoding first left greedy plain decoding."""

    prompt: str
    proposer: str
    k: int
    max_new_tokens: int
    position: int  # index among the new tokens of the first differing token
    agreed: str  # the new text both gave before it
    plain: str  # the plain token there
    speculative: str  # the speculative token there
    tried: int  # runs tried, this one included

    def __str__(self) -> str:
        return (
            f"run {self.tried}: {self.proposer}, k = {self.k}, on the prompt {self.prompt!r}\n"
            f"both wrote {self.agreed!r}, then plain decoding wrote {self.plain!r} and "
            f"speculative decoding {self.speculative!r} (new token {self.position})"
        )


@torch.inference_mode()
def find_greedy_mismatch(model, proposers: dict, tok, prompts, *, max_new_tokens: int = 32,
                         k: int = 4) -> GreedyMismatch | None:  # fmt: skip
    """The first (prompt, proposer) in order whose greedy speculative ids differ from greedy
    plain ids on ``model``, or None if every run agreed. ``prompts`` are user messages (the
    chat template is applied); ``proposers`` is ``{name: proposer}`` built for ``model``."""
    tried = 0
    for prompt in prompts:
        ids = torch.tensor(tok.apply_chat_template([{"role": "user", "content": prompt}]))
        plain = generate(model, ids, max_new_tokens, temperature=0)
        for name, proposer in proposers.items():
            tried += 1
            spec, _ = speculative_generate(model, proposer, ids, max_new_tokens, k=k,
                                           temperature=0)  # fmt: skip
            if not torch.equal(plain, spec):
                at = int((plain != spec).nonzero()[0])
                n = ids.numel()
                return GreedyMismatch(
                    prompt, name, k, max_new_tokens, at - n, tok.decode(plain[n:at].tolist()),
                    tok.decode([int(plain[at])]), tok.decode([int(spec[at])]), tried,
                )  # fmt: skip
    return None
