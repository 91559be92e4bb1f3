"""Hydra heads: Medusa heads that also read the tokens drafted before them.

Hydra (Ankner et al. 2024, "Hydra: Sequentially-Dependent Draft Heads for Medusa Decoding",
arXiv:2402.05109) makes head ``d`` read, beside the target's hidden state ``h_t``, the tokens
on the path before its own: the pending token ``x(t+1)`` (the tree's root, already sampled
from the target) and the guesses ``x(t+2) .. x(t+d)`` above it. A Medusa head cannot know the
pending token; on this character model the target's own top guess holds only 0.56 of the
probability on average, so that is most of what a head has to guess.

Head ``d`` (``d = 1 .. K``) is a one-hidden-layer MLP on ``(h_t, x(t+1) .. x(t+d))`` with a
residual path through a copy of the target's ``lm_head``::

    a_d = W_d h_t + b_d + sum_{j=1..d} E_{d,j}[x(t+j)]      (E: token tables [V, H])
    logits_d = L_d h_t + P_d SiLU(a_d)                       (L_d starts as lm_head, P_d as 0)

so a fresh head is the base head, and a token's contribution to the hidden layer is one
table row (no embedding product at run time). It is trained on the frozen target by
self-distillation: the label of head ``d`` at ``t`` is the target's own distribution at
``t + d`` (``softmax(lm_head(h(t+d)))``), on teacher-forced corpus windows, with the loss
``sum_d 0.8^d (KL(p_target || q_d) + w TV(p_target, q_d))``. The TV term is what a sampled
draft is paid in: a token sampled from ``q`` is accepted with probability ``sum min(p, q)
= 1 - TV(p, q)``; the KL term keeps a gradient where ``q`` has no mass yet. The shipped
heads take ``w = 5`` and 512 hidden units (``training.HYDRA_TV_WEIGHT``, ``HYDRA_HIDDEN``).

Because a head's guesses now depend on the path above them, a tree's tokens are guessed
depth by depth, every parent of a depth in one batch (``generate``'s guesser does that);
everything after the guesses (the tree pass, the walk, the cache) is Medusa's.
"""

from __future__ import annotations

import time

import torch
import torch.nn as nn
from torch.nn import functional as F

from .._validate import check_int
from ..model import CharGPT, check_model
from .heads import DEFAULT_HEADS, LOSS_DECAY, loss_weights

DEFAULT_HIDDEN = 128


def _offset(d: int) -> int:
    # Index of head d's (0-based) first token table in the packed tables: 0, 1, 3, 6, ...
    return d * (d + 1) // 2


class HydraHeads(nn.Module):
    """``n_heads`` sequentially dependent heads; head ``d`` reads ``h_t`` and ``d`` tokens.

    ``forward(h [B, C], tokens [B, K])`` returns logits ``[K, B, V]``: ``tokens[:, 0]`` is the
    pending token ``x(t+1)``, ``tokens[:, j]`` the token at ``t + 1 + j``; head ``d``
    (1-based) reads ``tokens[:, :d]`` and predicts ``x(t+1+d)``. Parameters: ``W [K, H, C]``,
    ``b [K, H]``, the token tables ``E [K(K+1)/2, V, H]`` (head ``d``'s ``d`` tables from
    ``_offset(d-1)``), ``P [K, V, H]`` and ``L [K, V, C]``. :meth:`from_target` copies the
    target's ``lm_head`` into every ``L`` with ``P = 0`` (a fresh head is the base head) and
    draws ``W`` and ``E`` small and random (with all three zero no gradient would flow).
    """

    kind = "hydra"

    def __init__(
        self, n_embd: int, vocab_size: int, n_heads: int = DEFAULT_HEADS, hidden=DEFAULT_HIDDEN
    ):
        super().__init__()
        for name, v in (
            ("n_embd", n_embd),
            ("vocab_size", vocab_size),
            ("n_heads", n_heads),
            ("hidden", hidden),
        ):
            check_int(v, name)
        K, C, V, H = n_heads, n_embd, vocab_size, hidden
        self.n_embd, self.vocab_size, self.hidden = C, V, H
        self.W = nn.Parameter(torch.zeros(K, H, C))
        self.b = nn.Parameter(torch.zeros(K, H))
        self.E = nn.Parameter(torch.zeros(_offset(K), V, H))
        self.P = nn.Parameter(torch.zeros(K, V, H))
        self.L = nn.Parameter(torch.zeros(K, V, C))

    @property
    def n_heads(self) -> int:
        return self.W.shape[0]

    @classmethod
    def from_target(
        cls, target: CharGPT, n_heads: int = DEFAULT_HEADS, hidden: int = DEFAULT_HIDDEN, seed=0
    ) -> HydraHeads:
        """Fresh heads for ``target`` (see the class docstring); ``seed`` draws ``W`` and ``E``."""
        check_model(target, "target")
        cfg = target.config
        heads = cls(cfg.n_embd, cfg.vocab_size, n_heads, hidden)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            heads.W.copy_(torch.randn(heads.W.shape, generator=g) / cfg.n_embd**0.5)
            heads.E.copy_(torch.randn(heads.E.shape, generator=g))
            heads.L.copy_(target.lm_head.weight.detach().cpu().expand_as(heads.L))
        return heads.to(target.lm_head.weight.device)

    def pre_activations(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``a [K, B, H]``: every head's hidden layer before the SiLU."""
        a = torch.einsum("bc,khc->kbh", h, self.W) + self.b[:, None]
        rows = []
        for d in range(self.n_heads):
            o = _offset(d)
            rows.append(a[d] + sum(self.E[o + j][tokens[:, j]] for j in range(d + 1)))
        return torch.stack(rows)

    def forward(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        if not isinstance(h, torch.Tensor) or h.dim() != 2 or h.shape[-1] != self.n_embd:
            got = tuple(h.shape) if isinstance(h, torch.Tensor) else type(h).__name__
            raise ValueError(f"h must be a tensor [B, n_embd={self.n_embd}]; got {got}")
        K = self.n_heads
        if (
            not isinstance(tokens, torch.Tensor)
            or tokens.dtype != torch.long
            or tokens.shape != (h.shape[0], K)
        ):
            raise ValueError(f"tokens must be int64 [B={h.shape[0]}, n_heads={K}]")
        z = F.silu(self.pre_activations(h, tokens))
        return torch.einsum("bc,kvc->kbv", h, self.L) + torch.einsum("kbh,kvh->kbv", z, self.P)

    def host_weights(self) -> dict:
        """The weights as NumPy arrays for the decoding loop's guesser (detached copies).

        ``M [K(H+V), C]`` and ``m``: every head's ``W_d h + b_d`` and ``L_d h`` in one product;
        ``E``, ``P`` as they are. Cached until a parameter changes."""
        key = tuple(p._version for p in self.parameters()) + tuple(
            p.data_ptr() for p in self.parameters()
        )
        cached = getattr(self, "_host_cache", None)
        if cached is None or cached[0] != key:
            K, C, V, H = self.n_heads, self.n_embd, self.vocab_size, self.hidden
            with torch.no_grad():
                M = torch.cat([self.W.reshape(K * H, C), self.L.reshape(K * V, C)])
                m = torch.cat([self.b.reshape(K * H), self.b.new_zeros(K * V)])
                w = {
                    "M": M.detach().cpu().numpy().copy(),
                    "m": m.detach().cpu().numpy().copy(),
                    "E": self.E.detach().cpu().numpy().copy(),
                    "P": self.P.detach().cpu().numpy().copy(),
                }
            cached = (key, w)
            self._host_cache = cached
        return cached[1]


def hydra_loss(
    logits: torch.Tensor, teacher: torch.Tensor, decay: float = LOSS_DECAY, tv_weight: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum_d decay^d (KL(teacher_d || q_d) + tv_weight * TV(teacher_d, q_d))``, ``q_d =
    softmax(logits_d)``, and the per-head KL ``[K]``.

    ``logits [K, B, V]`` (from ``HydraHeads``), ``teacher [K, B, V]`` the target's logits at
    the positions the heads predict. ``TV = 1 - sum min(p, q)`` is one minus the acceptance
    of a token sampled from the head: the shipped heads weight it 5 to KL's 1
    (``training.HYDRA_TV_WEIGHT``; KL keeps a gradient where ``q`` has no mass yet). Raises
    ValueError for mismatched shapes."""
    if logits.shape != teacher.shape or logits.dim() != 3:
        raise ValueError(
            f"logits and teacher must both be [K, B, V]; got {tuple(logits.shape)} and "
            f"{tuple(teacher.shape)}"
        )
    logp = F.log_softmax(teacher, -1)
    logq = F.log_softmax(logits, -1)
    p = logp.exp()
    kl = (p * (logp - logq)).sum(-1).mean(-1)  # [K]
    w = loss_weights(logits.shape[0], decay).to(kl)
    if not tv_weight:
        return (w * kl).sum(), kl
    tv = 1.0 - torch.minimum(p, logq.exp()).sum(-1).mean(-1)
    return (w * (kl + tv_weight * tv)).sum(), kl


def _batch(h, x, w, t, K, lm_head):
    # Inputs and teacher logits for positions (w, t): h_t, tokens x(t+1 .. t+K), and the
    # target's logits at t+1 .. t+K (head d's label is the distribution at t + d).
    offs = torch.arange(1, K + 1)
    tok = x[w[:, None], t[:, None] + offs]  # [B, K]
    teacher = lm_head(h[w[:, None], t[:, None] + offs]).transpose(0, 1)  # [K, B, V]
    return h[w, t], tok, teacher


def train_hydra(
    target: CharGPT,
    hidden_states: tuple[torch.Tensor, torch.Tensor],
    *,
    n_heads: int = DEFAULT_HEADS,
    hidden: int = DEFAULT_HIDDEN,
    steps: int = 6000,
    batch_size: int = 2048,
    lr: float = 2e-3,
    seed: int = 0,
    progress: bool = True,
    log_every: int = 0,
    tv_weight: float = 0.0,
) -> tuple[HydraHeads, dict, float]:
    """Train Hydra heads on the frozen ``target`` by self-distillation.

    ``hidden_states``: ``collect_hidden``'s ``(h [N, T, C], x [N, T])``. Each step samples
    ``batch_size`` positions and minimises :func:`hydra_loss` against the target's own
    distributions, AdamW with warm-up and cosine decay. ``log_every`` > 0 prints the loss
    that often (for logs of background runs). Returns ``(heads in eval mode, history,
    seconds)``. Same seed and thread count, same heads.
    """
    from tqdm import tqdm

    from ..train import TrainConfig, lr_at

    check_model(target, "target")
    for name, v in (("steps", steps), ("batch_size", batch_size)):
        check_int(v, name)
    t0 = time.perf_counter()
    h, x = (t.clone() for t in hidden_states)  # out of inference mode
    N, T, _ = h.shape
    span = T - n_heads
    if span < 1:
        raise ValueError(f"windows of {T} tokens are too short for {n_heads} heads")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    heads = HydraHeads.from_target(target, n_heads, hidden, seed)
    heads.train()
    lm_w = target.lm_head.weight.detach().clone()
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    tc = TrainConfig(steps=steps, lr=lr, min_lr=lr / 20, warmup=min(200, steps // 10))
    hist: dict = {"step": [], "loss": [], "kl": []}
    bar = tqdm(range(steps), desc="hydra heads", disable=not progress, mininterval=5.0, ncols=90)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, tc)
        w = torch.randint(N, (batch_size,), generator=gen)
        t = torch.randint(span, (batch_size,), generator=gen)
        hb, tok, teacher = _batch(h, x, w, t, n_heads, lambda v: v @ lm_w.t())
        loss, kl = hydra_loss(heads(hb, tok), teacher, tv_weight=tv_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == steps - 1:
            hist["step"].append(step)
            hist["loss"].append(loss.item())
            hist["kl"].append(kl.detach().tolist())
        if log_every and step % log_every == 0:
            print(
                f"step {step} loss {loss.item():.4f} kl {[round(v, 4) for v in kl.tolist()]}"
                f" {time.perf_counter() - t0:.0f}s",
                flush=True,
            )
    bar.close()
    heads.eval()
    return heads, hist, time.perf_counter() - t0


@torch.inference_mode()
def hydra_acceptance(
    target: CharGPT,
    heads: HydraHeads,
    hidden_states: tuple[torch.Tensor, torch.Tensor],
    *,
    ranks: int = 8,
) -> dict:
    """Measured acceptance of each head on teacher-forced windows (``collect_hidden``'s).

    Returns ``{"greedy": [K, R], "sampled": [K, R], "alpha": [K]}``: ``greedy[d, r]`` is how
    often head ``d + 1``'s rank-``r`` guess is the target's argmax (a child's chance to be
    followed at temperature 0), ``sampled[d, r]`` the target's mean probability of that guess
    (its chance to be the accepted child at temperature 1: the one-hot walk accepts child
    ``c`` with probability exactly ``p(c)``), and ``alpha[d] = E sum min(p, q_d)``, the
    acceptance of a token sampled from the head (temperature 1). The inputs of
    ``greedy_tree`` and of the sampled chain's depth."""
    h, x = hidden_states
    N, T, _ = h.shape
    K = heads.n_heads
    t = torch.arange(T - K).repeat(N)
    w = torch.arange(N).repeat_interleave(T - K)
    hb, tok, teacher = _batch(h, x, w, t, K, target.lm_head)
    q = heads(hb, tok).softmax(-1)  # [K, B, V]
    p = teacher.softmax(-1)
    order = q.topk(ranks, -1).indices  # [K, B, R]
    greedy = (order == p.argmax(-1, keepdim=True)).double().mean(1)
    sampled = p.gather(-1, order).double().mean(1)
    alpha = torch.minimum(p, q).sum(-1).double().mean(1)
    return {"greedy": greedy, "sampled": sampled, "alpha": alpha}
