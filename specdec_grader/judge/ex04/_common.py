"""What the three checks of exercise 04 share: the two models, token helpers, a verifier row."""

from __future__ import annotations

import torch

from specdec_course.model import CharGPT, GPTConfig
from specdec_course.verifier import RejectionResult

from .._support import random_model
from ..context import case_seed

ATOL = 1e-5
TARGET_CFG = GPTConfig(vocab_size=17, block_size=64, n_layer=2, n_head=2, n_embd=16)
DRAFT_CFG = GPTConfig(vocab_size=17, block_size=64, n_layer=1, n_head=2, n_embd=16)
V = TARGET_CFG.vocab_size


_MODELS: dict[tuple[int, int], tuple[CharGPT, CharGPT]] = {}


def _models() -> tuple[CharGPT, CharGPT]:
    key = (case_seed(0), case_seed(1))
    if key not in _MODELS:
        # Larger weights than at initialisation: far from uniform outputs. Frozen: student
        # code may call the models outside no_grad.
        _MODELS.clear()
        _MODELS[key] = (
            random_model(TARGET_CFG, key[0], 4.0, frozen=True),
            random_model(DRAFT_CFG, key[1], 4.0, frozen=True),
        )
    return _MODELS[key]


def _noisy_copy(model: CharGPT, seed: int, noise: float) -> CharGPT:
    """A draft that agrees with ``model`` often but not always (for the greedy case)."""
    g = torch.Generator().manual_seed(case_seed(seed))
    d = CharGPT(model.config).eval()
    d.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in d.parameters():
            p.add_(noise * p.abs().mean() * torch.randn(p.shape, generator=g))
    d.requires_grad_(False)
    return d


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(case_seed(seed)))


def _fed(model: CharGPT, ids: torch.Tensor):
    """A fresh cache that holds ``ids`` (fed in one call)."""
    cache = model.new_cache(1)
    if ids.numel():
        with torch.no_grad():
            model(ids[None], cache)
    return cache


def _next_logits(model: CharGPT, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids[None])[0, -1]


def _as_ids(x) -> torch.Tensor | None:
    try:
        t = torch.as_tensor(x)
    except Exception:  # noqa: BLE001 - not a sequence of ids
        return None
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1 or t.is_floating_point() or t.is_complex():
        return None
    return t.detach().to("cpu", torch.long)


def _text(ids: torch.Tensor) -> str:
    return "[" + " ".join(str(int(i)) for i in ids) + "]"


def _verifier_row(drafts: torch.Tensor, a: int, p: torch.Tensor) -> RejectionResult:
    """What the verifier returns for ``a`` accepted drafts (B = 1): accepted + new token.

    After a rejection the new token is the target's favourite other than the rejected draft
    (so it always differs from it); after full acceptance the bonus is ``argmax p[k]``.
    """
    k = drafts.numel()
    row = torch.full((1, k + 1), -1, dtype=torch.long)
    row[0, :a] = drafts[:a]
    if a < k:
        w = p[a].clone()
        w[int(drafts[a])] = -1.0
        row[0, a] = int(w.argmax())
    else:
        row[0, a] = int(p[k].argmax())
    return RejectionResult(row, torch.tensor([a]))
