"""Check ``ex06.tree_attention_bias``: the additive attention bias and the position ids of
one tree pass after a cached prefix, on trees given by parents in any order, against
:func:`specdec_course.medusa.build_tree`'s mask and depths.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from specdec_course import medusa

from .._support import as_vector, fmt
from ..context import case_seed, fresh_cases
from ..core import Case, call, register

# (name, paths, prefix length, shuffle the nodes): breadth-first trees first, then trees whose
# parents come after their children.
TREES = [
    ("the root alone, no prefix", [], 0, False),
    ("a chain of three after 5 cached tokens", [(0,), (0, 0), (0, 0, 0)], 5, False),
    ("two children of the root, no prefix", [(0,), (1,)], 0, False),
    ("TREE_SMALL after 10 cached tokens", list(medusa.TREE_SMALL), 10, False),
    ("a chain listed leaf first", [(0,), (0, 0), (0, 0, 0)], 2, True),
    ("TREE_LARGE, nodes shuffled, after 7 cached tokens", list(medusa.TREE_LARGE), 7, True),
]


def _random_tree(seed: int) -> list[tuple[int, ...]]:
    """Paths of a random tree (depth up to 4, up to 3 children a node)."""
    g = torch.Generator().manual_seed(seed)
    paths, frontier = [], [()]
    while frontier and len(paths) < 24:
        parent = frontier.pop(0)
        for child in range(int(torch.randint(0 if parent else 1, 4, (), generator=g))):
            path = (*parent, child)
            paths.append(path)
            if len(path) < 4:
                frontier.append(path)
    return paths


def _tree_case(paths, shuffle_seed: int | None):
    """``(parents, mask [T, T], depth [T])`` of the tree, its non-root nodes shuffled."""
    tb = medusa.build_tree(paths)
    T = tb.size
    order = list(range(T))
    if shuffle_seed is not None and T > 2:
        g = torch.Generator().manual_seed(shuffle_seed)
        rest = [1 + int(i) for i in torch.randperm(T - 1, generator=g)]
        while rest == sorted(rest):  # make sure some parent follows its child
            rest = [1 + int(i) for i in torch.randperm(T - 1, generator=g)]
        order = [0, *rest]  # new node i is the breadth-first node order[i]
    new = {old: i for i, old in enumerate(order)}
    parents = [-1] + [new[tb.parents[old]] for old in order[1:]]
    idx = torch.tensor(order)
    return parents, tb.mask[idx][:, idx], tb.depth[idx]


def _diagnose_bias(parents, L, mask, depth, got_mask, got_pos, finite) -> str | None:
    """What is wrong in a returned ``(bias, positions)``, given its allowed entries ``got_mask``
    (0 in the bias) and ``finite`` (no value other than 0 and -inf); ``None`` if right."""
    T = len(parents)
    if not finite:
        return (
            "the bias holds values other than 0 and -inf: an additive bias is 0 where "
            "attention is allowed and -inf where it is not (a bool mask is not a bias)"
        )
    if got_mask.shape != (T, L + T):
        return (
            f"the bias is [T, prefix_len + T] = [{T}, {L + T}]: one row per node, one column "
            "per cached position and per node"
        )
    if L and not got_mask[:, :L].all():
        return "a node cannot see the cached prefix: every node attends to all of it"
    tree = got_mask[:, L:]
    if not torch.equal(tree, mask):
        eye = torch.eye(T, dtype=torch.bool)
        if torch.equal(tree, mask & ~eye):
            return "a node may attend to itself (the diagonal)"
        if torch.equal(tree, mask.T):
            return "transposed: row i is the query node, column j the node it may attend to"
        if torch.equal(tree, torch.ones(T, T, dtype=torch.bool).tril()):
            return (
                "a causal mask lets siblings and cousins see each other; a node sees its "
                "ancestors only"
            )
        if any(parents[i] > i for i in range(T)):
            return (
                "wrong on a tree whose parents come after some of their children: the nodes "
                "are in no particular order here"
            )
        return "a node must see exactly itself and its ancestors among the tree's nodes"
    if got_pos is None or got_pos.shape != depth.shape:
        return f"positions holds one position id per node: shape [{T}]"
    if torch.equal(got_pos, (L + depth).double()):
        return None
    if torch.equal(got_pos, depth.double()):
        return "the positions start at 0; the tree comes after the cached prefix"
    if torch.equal(got_pos, (L + torch.arange(T)).double()):
        return "the positions follow the node index; a node's position is set by its depth"
    if not torch.equal(got_pos, (L + depth).double()):
        return "wrong positions: a node sits as far after the prefix as it is deep"
    return None


@register(
    "ex06.tree_attention_bias",
    points=4,
    needs="tree_attention_bias",
    title="the tree pass's attention bias and positions",
    hint="a node's ancestors are found by following parents up to the root, whatever the "
    "order of the nodes; its depth is the number of steps. Lesson 06, section 3, says what "
    "a node may see and where it sits; the bias turns that into numbers the attention adds",
)
def check_tree_attention_bias(fn) -> Iterator[Case]:
    trees = list(TREES)
    if fresh_cases():  # the batch grader's: a tree drawn for this run
        trees.append(
            (
                "a random tree, nodes shuffled, after 4 cached tokens",
                _random_tree(case_seed(60)),
                4,
                True,
            )
        )
    for i, (name, paths, L, shuffle) in enumerate(trees):
        parents, mask, depth = _tree_case(paths, case_seed(61 + i) if shuffle else None)
        raw = call(name, fn, list(parents), L)
        if not (isinstance(raw, tuple) and len(raw) == 2):
            yield Case(
                name,
                False,
                "(bias, positions)",
                fmt(raw),
                "return a pair: the bias and the positions",
            )
            return
        bias, pos = as_vector(raw[0]), as_vector(raw[1])
        if bias is None or bias.dim() != 2:
            yield Case(
                name,
                False,
                f"a float tensor [{len(parents)}, {L + len(parents)}]",
                fmt(raw[0]),
                "the bias is a 2-D float tensor",
            )
            return
        finite = bool(((bias == 0) | (bias == float("-inf"))).all()) and raw[0].dtype != torch.bool
        got_mask = bias == 0
        exp = torch.zeros(len(parents), L + len(parents)).masked_fill(
            ~torch.cat([torch.ones(len(parents), L, dtype=torch.bool), mask], dim=1), float("-inf")
        )
        problem = _diagnose_bias(parents, L, mask, depth, got_mask, pos, finite)
        yield Case(
            f"{name} (parents {parents})" if len(parents) <= 8 else name,
            problem is None,
            f"bias {fmt(exp)}, positions {(L + depth).tolist()}",
            f"bias {fmt(raw[0])}, positions {fmt(raw[1])}",
            problem or "",
        )
        if problem is not None:
            return
