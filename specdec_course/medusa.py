"""Tiny Medusa: extra decoding heads on the frozen target, and tree verification.

Medusa (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads", arXiv:2401.10774) drops the draft model. Head ``k`` (``k = 1 .. K``) reads the
target's last hidden state ``h_t`` (after the final LayerNorm, the input of ``lm_head``) and
predicts the token at ``t + 1 + k``; the target's own ``lm_head`` predicts ``t + 1``. Each head
is a residual block ``x + SiLU(W x + b)`` followed by its own linear layer to the vocabulary,
initialised from the target's ``lm_head`` with ``W`` and ``b`` zero, so that a fresh head is a
copy of the base head. Medusa-1 trains the heads with the target frozen; the loss is
``sum_k 0.8^k * CE_k`` (the paper's ``lambda_k = 0.8^k``).

Candidates form a tree, given as a list of paths like the reference code's ``medusa_choices``:
the path ``(r1, r2)`` is the node whose depth-1 token is head 1's rank-``r1`` guess and whose
depth-2 token is head 2's rank-``r2`` guess. A head's guesses do not depend on the path
above them, so siblings of different parents share token sets. One target forward pass scores
the whole tree: the root (the pending token, sampled from the target at the previous step)
and every node sit after the cached prefix; node ``i`` attends to the prefix and to its own
ancestors only (the tree attention mask), at position ``prefix + depth(i)``. The logits at a
node are then exactly those of a plain forward pass along its root-to-node path.

Acceptance walks the tree from the root. At temperature 0 it follows the child that equals
the target's argmax, so the output is the target's greedy output. When sampling, the
candidates are deterministic, so each child is a one-hot draft: child ``c`` is accepted with
probability ``p(c)`` under the current (renormalised) target distribution; after a
rejection ``p(c)`` is zeroed and the rest renormalised before the next sibling is tried
(SpecInfer, Miao et al. 2024, with one-hot drafts). If no child is accepted, the token is
sampled from what is left; at a leaf, from the leaf's distribution. Over the siblings the
accepted child is ``c`` with probability exactly ``p(c)`` and the fallback sample covers the
rest, so every emitted token is distributed exactly as the target's.

The cache after an iteration holds the committed prefix; the newest token is *pending* (not
yet fed). The tree's keys and values are written at slots ``L .. L + T - 1`` (``L`` the
cache length, root at ``L``); ``compact_cache`` copies the accepted nodes' slots to
``L + 1, L + 2, ...`` and sets the length, so the cache equals a fresh run on the prefix.

``specdec-course train --preset medusa`` writes ``data/checkpoints/medusa.pt``;
``load_heads()`` reads it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
from torch.nn import functional as F

from ._validate import check_int
from .decoding import SpecStats, check_prompt
from .model import CharGPT, KVCache, check_model
from .paths import checkpoints_dir
from .sampling import SamplingOptions, exp_noise, uniform_open_closed

__all__ = [
    "DEFAULT_HEADS",
    "LOSS_DECAY",
    "CHAIN",
    "TREE_SMALL",
    "TREE_LARGE",
    "TREES",
    "ResBlock",
    "MedusaHead",
    "MedusaHeads",
    "loss_weights",
    "medusa_loss",
    "head_targets",
    "TreeBuffers",
    "build_tree",
    "tree_attention_mask",
    "greedy_tree",
    "tree_forward",
    "compact_cache",
    "MedusaStats",
    "medusa_generate",
    "head_accuracy",
    "collect_hidden",
    "train_heads",
    "HeadsTrainResult",
    "save_heads",
    "load_heads",
    "REBUILD_COMMAND",
    "run_medusa",
    "train_shipped_heads",
]

DEFAULT_HEADS = 3
LOSS_DECAY = 0.8
REBUILD_COMMAND = "specdec-course train --preset medusa"

# Named trees (lists of paths; a path's i-th entry is the rank of head i+1's guess).
# CHAIN: every head's top-1 guess, one after the other: the draft-model picture.
CHAIN: tuple[tuple[int, ...], ...] = ((0,), (0, 0), (0, 0, 0))
# TREE_SMALL and TREE_LARGE are Medusa's sparse trees for the shipped heads: the paths with the
# largest products of the heads' per-rank top-1..8 accuracies on 32 validation windows
# (``greedy_tree(head_accuracy(..., n_windows=32, top=range(1, 9))["rank"], n)``), with n = 5
# and 13 picked by measured speed on a 2-core CPU (lessons/06_tiny_medusa.ipynb).
TREE_SMALL: tuple[tuple[int, ...], ...] = ((0,), (1,), (2,), (3,), (0, 0))
TREE_LARGE: tuple[tuple[int, ...], ...] = (
    (0,),
    (1,),
    (2,),
    (3,),
    (4,),
    (5,),
    (6,),
    (7,),
    (0, 0),
    (0, 1),
    (0, 2),
    (0, 3),
    (1, 0),
)
TREES = {"chain": CHAIN, "small": TREE_SMALL, "large": TREE_LARGE}


# ---------------------------------------------------------------------------------- the heads


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


# ----------------------------------------------------------------------------------- the trees


@dataclass(frozen=True)
class TreeBuffers:
    """Everything a tree needs at run time, built once by :func:`build_tree`.

    Node 0 is the root; nodes ``1 .. N`` are the paths sorted by ``(depth, path)`` (breadth
    first), so the nodes of depth ``<= d`` are a prefix (``upto[d]`` of them, root included)
    and any prefix of the nodes is itself a tree: the walk near the end of generation and at
    the end of the context uses such a prefix. Tensors:

    - ``mask [T, T]`` bool: node ``i`` may attend to node ``j`` (``j`` is ``i`` or an ancestor);
    - ``bias [T, T]`` float: the same mask as an additive attention bias (0 or -inf), the form
      the attention kernel uses (no conversion per layer and pass);
    - ``depth [T]`` int64: position offset of each node after the cached prefix;
    - ``cand_index [N]`` int64: index of node ``i``'s token in the flattened top-``R`` guesses
      of the heads ``[K * R]`` (``(depth - 1) * R + rank``);
    - ``parent_index [N]`` int64: the parent of nodes ``1 .. N``;
    - ``path_nodes[i]``: int64 tensor of the nodes from depth 1 down to ``i``.
    """

    paths: tuple[tuple[int, ...], ...]
    mask: torch.Tensor
    bias: torch.Tensor
    depth: torch.Tensor
    cand_index: torch.Tensor
    parent_index: torch.Tensor
    parents: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]
    path_nodes: tuple[torch.Tensor, ...]
    path_lists: tuple[tuple[int, ...], ...]
    upto: tuple[int, ...]
    max_depth: int
    top_r: int

    @property
    def size(self) -> int:
        """Number of nodes including the root (the tokens one verification pass feeds)."""
        return len(self.parents)


def _check_paths(paths) -> tuple[tuple[int, ...], ...]:
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Iterable):
        raise ValueError("tree must be a list of paths, e.g. [(0,), (1,), (0, 0)]")
    out = []
    for p in paths:
        if isinstance(p, (str, bytes)) or not isinstance(p, Iterable):
            raise ValueError(f"each path must be a tuple of ranks; got {p!r}")
        p = tuple(p)
        if not p or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in p):
            raise ValueError(f"each path must be a non-empty tuple of ints >= 0 (ranks); got {p!r}")
        out.append(p)
    if len(set(out)) != len(out):
        dup = next(p for p in out if out.count(p) > 1)
        raise ValueError(f"tree lists the path {dup!r} twice; list each node once")
    have = set(out)
    for p in out:
        if len(p) > 1 and p[:-1] not in have:
            raise ValueError(
                f"tree has the path {p!r} but not its parent {p[:-1]!r}; add every prefix"
            )
    return tuple(sorted(out, key=lambda p: (len(p), p)))


def tree_attention_mask(paths: Sequence[Sequence[int]]) -> torch.Tensor:
    """The tree attention mask ``[T, T]`` (bool) for ``paths`` in breadth-first order.

    Row/column 0 is the root; node ``i`` is the ``i``-th path after sorting by
    ``(len(path), path)``. ``mask[i, j]`` is True when ``j`` is ``i`` itself or one of its
    ancestors (the root is everyone's ancestor). Raises ValueError for a malformed tree.
    """
    return build_tree(paths).mask.clone()


def build_tree(paths: Sequence[Sequence[int]]) -> TreeBuffers:
    """Precompute a tree's buffers (see :class:`TreeBuffers`) from its list of paths.

    ``paths`` like Medusa's ``medusa_choices``: ``(r1, ..., rd)`` is the node at depth ``d``
    holding head ``d``'s rank-``rd`` guess, under the node ``(r1, ..., r(d-1))``. A chain of
    top-1 guesses is ``[(0,), (0, 0), (0, 0, 0)]``; an empty list is the root alone (plain
    decoding). Raises ValueError for a malformed path, a duplicate, or a missing parent.
    """
    sp = _check_paths(paths)
    index = {(): 0}
    for i, p in enumerate(sp, start=1):
        index[p] = i
    T = len(sp) + 1
    parents = [-1] + [index[p[:-1]] for p in sp]
    depth = [0] + [len(p) for p in sp]
    max_depth = max(depth)
    top_r = 1 + max((max(p) for p in sp), default=-1)
    mask = torch.zeros(T, T, dtype=torch.bool)
    path_lists: list[tuple[int, ...]] = [()]
    for i in range(T):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
        if i:
            p = sp[i - 1]
            path_lists.append(tuple(index[p[:d]] for d in range(1, len(p) + 1)))
    children = [[] for _ in range(T)]
    for i in range(1, T):
        children[parents[i]].append(i)  # sorted by rank: the likeliest guess is tried first
    upto = tuple(sum(1 for d in depth if d <= dd) for dd in range(max_depth + 1))
    return TreeBuffers(
        paths=sp,
        mask=mask,
        bias=torch.zeros(T, T).masked_fill_(~mask, float("-inf")),
        depth=torch.tensor(depth, dtype=torch.long),
        cand_index=torch.tensor([(len(p) - 1) * top_r + p[-1] for p in sp], dtype=torch.long),
        parent_index=torch.tensor(parents[1:], dtype=torch.long),
        parents=tuple(parents),
        children=tuple(tuple(c) for c in children),
        path_nodes=tuple(torch.tensor(pl, dtype=torch.long) for pl in path_lists),
        path_lists=tuple(path_lists),
        upto=upto,
        max_depth=max_depth,
        top_r=max(top_r, 1),
    )


def greedy_tree(accuracy: torch.Tensor, n_nodes: int) -> list[tuple[int, ...]]:
    """The ``n_nodes`` paths with the largest product of per-head, per-rank accuracies.

    ``accuracy [K, R]``: ``accuracy[k, r]`` is how often head ``k + 1``'s rank-``r`` guess is
    right (Medusa's sparse-tree construction). A path's product estimates how often all its
    guesses are right together, which is the chance the walk reaches it; the expected number
    of accepted tokens is the sum over the tree, and picking the largest products maximises
    it. Products only shrink along a path, so the chosen set contains every parent.
    """
    acc = torch.as_tensor(accuracy, dtype=torch.float64)
    if acc.dim() != 2 or (acc < 0).any() or (acc > 1).any():
        raise ValueError("accuracy must be a [K, R] tensor of values in [0, 1]")
    check_int(n_nodes, "n_nodes", minimum=0)
    K, R = acc.shape
    chosen: list[tuple[int, ...]] = []
    frontier = {(r,): float(acc[0, r]) for r in range(R)}
    while frontier and len(chosen) < n_nodes:
        best = max(frontier, key=lambda p: (frontier[p], -len(p), [-r for r in p]))
        v = frontier.pop(best)
        chosen.append(best)
        if len(best) < K:
            for r in range(R):
                frontier[best + (r,)] = v * float(acc[len(best), r])
    return sorted(chosen, key=lambda p: (len(p), p))


def _sample_rest(probs: list[float], u: float) -> int:
    """Index ``i`` with probability ``probs[i] / sum(probs)`` by inverse CDF, for ``u`` in (0, 1].

    Entries that are 0 (rejected guesses, filtered tokens) are never returned; 65 Python
    additions cost less than the tensor ops of a sample on the CPU.
    """
    target = u * sum(probs)
    acc, last = 0.0, 0
    for i, p in enumerate(probs):
        if p > 0.0:
            acc += p
            last = i
            if acc >= target:
                return i
    return last  # rounding left target a hair above the total


def tree_forward(
    model: CharGPT, tokens: torch.Tensor, cache: KVCache, tree: TreeBuffers
) -> tuple[torch.Tensor, torch.Tensor]:
    """One cached forward pass over the tree's tokens ``[T]`` (root first, breadth first).

    The tokens take cache slots ``L .. L + T - 1`` (``L = cache.length``) and positions
    ``L + depth``; node ``i`` attends to the prefix and its own ancestors. Returns
    ``(logits [T, V], hidden [T, n_embd])``; afterwards ``cache.length == L + T``, with the
    tree's keys and values in those slots (keep a path with :func:`compact_cache`). ``T`` may
    be smaller than the tree: the first ``T`` nodes are then used. Raises ValueError for a
    tokens tensor that is not 1-D int64 or is longer than the tree.
    """
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.dtype != torch.long:
        raise ValueError("tokens must be a 1-D int64 tensor (root first, then the nodes)")
    T = tokens.numel()
    if not 1 <= T <= tree.size:
        raise ValueError(f"tokens has {T} entries; the tree has {tree.size} nodes (root included)")
    L = cache.length
    if L + T > model.config.block_size:
        raise ValueError(
            f"{L} cached + {T} tree tokens exceed block_size "
            f"{model.config.block_size}; use fewer nodes (tokens[:n])"
        )
    model._check_idx(tokens[None], cache)
    hidden = _tree_pass(model, tokens, cache, tree, tokens.new_zeros(()).float().expand(T, L))
    return F.linear(hidden, model.lm_head.weight), hidden


def _tree_pass(
    model: CharGPT, feed: torch.Tensor, cache: KVCache, tree: TreeBuffers, prefix: torch.Tensor
) -> torch.Tensor:
    # The model's unchecked cached forward (callers check): every node sees the cached
    # prefix (``prefix``: zeros [T, L]) and its own ancestors, at position L + depth.
    T, L = feed.numel(), cache.length
    if T == 1:
        return model.decode_hidden(feed[None], cache)[0]
    bias = torch.cat([prefix, tree.bias[:T, :T]], dim=1)
    return model.decode_hidden(feed[None], cache, tree.depth[:T] + L, bias)[0]


@torch.inference_mode()  # the cache's buffers are often inference tensors (decoding made them)
def compact_cache(cache: KVCache, start: int, nodes: Sequence[int] | torch.Tensor) -> None:
    """Keep the tree's root and the accepted ``nodes`` in the cache, in path order.

    The tree was written at slots ``start .. start + T - 1`` (root at ``start``); ``nodes``
    are the accepted nodes' tree indices from depth 1 down. Node ``nodes[d-1]``'s keys and
    values move to slot ``start + d``, and the cache then holds ``start + 1 + len(nodes)``
    positions: exactly the keys and values a plain forward pass over the accepted prefix
    would have written (positions and attention were those of the path). Copies only the
    accepted slots, all layers at once; nothing when they are already in place.
    """
    idx = torch.as_tensor(nodes, dtype=torch.long)
    a = idx.numel()
    if a and not (idx == torch.arange(1, a + 1)).all():
        src = idx + start
        for buf in (cache.k, cache.v):
            buf[:, :, :, start + 1 : start + 1 + a] = buf.index_select(3, src)
    cache.length = start + 1 + a


# ------------------------------------------------------------------------------- generation


@dataclass
class MedusaStats(SpecStats):
    """Counts from one ``medusa_generate`` call (a ``SpecStats``, the draft fields unused).

    One *iteration* is one tree verification pass; ``accepted_per_iteration[i]`` is the number
    of tree nodes (guessed tokens) it accepted, and every iteration also emits one token of the
    target's own. ``target_calls`` counts every target forward pass, the prefill included
    (the prefill emits the first new token, as in plain decoding, where ``m`` tokens cost
    ``m`` calls), so ``tokens_per_target_call`` is 1.0 for plain decoding. ``k`` is the tree
    depth and ``tree_size`` its node count (root included); ``drafted`` sums the nodes fed.
    """

    tree_size: int = 0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per tree pass: accepted guesses plus the target's own token."""
        return self.mean_accepted + 1.0

    def summary(self) -> str:
        return (
            f"tree of {self.tree_size} nodes, depth {self.k}: {self.emitted} tokens in "
            f"{self.iterations} tree passes, {self.target_calls} target calls; mean accepted "
            f"{self.mean_accepted:.3f}, mean accepted length {self.mean_accepted_length:.3f}, "
            f"tokens per target call {self.tokens_per_target_call:.3f}"
        )


def _as_tree(tree) -> TreeBuffers:
    if isinstance(tree, TreeBuffers):
        return tree
    if isinstance(tree, str):
        if tree not in TREES:
            raise ValueError(
                f"tree must be one of {sorted(TREES)} or a list of paths; got {tree!r}"
            )
        tree = TREES[tree]
    return build_tree(tree)


@torch.inference_mode()
def medusa_generate(
    model: CharGPT,
    heads: MedusaHeads,
    prompt_ids,
    max_new_tokens: int,
    *,
    tree=TREE_SMALL,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    timings: bool = False,
) -> tuple[torch.Tensor, MedusaStats]:
    """Medusa decoding: heads guess a tree of tokens, one target pass verifies all of them.

    ``model`` is the target, ``heads`` a ``MedusaHeads`` trained on it; ``prompt_ids`` 1-D ids
    (non-empty). ``tree``: a list of paths (see :func:`build_tree`), a name from ``TREES``
    (``"chain"``, ``"small"``, ``"large"``) or prebuilt ``TreeBuffers``; its depth may not
    exceed ``heads.n_heads``. Sampling options as in ``decoding.generate``: at
    ``temperature=0`` the output is ``decoding.generate(model, prompt, n, temperature=0)``
    token for token; otherwise every token is distributed exactly as the target's after the
    same temperature / top-k / top-p processing (see the module docstring for the rule).
    ``timings=True`` fills ``stats.seconds`` (heads, target, walk, cache).

    Returns ``(ids, MedusaStats)``: ``ids`` is the 1-D prompt followed by exactly
    ``max_new_tokens`` new ids. Raises ValueError for bad prompts or options, heads of another
    width or vocabulary, or a tree deeper than the number of heads.
    """
    ids = check_prompt(model, prompt_ids, max_new_tokens)
    if not isinstance(heads, MedusaHeads):
        raise ValueError(f"heads must be a MedusaHeads; got {type(heads).__name__}")
    if (heads.n_embd, heads.vocab_size) != (model.config.n_embd, model.config.vocab_size):
        raise ValueError(
            f"heads were built for n_embd={heads.n_embd}, vocab={heads.vocab_size}; the model "
            f"has n_embd={model.config.n_embd}, vocab={model.config.vocab_size}"
        )
    tb = _as_tree(tree)
    if tb.top_r > heads.vocab_size:
        raise ValueError(
            f"the tree asks for rank {tb.top_r - 1} but the vocabulary has "
            f"{heads.vocab_size} tokens"
        )
    if tb.max_depth > heads.n_heads:
        raise ValueError(
            f"the tree is {tb.max_depth} deep but there are only {heads.n_heads} heads; "
            "use a shallower tree or more heads"
        )
    process = SamplingOptions(temperature, top_k, top_p).logits  # checks the options
    greedy = temperature == 0
    identity = temperature == 1.0 and top_k is None and top_p is None
    n = ids.numel()
    end = n + max_new_tokens
    out = torch.empty(end, dtype=torch.long)
    out[:n] = ids
    stats = MedusaStats(k=tb.max_depth, tree_size=tb.size)
    if max_new_tokens == 0:
        return out, stats
    clock = time.perf_counter if timings else None
    spent = {"heads": 0.0, "target": 0.0, "walk": 0.0, "cache": 0.0}

    # Only the heads the tree reaches, fused into two matrix-vector products (see
    # MedusaHeads._fused): small batched matmuls (bmm) cost several times more on a CPU.
    Kd = max(1, tb.max_depth)
    M, m, D = heads._fused(Kd)
    C, V = heads.n_embd, heads.vocab_size
    KC = Kd * C
    R = tb.top_r
    cand_index = tb.cand_index
    children, path_lists, path_nodes = tb.children, tb.path_lists, tb.path_nodes
    block = model.config.block_size

    if not greedy:
        # Random numbers drawn in bulk, once per call: per pass a row of float64 uniforms in
        # (0, 1], one per child tried plus one for the token sampled from what is left;
        # Gumbel noise for the prefill's token (Gumbel-max: argmax(logits + G) is a sample
        # of softmax(logits)).
        uniforms = uniform_open_closed((max_new_tokens, tb.size), generator=generator).tolist()
        gumbel = exp_noise((V,), generator=generator).log_().neg_()
    cache = model.new_cache(1)
    # Prefill: the whole prompt; its last position gives the first new token and the hidden
    # state the heads read.
    logits, hid = model(out[None, :n], cache, return_hidden=True)
    if greedy:
        first = logits[0, -1].argmax()
    else:
        first = (process(logits[0, -1]) + gumbel).argmax()
    # The committed text as Python ints: the walk reads and extends it without tensor ops.
    seq = ids.tolist() + [int(first)]
    h = hid[0, -1]
    n += 1
    stats.target_calls = 1
    tokens = torch.empty(tb.size, dtype=torch.long)
    zeros = torch.zeros(tb.size, block)  # the prefix part of every attention bias
    lm_w = model.lm_head.weight

    while n < end:
        t0 = clock() if clock else 0.0
        L = cache.length  # == n - 1: the newest token out[n - 1] is pending
        # Tree size: no deeper than the tokens still needed, and within the context.
        T = min(tb.upto[min(tb.max_depth, end - n)], block - L)
        tokens[0] = seq[-1]
        if T > 1:
            # All heads on the one hidden state: [K, C] residual, [K, V] logits, top-R.
            u = torch.addmv(m, M, h)  # [K*C residual pre-activations; K*V base logits]
            guesses = torch.addmv(u[KC:], D, F.silu(u[:KC])).view(Kd, V).topk(R, dim=-1)
            tokens[1:] = guesses.indices.take(cand_index)
        t1 = clock() if clock else 0.0
        feed = tokens[:T]
        hid = _tree_pass(model, feed, cache, tb, zeros[:T, :L])
        logits = F.linear(hid, lm_w)
        t2 = clock() if clock else 0.0
        node = 0
        tl = feed.tolist()
        if greedy:
            am = logits.argmax(-1).tolist()
            while True:
                want = am[node]
                for c in children[node]:
                    if c < T and tl[c] == want:
                        node = c
                        break
                else:
                    new_tok = want
                    break
        else:
            probs = (logits if identity else process(logits)).softmax(-1)  # [T, V]
            us = uniforms[stats.iterations]
            ui = 0
            while True:
                # The walk reads a node's distribution as Python floats: the few visited
                # nodes cost one conversion each instead of several small tensor ops.
                prow = probs[node].tolist()
                rem = sum(prow)  # mass not yet rejected at this node
                for c in children[node]:
                    if c >= T:  # outside a truncated tree (children come in index order)
                        continue
                    pc = prow[tl[c]]
                    u = us[ui]
                    ui += 1
                    # u <= pc / rem, multiplied out; a child holding all the remaining
                    # mass is accepted outright (rounding could otherwise leave nothing).
                    if u * rem <= pc or rem - pc <= 0.0:
                        node = c
                        break
                    rem -= pc
                    prow[tl[c]] = 0.0  # rejected: renormalising is implicit in rem
                else:
                    new_tok = _sample_rest(prow, us[ui])
                    break
        t3 = clock() if clock else 0.0
        path = path_lists[node]
        a = len(path)
        seq.extend(tl[i] for i in path)
        if n + a < end:  # else the accepted guesses completed the output
            seq.append(new_tok)
        # Keep the root and the accepted path; the new token is pending.
        if a and path != tuple(range(1, a + 1)):
            src = path_nodes[node] + L
            for buf in (cache.k, cache.v):
                buf[:, :, :, L + 1 : L + 1 + a] = buf.index_select(3, src)
        cache.length = L + 1 + a
        h = hid[node]
        n = min(n + a + 1, end)
        stats.iterations += 1
        stats.drafted += T - 1
        stats.accepted_per_iteration.append(a)
        stats.rejections += any(c < T for c in children[node])  # stopped at a rejection
        if clock:
            t4 = clock()
            spent["heads"] += t1 - t0
            spent["target"] += t2 - t1
            spent["walk"] += t3 - t2
            spent["cache"] += t4 - t3
    stats.target_calls += stats.iterations
    stats.emitted = max_new_tokens
    if timings:
        stats.seconds = spent
    out[ids.numel() :] = torch.tensor(seq[ids.numel() : end], dtype=torch.long)
    return out, stats


# -------------------------------------------------------------------------- accuracy, training


@torch.inference_mode()
def collect_hidden(
    target: CharGPT, ids: torch.Tensor, n_windows: int | None = None, batch_size: int = 32
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's last hidden states on fixed windows of ``ids``: ``(h [N, T, C], x [N, T])``.

    Windows are ``data.eval_windows`` (non-overlapping when ``n_windows`` is None). The target
    is frozen during head training, so its hidden states are computed once and reused.
    """
    from .data import eval_windows

    check_model(target, "target")
    x, _ = eval_windows(ids, target.config.block_size, n_windows)
    hs = [target.hidden_states(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    return torch.cat(hs), x


@torch.inference_mode()
def head_accuracy(
    target: CharGPT,
    heads: MedusaHeads,
    ids: torch.Tensor,
    *,
    n_windows: int = 16,
    top: Sequence[int] = (1, 5),
    hidden: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict:
    """Top-k accuracy of each head (and of the base ``lm_head``) on windows of ``ids``.

    Returns ``{"base": {k: acc}, "heads": [{k: acc} per head], "rank": [K, R] tensor}`` where
    ``rank[k, r]`` is how often head ``k + 1``'s rank-``r`` guess is right (``R = max(top)``),
    the input of :func:`greedy_tree`. ``hidden`` may pass ``collect_hidden``'s result.
    """
    if not isinstance(heads, MedusaHeads):
        raise ValueError(f"heads must be a MedusaHeads; got {type(heads).__name__}")
    top = tuple(int(t) for t in top)
    if not top or min(top) < 1:
        raise ValueError(f"top must list positive ranks; got {top!r}")
    h, x = hidden if hidden is not None else collect_hidden(target, ids, n_windows)
    R = max(top)
    K = heads.n_heads

    def ranks_of(logits, labels):
        order = logits.topk(R, dim=-1).indices  # [..., R]
        return (order == labels[..., None]).float().reshape(-1, R).mean(0)  # hit per rank

    base = ranks_of(target.lm_head(h[:, :-1]), x[:, 1:])
    rank = torch.zeros(K, R)
    for k in range(1, K + 1):
        s = 1 + k
        rank[k - 1] = ranks_of(heads.heads[k - 1](h[:, :-s]), x[:, s:])
    return {
        "base": {t: float(base[:t].sum()) for t in top},
        "heads": [{t: float(rank[k, :t].sum()) for t in top} for k in range(K)],
        "rank": rank,
    }


@dataclass
class HeadsTrainResult:
    heads: MedusaHeads
    history: dict = field(default_factory=dict)  # step, loss, ce (per head), lr
    seconds: float = 0.0


def train_heads(
    target: CharGPT,
    train_ids: torch.Tensor,
    *,
    n_heads: int = DEFAULT_HEADS,
    steps: int = 2000,
    batch_size: int = 4096,
    lr: float = 3e-3,
    n_windows: int | None = None,
    seed: int = 0,
    progress: bool = True,
    hidden: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> HeadsTrainResult:
    """Medusa-1: train ``n_heads`` heads on the frozen ``target``.

    The target's hidden states over fixed windows of ``train_ids`` are computed once
    (``collect_hidden``; ``n_windows`` of them, all when None, or pass ``hidden``); each step
    then samples ``batch_size`` random positions and minimises ``medusa_loss`` (weights
    ``0.8^k``) with AdamW, linear warm-up and cosine decay. Same seed and thread count, same
    heads. Returns a ``HeadsTrainResult`` (heads in eval mode, history, wall seconds
    including the hidden-state pass). Raises ValueError for bad sizes.
    """
    from tqdm import tqdm

    from .train import TrainConfig, lr_at

    check_model(target, "target")
    for name, v in (("steps", steps), ("batch_size", batch_size)):
        check_int(v, name)
    t0 = time.perf_counter()
    target.eval()
    for prm in target.parameters():
        prm.requires_grad_(False)
    try:
        h, x = hidden if hidden is not None else collect_hidden(target, train_ids, n_windows)
    finally:
        for prm in target.parameters():
            prm.requires_grad_(True)
    h = h.clone()  # out of inference mode: usable in autograd as a constant
    N, T, C = h.shape
    span = T - 1 - n_heads  # positions whose every head label lies inside the window
    if span < 1:
        raise ValueError(f"windows of {T} tokens are too short for {n_heads} heads")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    heads = MedusaHeads.from_target(target, n_heads)
    heads.train()
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    tc = TrainConfig(steps=steps, lr=lr, min_lr=lr / 10, warmup=min(100, steps // 10))
    offs = torch.arange(2, n_heads + 2)
    hist: dict = {"step": [], "loss": [], "ce": [], "lr": []}
    bar = tqdm(range(steps), desc="medusa heads", disable=not progress, mininterval=2.0, ncols=90)
    for step in bar:
        cur = lr_at(step, tc)
        for g in opt.param_groups:
            g["lr"] = cur
        w = torch.randint(N, (batch_size,), generator=gen)
        t = torch.randint(span, (batch_size,), generator=gen)
        logits = heads(h[w, t])  # [K, B, V]
        labels = x[w[None, :], t[None, :] + offs[:, None]]  # [K, B]: x[t + 1 + k]
        loss, ce = medusa_loss(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        hist["step"].append(step)
        hist["loss"].append(loss.item())
        hist["ce"].append(ce.detach().tolist())
        hist["lr"].append(cur)
        if step % 100 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    heads.eval()
    return HeadsTrainResult(heads, hist, time.perf_counter() - t0)


# ------------------------------------------------------------------------------- checkpoints


def _fingerprint(target: CharGPT) -> float:
    # Heads only make sense on the target they were trained on; this number identifies it
    # (the sum of its output matrix, which any retraining changes).
    return round(float(target.lm_head.weight.detach().double().sum()), 6)


def save_heads(
    path: str | Path, heads: MedusaHeads, target: CharGPT, meta: dict | None = None
) -> Path:
    """Write ``{"config", "state_dict", "target_fingerprint", "meta"}`` to ``path``."""
    if not isinstance(heads, MedusaHeads):
        raise ValueError(f"heads must be a MedusaHeads; got {type(heads).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "config": {
                "n_embd": heads.n_embd,
                "vocab_size": heads.vocab_size,
                "n_heads": heads.n_heads,
            },
            "state_dict": {k: v.detach().cpu().clone() for k, v in heads.state_dict().items()},
            "target_fingerprint": _fingerprint(target),
            "meta": dict(meta or {}),
        },
        path,
    )
    return path


def load_heads(path: str | Path | None = None, *, target: CharGPT | None = None) -> MedusaHeads:
    """Load Medusa heads (default: the shipped ``data/checkpoints/medusa.pt``), in eval mode.

    With ``target``, checks that the heads were trained on that model. Training metadata is
    ``heads.meta``. Raises FileNotFoundError (with the command that rebuilds it) for a missing
    file, ValueError for an unreadable one or heads trained on another target.
    """
    path = Path(path) if path is not None else checkpoints_dir() / "medusa.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"Medusa heads {path} not found; rebuild them with: {REBUILD_COMMAND}"
        )
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        cfg = ck["config"]
        heads = MedusaHeads(int(cfg["n_embd"]), int(cfg["vocab_size"]), int(cfg["n_heads"]))
        heads.load_state_dict(ck["state_dict"])
    except Exception as e:  # truncated file, wrong keys, wrong shapes
        raise ValueError(
            f"Medusa heads {path} could not be read ({type(e).__name__}: "
            f"{str(e)[:200]}); delete it and rebuild it with: {REBUILD_COMMAND}"
        ) from None
    if target is not None and not math.isclose(
        _fingerprint(target), float(ck["target_fingerprint"]), rel_tol=0, abs_tol=1e-3
    ):
        raise ValueError(
            f"Medusa heads {path} were trained on another target model; "
            f"retrain them with: {REBUILD_COMMAND}"
        )
    heads.eval()
    heads.meta = dict(ck.get("meta", {}))
    return heads


# --------------------------------------------------------------------------------- benchmark


def run_medusa(
    model: CharGPT,
    heads: MedusaHeads,
    prompts: Sequence[torch.Tensor],
    max_new_tokens: int,
    *,
    tree=TREE_SMALL,
    temperature: float = 1.0,
    seed: int = 0,
    repeats: int = 1,
) -> dict:
    """Run ``medusa_generate`` and plain ``decoding.generate`` on ``prompts``; time both.

    For the speedup benchmark: both methods decode every prompt ``repeats`` times in
    alternation (so machine load hits both alike), batch 1, with the same seeds. Returns
    ``{"medusa_s", "plain_s", "speedup", "stats": [MedusaStats], "mean_accepted",
    "mean_accepted_length", "tokens_per_target_call", "tree_size"}`` where the times are
    totals in seconds and ``speedup = plain_s / medusa_s``.
    """
    from .decoding import generate

    tb = _as_tree(tree)
    t_med = t_plain = 0.0
    all_stats = []
    for rep in range(repeats):
        for i, prompt in enumerate(prompts):
            g = torch.Generator().manual_seed(seed + 1000 * rep + i)
            t0 = time.perf_counter()
            generate(model, prompt, max_new_tokens, temperature=temperature, generator=g)
            t1 = time.perf_counter()
            g = torch.Generator().manual_seed(seed + 1000 * rep + i)
            _, st = medusa_generate(
                model, heads, prompt, max_new_tokens, tree=tb, temperature=temperature, generator=g
            )
            t2 = time.perf_counter()
            t_plain += t1 - t0
            t_med += t2 - t1
            all_stats.append(st)
    total = MedusaStats(k=tb.max_depth, tree_size=tb.size)
    for st in all_stats:
        total.add(st)
    return {
        "medusa_s": t_med,
        "plain_s": t_plain,
        "speedup": t_plain / t_med,
        "stats": all_stats,
        "mean_accepted": total.mean_accepted,
        "mean_accepted_length": total.mean_accepted_length,
        "tokens_per_target_call": total.tokens_per_target_call,
        "tree_size": tb.size,
    }


def train_shipped_heads(
    *, steps: int = 2000, seed: int = 0, out: str | Path | None = None
) -> tuple[Path, dict, dict]:
    """Train heads on the shipped target, as the shipped ``medusa.pt`` was, and save them.

    Returns ``(path, meta, accuracy)``: ``meta`` is what the checkpoint records (steps,
    seed, validation top-1/top-5 per head), ``accuracy`` is ``head_accuracy`` on 32
    validation windows. ``out`` defaults to ``data/checkpoints/medusa.pt``.
    """
    from . import data as D
    from .model import load_pretrained

    check_int(steps, "steps")
    out = Path(out) if out else checkpoints_dir() / "medusa.pt"
    target = load_pretrained("target")
    tok = D.CharTokenizer(target.vocab)
    train_ids, val_ids = D.train_val_split(tok.encode(D.load_corpus()))
    res = train_heads(target, train_ids, steps=steps, seed=seed)
    acc = head_accuracy(target, res.heads, val_ids, n_windows=32)
    meta = {
        "n_heads": res.heads.n_heads,
        "steps": steps,
        "seed": seed,
        "batch_size": 4096,
        "threads": torch.get_num_threads(),
        "train_seconds": round(res.seconds, 1),
        "params": sum(p.numel() for p in res.heads.parameters()),
        "val_top1": [a[1] for a in acc["heads"]],
        "val_top5": [a[5] for a in acc["heads"]],
        "val_base_top1": acc["base"][1],
        "command": REBUILD_COMMAND,
    }
    save_heads(out, res.heads, target, meta)
    return out, meta, acc
