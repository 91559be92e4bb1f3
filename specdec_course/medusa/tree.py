"""Candidate trees: named trees, their precomputed buffers, one verification pass, compaction.

A tree is a list of paths like Medusa's ``medusa_choices``: ``(r1, ..., rd)`` is the node at
depth ``d`` holding head ``d``'s rank-``rd`` guess under the node ``(r1, ..., r(d-1))``. One
cached target pass scores every node with the tree attention mask (each node sees the prefix
and its own ancestors), and :func:`compact_cache` keeps the accepted path's keys and values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from .._validate import check_int
from ..fast import lean_step
from ..model import CharGPT, KVCache
from ..model.checks import check_forward

# Named trees (lists of paths; a path's i-th entry is the rank of head i+1's guess).
# CHAIN: every head's top-1 guess, one after the other: the draft-model picture.
CHAIN: tuple[tuple[int, ...], ...] = ((0,), (0, 0), (0, 0, 0))
# TREE_SMALL and TREE_LARGE are Medusa's sparse trees for the shipped heads: the paths with the
# largest products of the heads' per-rank top-1..8 accuracies on 32 validation windows
# (``greedy_tree(head_accuracy(..., n_windows=32, top=range(1, 9))["rank"], n)``), with n = 5
# and 13 the course's choice of a small and a large tree (lessons/06b_medusa_on_a_cpu.ipynb
# times both against plain decoding).
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

    def to(self, device: torch.device | str) -> TreeBuffers:
        """These buffers with every tensor on ``device`` (itself when they already are)."""
        device = torch.device(device)
        if self.bias.device == device:
            return self
        return replace(
            self,
            **{f: getattr(self, f).to(device) for f in _TENSORS},
            path_nodes=tuple(t.to(device) for t in self.path_nodes),
        )


_TENSORS = ("mask", "bias", "depth", "cand_index", "parent_index")


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
    check_forward(model, tokens[None], cache)
    tree = tree.to(tokens.device)
    prefix = tokens.new_zeros(()).float().expand(T, L)
    return _tree_pass(model, tokens, cache, tree, torch.cat([prefix, tree.bias[:T, :T]], dim=1))


def _tree_pass(
    model: CharGPT,
    feed: torch.Tensor,
    cache: KVCache,
    tree: TreeBuffers,
    bias: torch.Tensor | None,
    lean=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # tree_forward without its checks (callers check): the model's unchecked cached forward,
    # every node seeing the cached prefix and its own ancestors (``bias``: the additive mask
    # [T, L + T]), at position L + depth; ``bias=None`` for a chain, whose nodes are a run of
    # consecutive positions under the causal mask (the lean step's own path, no mask or
    # positions to pass). Returns (logits [T, V], hidden [T, n_embd]). The pass is the model's
    # lean step (fast.lean), as plain decoding's: no slower step to beat (``lean``: the
    # caller's, looked up once per generation).
    T, L = feed.numel(), cache.length
    lean = lean_step(model) if lean is None else lean
    if T == 1 or bias is None:
        hidden = lean.hidden(feed, cache)
    else:
        hidden = lean.hidden(feed, cache, tree.depth[:T] + L, bias)
    return torch.mm(hidden, lean.w_t), hidden


def tree_bias_buffer(tree: TreeBuffers, block_size: int) -> torch.Tensor:
    """``[T, block_size + T]``: zeros, then the tree's bias; its slice ``[:t, S - L : S + t]``
    (``S = block_size``) is the attention bias of the first ``t`` nodes after ``L`` cached
    positions, a view: one buffer per generation instead of a mask built per pass."""
    T = tree.size
    buf = torch.zeros(T, block_size + T, device=tree.bias.device)
    buf[:, block_size:] = tree.bias
    return buf


def compact_cache(
    cache: KVCache,
    start: int,
    nodes: Sequence[int] | torch.Tensor,
    index: torch.Tensor | None = None,
) -> None:
    """Keep the tree's root and the accepted ``nodes`` in the cache, in path order.

    The tree was written at slots ``start .. start + T - 1`` (root at ``start``); ``nodes``
    are the accepted nodes' tree indices from depth 1 down. Node ``nodes[d-1]``'s keys and
    values move to slot ``start + d``, and the cache then holds ``start + 1 + len(nodes)``
    positions: exactly the keys and values a plain forward pass over the accepted prefix
    would have written (positions and attention were those of the path). Copies only the
    accepted slots, all layers at once; nothing when they are already in place.

    ``index`` may pass the same nodes as a ready int64 tensor, with ``nodes`` then a tuple or
    list of ints (``TreeBuffers.path_nodes[i]`` and ``path_lists[i]``): the decoding loop
    calls this once per pass and so skips the conversion.
    """
    if index is None:
        index = torch.as_tensor(nodes, dtype=torch.long).reshape(-1)
        nodes = index.tolist()
    a = len(nodes)
    if a and tuple(nodes) != tuple(range(1, a + 1)):
        if torch.is_inference_mode_enabled():
            _move_slots(cache, start, index, a)
        else:  # the cache's buffers are often inference tensors (decoding made them)
            with torch.inference_mode():
                _move_slots(cache, start, index, a)
    cache.length = start + 1 + a


def _move_slots(cache: KVCache, start: int, index: torch.Tensor, a: int) -> None:
    src = index + start
    for buf in (cache.k, cache.v):
        buf[:, :, :, start + 1 : start + 1 + a] = buf.index_select(3, src)


def _as_tree(tree) -> TreeBuffers:
    # A tree argument as buffers: TreeBuffers as they are, a name from TREES, or paths.
    if isinstance(tree, TreeBuffers):
        return tree
    if isinstance(tree, str):
        if tree not in TREES:
            raise ValueError(
                f"tree must be one of {sorted(TREES)} or a list of paths; got {tree!r}"
            )
        tree = TREES[tree]
    return build_tree(tree)
