"""Exercise 07, the walk: the exact law of a lossless tree walk, and its chi-square checks."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch

from specdec_course import medusa
from specdec_course.medusa.medusa_generate import _greedy_walk
from specdec_course.stats import chi_square_test, round_probs
from specdec_course.stats import counts as _counts

from .._support import FitLog, as_number, fmt, seeded
from ..context import case_seed, fresh_cases
from ..core import Case, call_repeat, register

__all__ = ["CHAIN", "DEEP", "V", "exact_law", "make_tree_case"]

V = 6  # small, so that (node, token) bins stay few and every mistake shows
CHAIN = [(0,), (0, 0), (0, 0, 0)]
DEEP = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1)]


# --------------------------------------------------------------------------- the exact law


def _node_law(p: torch.Tensor, child_tokens: Sequence[int]) -> tuple[list[float], torch.Tensor]:
    """The rule at one node: ``(P(accept child j), P(no child, token t) for every t)``."""
    left = p.clone()
    still = 1.0  # the chance that every child so far was rejected
    moves = []
    for x in child_tokens:
        mass = float(left.sum())
        share = float(left[x]) / mass if mass > 0 else 0.0  # p(x) under what is left
        moves.append(still * share)
        still *= 1.0 - share
        left[x] = 0.0
    mass = float(left.sum())
    rest = left * (still / mass) if still > 0 and mass > 0 else torch.zeros_like(p)
    return moves, rest


def exact_law(
    probs: torch.Tensor, tokens: torch.Tensor, children: Sequence[Sequence[int]]
) -> torch.Tensor:
    """Exact law of (last accepted node, emitted token) under the walk: ``[T, V]``, summing to 1.

    Enumerates the rule node by node from the root: the chance of reaching each node, the
    chance of moving on to each child, and the token sampled where the walk stops.
    """
    T, n_tok = probs.shape
    law = torch.zeros(T, n_tok, dtype=torch.float64)
    reach = [0.0] * T
    reach[0] = 1.0
    for i in range(T):  # parents come before children: breadth-first order
        if reach[i] == 0.0:
            continue
        kids = list(children[i])
        moves, rest = _node_law(probs[i].double(), [int(tokens[c]) for c in kids])
        for c, m in zip(kids, moves):
            reach[c] += reach[i] * m
        law[i] += reach[i] * rest
    return law


def make_tree_case(
    paths, seed: int, *, zero_first_child: bool = False
) -> tuple[torch.Tensor, torch.Tensor, tuple[tuple[int, ...], ...]]:
    """``(probs [T, V], tokens [T], children)`` for a tree of ``paths``, drawn from ``seed``.

    Each node's distribution is ``softmax(2 randn)``, rounded to exact binary fractions (so
    every machine samples the same law); the children of a node hold distinct tokens among
    its likeliest, as a head's guesses would, so that a wrong rule moves a lot of mass.
    ``zero_first_child``: the first child of the root holds a token the root gives
    probability 0 (it must always be rejected).
    """
    tb = medusa.build_tree(paths)
    g = torch.Generator().manual_seed(seed)
    T = tb.size
    probs = torch.softmax(2 * torch.randn(T, V, generator=g, dtype=torch.float64), -1)
    tokens = torch.zeros(T, dtype=torch.long)
    tokens[0] = int(torch.randint(0, V, (), generator=g))
    for i in range(T):
        kids = tb.children[i]
        if not kids:
            continue
        likely = probs[i].argsort(descending=True)[: len(kids) + 1]
        pick = likely[torch.randperm(len(likely), generator=g)[: len(kids)]]
        tokens[list(kids)] = pick
    if zero_first_child and tb.children[0]:
        probs[0, int(tokens[tb.children[0][0]])] = 0.0
        probs[0] /= probs[0].sum()
    return round_probs(probs), tokens, tb.children


def _all_the_mass_left() -> tuple[torch.Tensor, torch.Tensor, tuple[tuple[int, ...], ...]]:
    # Two children share all of the root's mass: once the first is rejected, the second
    # holds everything left and must be accepted outright.
    probs = torch.full((3, V), 1.0 / V, dtype=torch.float64)
    probs[0] = torch.tensor([0.5, 0.0, 0.5, 0.0, 0.0, 0.0])
    return probs, torch.tensor([1, 0, 2]), ((1, 2), (), ())


# --------------------------------------------------------------------------- the walk


def _end_of(out, children, T: int, n_tok: int) -> tuple[int, int] | str:
    """``(last accepted node, token)`` of one returned walk, or what is wrong with it."""
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        return "return a pair (path, token): the accepted nodes and the emitted token"
    path, token = out
    if isinstance(path, torch.Tensor):
        path = path.flatten().tolist()
    if not isinstance(path, (list, tuple)):
        return "the path is a list of node indices (the accepted nodes, from depth 1 down)"
    node = 0
    for step in path:
        x = as_number(step)
        if x is None or not x.is_integer() or not 0 <= x < T or int(x) not in children[node]:
            return (
                f"the path {fmt(list(path))} is not a path of the tree: {fmt(step)} is not a "
                f"child of node {node}"
            )
        node = int(x)
    t = as_number(token)
    if t is None or not t.is_integer() or not 0 <= t < n_tok:
        return f"the token is an int in 0 .. {n_tok - 1}; got {fmt(token)}"
    return node, int(t)


def _diagnose_walk(ends: torch.Tensor, toks: torch.Tensor, law, probs, tokens, children) -> str:
    """What a walk whose samples fail the chi-square test probably does wrong."""
    T = probs.shape[0]
    seen = _counts(ends * V + toks, T * V).reshape(T, V)
    impossible = (torch.as_tensor(seen) > 0) & (law == 0)
    for i, t in impossible.nonzero().tolist():
        kids = [c for c in children[i] if int(tokens[c]) == t]
        if kids:
            return (
                f"the walk stopped at node {i} and emitted token {t}, the token of its child "
                f"{kids[0]}, which it had just rejected: a rejected child's token is out of the "
                "running (was it left in the node's distribution, or the token sampled from p "
                "instead of from what is left?)"
            )
        parent = next(j for j in range(T) if i in children[j]) if i else None
        if parent is not None and float(probs[parent, int(tokens[i])]) == 0.0:
            return (
                f"the walk accepted node {i}, whose token has probability 0 at node {parent}: "
                "such a child can never be accepted"
            )
        return f"the walk ended at node {i} with token {t}, which the rule never does"
    # Where the walk moves: each child's share of the walks that reach its parent.
    ended = torch.bincount(ends, minlength=T)
    through = [int(ended[_below(i, children)].sum()) for i in range(T)]
    for i in range(T):
        if through[i] < 50:
            continue
        reach_i = float(law[_below(i, children)].sum())
        if reach_i <= 0:
            continue
        for rank, c in enumerate(children[i]):
            want = float(law[_below(c, children)].sum()) / reach_i
            share = through[c] / through[i]
            sd = math.sqrt(max(want * (1 - want), 1e-12) / through[i])
            if abs(share - want) <= 6 * sd:
                continue
            if rank == 0:
                return (
                    f"node {c}, the first child of node {i}, was accepted in {share:.3f} of "
                    f"the walks that reached node {i}, expected {want:.3f}: the chance of "
                    f"accepting it is the probability of its token at node {i}"
                )
            return (
                f"node {c}, child {rank + 1} of node {i}, was accepted "
                f"{'too rarely' if share < want else 'too often'} ({share:.3f} of the walks "
                f"that reached node {i}, expected {want:.3f}): once a child is rejected, is "
                "what is left renormalised before the next one is tried?"
            )
    for i in range(T):
        stops = toks[ends == i]
        if len(stops) > 50 and stops.unique().numel() == 1 and int((law[i] > 0).sum()) > 1:
            return (
                f"every walk that stopped at node {i} emitted the same token: the token must "
                "be sampled from what is left, not its argmax"
            )
    return "the (last node, token) pairs do not follow the lossless walk's law"


def _below(i: int, children) -> list[int]:
    out, todo = [], [i]
    while todo:
        j = todo.pop()
        out.append(j)
        todo += list(children[j])
    return out


def _walk_case(fn, name: str, case, n: int, seed: int, fits: FitLog) -> Case:
    probs, tokens, children = case
    T = probs.shape[0]
    with seeded(case_seed(seed)) as g:
        # One round trip for all n walks when the function runs in a grading kernel.
        outs = call_repeat(name, n, fn, probs.clone(), tokens.clone(), children, generator=g)
    ends = torch.empty(n, dtype=torch.long)
    toks = torch.empty(n, dtype=torch.long)
    for k, out in enumerate(outs):
        end = _end_of(out, children, T, V)
        if isinstance(end, str):
            return Case(name, False, "(path, token), e.g. ([1, 4], 2)", fmt(out), end)
        ends[k], toks[k] = end
    law = exact_law(probs, tokens, children)
    r = chi_square_test(_counts(ends * V + toks, T * V), law.flatten())
    fits.add(r)
    return Case(
        f"{name}: {n} walks, chi-square on (last node, token)",
        r.passed,
        expected=f"the walk's exact law ({r.bins} outcomes)",
        got=str(r),
        message="" if r.passed else _diagnose_walk(ends, toks, law, probs, tokens, children),
        false_failure_rate=r.false_failure_rate,
    )


@register(
    "ex07.tree_walk",
    points=6,
    needs="tree_walk",
    title="the lossless walk: among the root's children, then down a tree",
    hint="lesson 06, section 5: each child is a one-hot draft, tried in turn against what "
    "is left of the node's distribution. Work out, by hand, the chance that the second child "
    "is accepted for p(first) = 0.4 and p(second) = 0.3; it must come out as 0.3. What is "
    "left for the fallback sample once both are rejected? Down a tree, the walk repeats that "
    "rule at every node it reaches, each with that node's own distribution; where does it end?",
)
def check_tree_walk(fn) -> Iterator[Case]:
    # One level first (the rule at a node), then whole trees; the summed fit of every
    # statistical case comes after them, and the exact greedy walk last.
    one_level = [
        ("a root with one child", make_tree_case([(0,)], case_seed(1)), 2000),
        ("a root with three children", make_tree_case([(0,), (1,), (2,)], case_seed(2)), 3000),
        (
            "a first child the target never picks (p = 0)",
            make_tree_case([(0,), (1,)], case_seed(3), zero_first_child=True),
            2000,
        ),
        ("a second child that holds all the mass left", _all_the_mass_left(), 1000),
    ]
    if fresh_cases():  # the batch grader's: a random number of children, drawn for this run
        g = torch.Generator().manual_seed(case_seed(9))
        m = int(torch.randint(1, 6, (), generator=g))
        one_level.append(
            (
                f"a root with {m} children",
                make_tree_case([(r,) for r in range(m)], case_seed(8)),
                3000,
            )
        )
    trees = [
        ("a chain of three", make_tree_case(CHAIN, case_seed(22)), 3000),
        (
            "TREE_SMALL (four children, one grandchild)",
            make_tree_case(list(medusa.TREE_SMALL), case_seed(23)),
            3000,
        ),
        ("a tree three deep", make_tree_case(DEEP, case_seed(24)), 4000),
    ]
    if fresh_cases():
        trees.append(
            ("a random tree", make_tree_case(_random_paths(case_seed(25)), case_seed(26)), 4000)
        )
    fits = FitLog()
    for k, (name, case, n) in enumerate(one_level):
        res = _walk_case(fn, name, case, n, 100 + k, fits)
        yield res
        if not res.passed:
            return
    for k, (name, case, n) in enumerate(trees):
        res = _walk_case(fn, name, case, n, 200 + k, fits)
        yield res
        if not res.passed:
            return
    fit = fits.case()
    yield fit
    if not fit.passed:
        return
    # Temperature 0: one-hot rows make the walk the greedy one, exactly.
    probs, tokens, children = make_tree_case(DEEP, case_seed(20))
    greedy = torch.nn.functional.one_hot(probs.argmax(-1), V).double()
    tl = tokens.tolist()
    node, token = _greedy_walk(greedy, tl, children, len(tl))
    want = (list(medusa.build_tree(DEEP).path_lists[node]), token)
    name = "temperature 0 (one-hot rows): the greedy walk"
    with seeded(case_seed(21)) as g:
        outs = call_repeat(name, 20, fn, greedy.clone(), tokens.clone(), children, generator=g)
    for out in outs:
        end = _end_of(out, children, len(tl), V)
        got = (
            end
            if isinstance(end, str)
            else (list(medusa.build_tree(DEEP).path_lists[end[0]]), end[1])
        )
        if got != want:
            yield Case(
                name,
                False,
                f"path {want[0]}, token {want[1]}",
                fmt(out),
                end
                if isinstance(end, str)
                else "with one-hot rows a child is accepted exactly when its token is the "
                "target's argmax, and the emitted token is the argmax",
            )
            return
    yield Case(name, True)


def _random_paths(seed: int) -> list[tuple[int, ...]]:
    """A random tree: depth up to 3, up to 3 children a node, at most 9 nodes."""
    g = torch.Generator().manual_seed(seed)
    paths, frontier = [], [()]
    while frontier and len(paths) < 8:
        parent = frontier.pop(0)
        for r in range(int(torch.randint(1 if not parent else 0, 4, (), generator=g))):
            paths.append((*parent, r))
            if len(parent) < 2:
                frontier.append((*parent, r))
    return paths[:8]
