"""The heads' side of an iteration: a tree's guessed tokens, or a chain of sampled drafts.

Two ways to fill the tree's nodes from the last hidden state ``h``:

- ``top`` (every temperature): node ``(r1, .., rd)`` holds head ``d``'s rank-``rd`` guess.
  Medusa heads guess every depth at once (their guesses ignore the path); Hydra heads guess
  depth by depth, each depth's parents in one batch, reading the root and the path's tokens.
- ``sample`` (temperature > 0, chain trees): node ``d`` holds a token *sampled* from head
  ``d``'s distribution ``q_d`` (temperature applied), given the path above it; the walk
  (:func:`sampled_chain_walk`) then verifies the chain by the speculative sampling rule
  (accept ``x`` with probability ``min(1, p(x) / q(x))``, else sample ``norm(max(p - q, 0))``),
  which is exact for any ``q``. A sampled token is accepted with probability
  ``sum min(p, q)``, a top-1 guess only with ``p(guess)``: on this character model the
  target's top token holds 0.56 of the mass on average, a well-trained ``q`` far more of it.

Hydra heads run in NumPy on a CPU (the heads are the draft's side: a draft may run on
anything, as the one-layer draft's NumPy step does); the target's tree pass stays the same
tensor step plain decoding uses.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np
import torch
from torch.nn import functional as F

from .heads import MedusaHeads
from .hydra import HydraHeads, _offset
from .tree import TreeBuffers

DRAFTS = ("top", "sample")


def is_chain(tb: TreeBuffers) -> bool:
    """True when the tree is a chain of top-1 guesses ``(0,), (0, 0), ...``."""
    return all(p == (0,) * len(p) for p in tb.paths) and len(tb.paths) == tb.max_depth


def medusa_top(heads: MedusaHeads, tb: TreeBuffers) -> Callable:
    """``guess(h, root) -> tokens of nodes 1 .. N`` (int64 tensor) for Medusa heads.

    Only the heads the tree reaches run, fused into two matrix-vector products (see
    ``MedusaHeads._fused``); the root is not read (a Medusa head cannot see it)."""
    Kd = max(1, tb.max_depth)
    M, m, D = heads._fused(Kd)
    KC, V, R, cand_index = Kd * heads.n_embd, heads.vocab_size, tb.top_r, tb.cand_index

    def guess(h: torch.Tensor, root: int) -> torch.Tensor:
        u = torch.addmv(m, M, h)  # [K*C residual pre-activations; K*V base logits]
        logits = torch.addmv(u[KC:], D, F.silu(u[:KC])).view(Kd, V)
        return logits.topk(R, dim=-1).indices.take(cand_index)

    return guess


@lru_cache(maxsize=64)
def _plan(paths: tuple[tuple[int, ...], ...]):
    # Per depth d = 1 .. D of a tree: the parents (nodes at depth d - 1 with children), for
    # each parent the node indices of its path from the root (root first: the tokens head d
    # reads), and for each node of depth d its parent's row and its rank. Built once a shape.
    from .tree import build_tree

    tb = build_tree(paths)
    plan = []
    for d in range(1, tb.max_depth + 1):
        nodes = [i for i in range(1, tb.size) if len(tb.paths[i - 1]) == d]
        parents = sorted({tb.parents[i] for i in nodes})
        row = {p: r for r, p in enumerate(parents)}
        ctx = np.array([(0,) + tb.path_lists[p] for p in parents], dtype=np.int64)  # [n, d]
        plan.append(
            (
                np.array(nodes, dtype=np.int64),
                ctx,
                np.array([row[tb.parents[i]] for i in nodes], dtype=np.int64),
                np.array([tb.paths[i - 1][-1] for i in nodes], dtype=np.int64),
            )
        )
    return plan


class _HydraHost:
    # Hydra heads as NumPy arrays: every head's W h + b and L h in one product, then per
    # depth the token tables' rows, the SiLU and the output layer. On a CPU at these sizes a
    # call costs what dispatching it costs, so each depth is a handful of NumPy calls.
    def __init__(self, heads: HydraHeads):
        w = heads.host_weights()
        self.K, self.H, self.V = heads.n_heads, heads.hidden, heads.vocab_size
        self.M, self.m, self.E, self.P = w["M"], w["m"], w["E"], w["P"]
        KH, V = self.K * self.H, self.V
        self.slices = [
            ((d * self.H, (d + 1) * self.H), (KH + d * V, KH + (d + 1) * V)) for d in range(self.K)
        ]

    def base(self, h: torch.Tensor) -> np.ndarray:
        # u = [W_1 h + b_1; ..; W_K h + b_K; L_1 h; ..; L_K h] for the hidden state h [C]
        return self.M @ h.cpu().numpy() + self.m

    def logits(self, u: np.ndarray, d: int, ctx_tokens: np.ndarray) -> np.ndarray:
        # Head d's (0-based) logits [n, V] for n contexts of d + 1 tokens each [n, d + 1]
        (a0, a1), (l0, l1) = self.slices[d]
        o = _offset(d)
        a = u[a0:a1] + self.E[o][ctx_tokens[:, 0]]
        for j in range(1, d + 1):
            a += self.E[o + j][ctx_tokens[:, j]]
        return (a / (1.0 + np.exp(-a))) @ self.P[d].T + u[l0:l1]

    def one(self, u: np.ndarray, d: int, tokens: list[int]) -> np.ndarray:
        # Head d's logits [V] for one context (tokens: the root and the d tokens after it):
        # table rows by basic indexing (views), no fancy indexing.
        (a0, a1), (l0, l1) = self.slices[d]
        o = _offset(d)
        a = u[a0:a1] + self.E[o, tokens[0]]
        for j in range(1, d + 1):
            a += self.E[o + j, tokens[j]]
        return self.P[d] @ (a / (1.0 + np.exp(-a))) + u[l0:l1]  # SiLU: expit is slower


def hydra_top(heads: HydraHeads, tb: TreeBuffers) -> Callable:
    """``guess(h, root) -> tokens of nodes 1 .. N`` for Hydra heads: depth by depth, node
    ``(.., r)`` holding the rank-``r`` guess of its head given the root and its path (an
    int64 tensor; for a chain a list of ints, which the loop feeds without tensor copies)."""
    host = _HydraHost(heads)
    plan = _plan(tb.paths)
    R = tb.top_r
    if is_chain(tb):  # one context per depth: the top guess, in the fewest calls

        def chain(h: torch.Tensor, root: int) -> list[int]:
            u = host.base(h)
            tok = [root]
            for d in range(tb.max_depth):
                tok.append(int(host.one(u, d, tok).argmax()))
            return tok[1:]

        return chain

    def guess(h: torch.Tensor, root: int) -> torch.Tensor:
        u = host.base(h)
        tok = np.empty(tb.size, dtype=np.int64)
        tok[0] = root
        for d, (nodes, ctx, row, rank) in enumerate(plan):
            lg = host.logits(u, d, tok[ctx])
            if R == 1:
                tok[nodes] = lg.argmax(-1)[row]
            else:
                order = np.argsort(-lg, axis=-1, kind="stable")[:, :R]
                tok[nodes] = order[row, rank]
        return torch.from_numpy(tok[1:])

    return guess


def _draw(lg: np.ndarray, u: float) -> tuple[int, np.ndarray, float]:
    # A sample of softmax(lg) by inverse CDF for u in (0, 1]: (token, weights w, their sum Z),
    # q = w / Z the distribution it was drawn from (the walk needs q(x) and, after a
    # rejection, all of q).
    w = np.exp(lg - lg.max())
    c = np.cumsum(w)
    Z = float(c[-1])
    return _search(c, u), w, Z


def _search(c: np.ndarray, u: float) -> int:
    # The first index whose cumulative weight reaches u * total, for u in (0, 1]: index i
    # with probability w[i] / sum(w); a zero weight never ends the search (the index before
    # it reached the total first).
    return min(int(np.searchsorted(c, u * c[-1])), c.shape[0] - 1)


def sampler(heads, tb: TreeBuffers, temperature: float) -> Callable:
    """``draw(h, root, us) -> (tokens, qs)``: a chain of ``D =
    tb.max_depth`` tokens, token ``d`` sampled from head ``d``'s ``q_d`` (softmax of its
    logits / ``temperature``) given the root and the tokens drawn before it, with the
    uniforms ``us[d]`` (``tokens`` a list of ints); ``qs[d] = (w, Z)``, ``q_d = w / Z``.
    Medusa heads' ``q_d`` do not depend on the path."""
    D = tb.max_depth
    inv = 1.0 / temperature
    if isinstance(heads, HydraHeads):
        host = _HydraHost(heads)

        def draw(h, root, us):
            u = host.base(h)
            tok, qs = [root], []
            for d in range(D):
                lg = host.one(u, d, tok)
                x, w, Z = _draw(lg if inv == 1.0 else lg * inv, us[d])
                tok.append(x)
                qs.append((w, Z))
            return tok[1:], qs

        return draw

    M, m, Dm = heads._fused(D)
    KC, V = D * heads.n_embd, heads.vocab_size

    def draw(h, root, us):
        u = torch.addmv(m, M, h)
        lg = (torch.addmv(u[KC:], Dm, F.silu(u[:KC])).view(D, V) * inv).numpy()
        out = [_draw(lg[d], us[d]) for d in range(D)]
        return [o[0] for o in out], [(o[1], o[2]) for o in out]

    return draw


def top_guesser(heads, tb: TreeBuffers) -> Callable:
    """The ``top`` guesser for ``heads`` (Medusa or Hydra) on tree ``tb``."""
    if isinstance(heads, HydraHeads):
        return hydra_top(heads, tb)
    return medusa_top(heads, tb)


def sampled_chain_walk(
    probs: torch.Tensor, tl: list[int], qs: list, T: int, us: list[float]
) -> tuple[int, int]:
    """Verify a chain of sampled drafts: the speculative sampling rule, node by node.

    ``probs [T, V]`` the target's (processed) distributions at the fed nodes, ``tl`` the fed
    tokens (root first), ``qs[d] = (w, Z)``: node ``d + 1``'s token was drawn from ``w / Z``;
    ``us`` uniforms in (0, 1]: one per node tried, one for the token sampled at the end.
    Returns ``(node, token)``: the deepest accepted node and the token emitted there (the
    residual ``norm(max(p - q, 0))`` sampled after a rejection, else the target's
    distribution at the last node)."""
    pn = probs.cpu().numpy()  # NumPy: a scalar read costs far less than a tensor's
    for d in range(1, T):
        x = tl[d]
        w, Z = qs[d - 1]
        if us[d - 1] * float(w[x]) <= float(pn[d - 1, x]) * Z:  # u <= p(x) / q(x)
            continue
        res = np.maximum(pn[d - 1] - w * (1.0 / Z), 0.0)
        c = np.cumsum(res)
        if c[-1] <= 0.0:  # p == q up to rounding: nothing to correct
            c = np.cumsum(pn[d - 1])
        return d - 1, _search(c, us[T - 1])
    return T - 1, _search(np.cumsum(pn[T - 1]), us[T - 1])
