"""Exercise 07, compaction: the accepted path moved into place in the KV cache."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from specdec_course import medusa
from specdec_course.decoding import caches_consistent
from specdec_course.model import GPTConfig, KVCache

from .._support import random_model
from ..context import cache_writes, case_seed, fresh_cases
from ..core import Case, call, register
from .walk import DEEP

__all__ = ["check_compact_cache"]

# --------------------------------------------------------------------------- compaction

CFG = GPTConfig(vocab_size=11, block_size=32, n_layer=2, n_head=2, n_embd=8)


def _filled_cache(seed: int, length: int) -> KVCache:
    cache = KVCache(CFG, 1)
    g = torch.Generator().manual_seed(seed)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    cache.length = length
    return cache


def _moved(cache: KVCache, src: list[int], dst: list[int], length: int, which=("k", "v")):
    """A copy of ``cache`` with slots ``src`` copied to ``dst`` (diagnosis: the wrong moves)."""
    out = KVCache(CFG, 1)
    out.k.copy_(cache.k)
    out.v.copy_(cache.v)
    for name in which:
        buf = getattr(out, name)
        if src:
            buf[:, :, :, dst] = buf[:, :, :, src].clone()
    out.length = length
    return out


def _same(a: KVCache, b: KVCache) -> bool:
    L = a.length
    return (
        a.length == b.length
        and torch.equal(a.k[..., :L, :], b.k[..., :L, :])
        and torch.equal(a.v[..., :L, :], b.v[..., :L, :])
    )


def _diagnose_compaction(before: KVCache, got: KVCache, start: int, path: list[int]) -> str:
    a = len(path)
    want_len = start + 1 + a
    if got.length != want_len:
        return (
            f"cache.length is {got.length}; it should count the prefix, the root and the "
            f"{a} accepted node(s)"
        )
    if not (
        torch.equal(got.k[..., : start + 1, :], before.k[..., : start + 1, :])
        and torch.equal(got.v[..., : start + 1, :], before.v[..., : start + 1, :])
    ):
        if a and _same(
            got, _moved(before, [start + i for i in path], [start + d for d in range(a)], want_len)
        ):
            return (
                "the path was moved one slot too far down: it overwrote the root, which "
                "stays where the tree pass wrote it"
            )
        return "the cached prefix or the root changed: only the slots after the root move"
    dst = [start + 1 + d for d in range(a)]
    wrong = {
        "nothing moved: only the length changed": ([], []),
        "the accepted nodes were read from slots counted from 0, not from where the tree "
        "pass wrote them (after the prefix)": (list(path), dst),
        "the first accepted nodes of the tree's order were kept, not the accepted path": (
            [start + 1 + d for d in range(a)],
            dst,
        ),
    }
    for why, (src, to) in wrong.items():
        if _same(got, _moved(before, src, to, want_len)):
            return why
    for name in ("k", "v"):
        if _same(got, _moved(before, [start + i for i in path], dst, want_len, which=(name,))):
            other = "values" if name == "k" else "keys"
            return f"only the {'keys' if name == 'k' else 'values'} moved: the {other} must follow"
    first = next(
        (
            d
            for d in range(a)
            if not torch.equal(got.k[..., dst[d], :], before.k[..., start + path[d], :])
        ),
        None,
    )
    if first is not None:
        return (
            f"slot {dst[first]} does not hold node {path[first]}'s keys (every layer, every "
            "head): the accepted nodes go right after the root, in path order"
        )
    return "the compacted cache differs from the package's compaction"


def _compaction_case(fn, name: str, start: int, tree: list, node: int, seed: int) -> Case:
    tb = medusa.build_tree(tree)
    path = list(tb.path_lists[node])
    before = _filled_cache(seed, start + tb.size)
    want = _moved(before, [], [], before.length)
    medusa.compact_cache(want, start, path)  # the package's compaction
    cache = _moved(before, [], [], before.length)
    with cache_writes():  # the API moves the cache's slots: its writes come back
        call(name, fn, cache, start, list(path))
    if _same(cache, want):
        return Case(name, True)
    return Case(
        name,
        False,
        f"length {want.length}; slots {start + 1}..{want.length - 1} hold nodes {path}",
        f"length {cache.length}",
        _diagnose_compaction(before, cache, start, path),
    )


def _model_case(fn, seed: int) -> Case:
    """A real tree pass on a small random model, compacted, against a fresh run."""
    name = "after a real tree pass, the cache equals a fresh run over the accepted text"
    model = random_model(CFG, seed, 3.0, frozen=True)
    tb = medusa.build_tree(DEEP)
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, CFG.vocab_size, (7,), generator=g)
    tokens = torch.randint(0, CFG.vocab_size, (tb.size,), generator=g)
    cache = model.new_cache(1)
    with torch.no_grad():
        model(prefix[None], cache)
        medusa.tree_forward(model, tokens, cache, tb)
    node = 6  # the path (0, 0, 0): three nodes, the last ones not where a chain would be
    path = list(tb.path_lists[node])
    with cache_writes():
        call(name, fn, cache, prefix.numel(), path)
    accepted = torch.cat([prefix, tokens[[0, *path]]])
    if cache.length == accepted.numel() and caches_consistent(model, cache, accepted):
        return Case(name, True)
    return Case(
        name,
        False,
        f"length {accepted.numel()}, keys and values of a fresh run",
        f"length {cache.length}",
        "the compacted cache is not what a plain pass over the accepted text writes",
    )


@register(
    "ex07.compact_cache",
    points=4,
    needs="compact_cache",
    title="keeping the accepted path in the cache",
    hint="lesson 06, section 3: the tree pass wrote node i at slot start + i; after the walk "
    "the cache must read as if only the root and the accepted path had been fed, one after "
    "the other. Which slots are already right, which must move where, and in which order "
    "is a copy safe?",
)
def check_compact_cache(fn) -> Iterator[Case]:
    large = list(medusa.TREE_LARGE)
    tb = medusa.build_tree(large)
    deepest = max(range(tb.size), key=lambda i: (len(tb.path_lists[i]), i))
    cases = [
        ("nothing accepted: the root alone stays", 5, large, 0),
        ("the first child accepted: already in place", 5, large, 1),
        ("a second-rank child accepted", 0, large, 2),
        (f"a path of {len(tb.path_lists[deepest])} nodes", 9, large, deepest),
        ("a path through the last nodes of the tree", 3, DEEP, 7),
    ]
    if fresh_cases():
        g = torch.Generator().manual_seed(case_seed(30))
        cases.append(
            (
                "a random path",
                int(torch.randint(0, 12, (), generator=g)),
                large,
                int(torch.randint(1, tb.size, (), generator=g)),
            )
        )
    for k, (label, start, tree, node) in enumerate(cases):
        path = list(medusa.build_tree(tree).path_lists[node])
        res = _compaction_case(
            fn, f"{label} (start {start}, path {path})", start, tree, node, case_seed(300 + k)
        )
        yield res
        if not res.passed:
            return
    yield _model_case(fn, case_seed(310))
