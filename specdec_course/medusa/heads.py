"""The Medusa heads: residual blocks on the target's last hidden state, and their loss.

Head ``k`` reads the hidden state at ``t`` and predicts the token at ``t + 1 + k``; a fresh head
is a copy of the target's ``lm_head`` (its residual block starts as the identity). Medusa-1
trains the heads on the frozen target with ``sum_k 0.8^k * CE_k``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn import functional as F

from .._validate import check_int
from ..model import CharGPT, check_model

DEFAULT_HEADS = 3
LOSS_DECAY = 0.8


class ResBlock(nn.Module):
    """``x + SiLU(W x + b)``; ``W`` and ``b`` start at zero, so the block starts as identity."""

    def __init__(self, n_embd: int):
        super().__init__()
        self.linear = nn.Linear(n_embd, n_embd)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHead(nn.Module):
    """One head: ``lm_head(ResBlock(h))``, logits ``[..., vocab_size]`` from ``h [..., n_embd]``."""

    def __init__(self, n_embd: int, vocab_size: int):
        super().__init__()
        self.block = ResBlock(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.block(h))


class MedusaHeads(nn.Module):
    """``n_heads`` independent Medusa heads; head ``k`` (1-based) predicts ``t + 1 + k``.

    ``MedusaHeads(n_embd, vocab_size, n_heads=3)`` makes heads with zero residual blocks and
    random output layers; :meth:`from_target` copies the target's ``lm_head`` into every head
    (a separate copy each: the heads share no parameters). ``forward(h)`` takes hidden states
    ``[..., n_embd]`` and returns logits ``[n_heads, ..., vocab_size]``.
    """

    def __init__(self, n_embd: int, vocab_size: int, n_heads: int = DEFAULT_HEADS):
        super().__init__()
        for name, v in (("n_embd", n_embd), ("vocab_size", vocab_size), ("n_heads", n_heads)):
            check_int(v, name)
        self.n_embd, self.vocab_size = n_embd, vocab_size
        self.heads = nn.ModuleList(MedusaHead(n_embd, vocab_size) for _ in range(n_heads))

    @property
    def n_heads(self) -> int:
        return len(self.heads)

    @classmethod
    def from_target(cls, target: CharGPT, n_heads: int = DEFAULT_HEADS) -> MedusaHeads:
        """Heads for ``target``: each output layer a copy of ``target.lm_head`` (Medusa init)."""
        check_model(target, "target")
        heads = cls(target.config.n_embd, target.config.vocab_size, n_heads)
        w = target.lm_head.weight.detach()
        with torch.no_grad():
            for head in heads.heads:
                head.lm_head.weight.copy_(w)  # copy_, not assignment: no tied weights
        return heads.to(w.device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if not isinstance(h, torch.Tensor) or h.shape[-1] != self.n_embd:
            got = tuple(h.shape) if isinstance(h, torch.Tensor) else type(h).__name__
            raise ValueError(f"h must be a tensor [..., n_embd={self.n_embd}]; got {got}")
        return torch.stack([head(h) for head in self.heads])

    def _fused(self, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first ``k`` heads as three matrices for two matrix-vector products.

        ``head_j(h) = L_j h + L_j SiLU(W_j h + b_j)``, so with ``M = [W_1; ..; W_k; L_1; ..;
        L_k]`` (``[kC + kV, C]``), ``m = [b; 0]`` and the block-diagonal ``D = diag(L_j)``,
        ``u = M h + m`` and ``logits = u[kC:] + D SiLU(u[:kC])``: every head in three ops.
        Returns ``(M, m, D)``, kept until a parameter changes (their version counters), so
        that short generations do not pay for rebuilding them on every call.
        """
        key = (
            k,
            tuple(p._version for p in self.parameters()),
            tuple(p.data_ptr() for p in self.parameters()),
        )
        cached = getattr(self, "_fused_cache", None)
        if cached is None or cached[0] != key:
            W, b, L = (t[:k] for t in self.stacked())
            C, V = self.n_embd, self.vocab_size
            M = torch.cat([W.reshape(k * C, C), L.reshape(k * V, C)])
            m = torch.cat([b.reshape(k * C), b.new_zeros(k * V)])
            cached = (key, (M, m, torch.block_diag(*L)))
            self._fused_cache = cached
        return cached[1]

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Weights stacked over heads ``(W [K, C, C], b [K, C], L [K, V, C])`` for fast inference.

        Applying every head to one hidden state is then three batched ops, not ``3 K``.
        """
        W = torch.stack([hd.block.linear.weight for hd in self.heads]).detach()
        b = torch.stack([hd.block.linear.bias for hd in self.heads]).detach()
        L = torch.stack([hd.lm_head.weight for hd in self.heads]).detach()
        return W, b, L


def check_heads(heads) -> MedusaHeads:
    """Return ``heads`` if it is a ``MedusaHeads``; else ValueError naming what it was."""
    if not isinstance(heads, MedusaHeads):
        raise ValueError(
            f"heads must be a MedusaHeads (e.g. medusa.load_heads()); got {type(heads).__name__}"
        )
    return heads


def loss_weights(n_heads: int, decay: float = LOSS_DECAY) -> torch.Tensor:
    """``[decay^1, decay^2, ..., decay^K]``: the weight of head ``k``'s cross-entropy.

    Later heads guess further ahead and are wrong more often; smaller weights keep them from
    dominating the gradient (Medusa's ``lambda_k = 0.8^k``).
    """
    check_int(n_heads, "n_heads")
    if not 0 < decay <= 1:
        raise ValueError(f"decay must be in (0, 1]; got {decay!r}")
    return torch.tensor([decay**k for k in range(1, n_heads + 1)])


def head_targets(ids: torch.Tensor, n_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and labels for training heads on windows ``ids [B, T]``.

    Returns ``(targets [K, B, T], valid [K, B, T] bool)``: head ``k`` at position ``t`` must
    predict ``ids[:, t + 1 + k]``; positions whose label lies past the window are invalid.
    """
    B, T = ids.shape
    targets = torch.zeros(n_heads, B, T, dtype=torch.long, device=ids.device)
    valid = torch.zeros(n_heads, B, T, dtype=torch.bool, device=ids.device)
    for k in range(1, n_heads + 1):
        s = 1 + k
        if s < T:
            targets[k - 1, :, : T - s] = ids[:, s:]
            valid[k - 1, :, : T - s] = True
    return targets, valid


def medusa_loss(
    head_logits: torch.Tensor,
    targets: torch.Tensor,
    valid: torch.Tensor | None = None,
    decay: float = LOSS_DECAY,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Medusa-1 loss ``sum_k decay^k * CE_k`` and the per-head cross-entropies.

    ``head_logits [K, ..., V]`` (from ``MedusaHeads``), ``targets [K, ...]`` int64 labels,
    ``valid [K, ...]`` bool (default all valid): ``CE_k`` is the mean cross-entropy of head
    ``k`` over its valid positions. Returns ``(loss scalar, ce [K])``. Raises ValueError for
    mismatched shapes.
    """
    if head_logits.dim() < 2 or targets.shape != head_logits.shape[:-1]:
        raise ValueError(
            f"targets must have head_logits' shape without the vocabulary axis; got logits "
            f"{tuple(head_logits.shape)} and targets {tuple(targets.shape)}"
        )
    K, V = head_logits.shape[0], head_logits.shape[-1]
    lg, tg = head_logits.reshape(K, -1, V), targets.reshape(K, -1)
    ce_all = F.cross_entropy(lg.transpose(1, 2), tg, reduction="none")  # [K, N]
    if valid is None:
        ce = ce_all.mean(1)
    else:
        if valid.shape != targets.shape:
            raise ValueError("valid must have the shape of targets")
        m = valid.reshape(K, -1).to(ce_all.dtype)
        ce = (ce_all * m).sum(1) / m.sum(1).clamp_min(1)
    w = loss_weights(K, decay).to(ce)
    return (w * ce).sum(), ce
