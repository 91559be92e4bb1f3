"""Exercise 11's references and the check of ``lookup_copy``: the copy rule, compared
exactly with :func:`reference_copy` on named and random contexts, a wrong answer named by the
slip it matches (see the package's docstring)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from .._support import as_vector, first_wrong, fmt
from ..context import case_seed
from ..core import Case, call, register

# --------------------------------------------------------------------------- references


def copy_variant(
    ctx: Sequence[int],
    k: int,
    min_n: int,
    max_n: int,
    *,
    latest: bool = False,
    shortest_first: bool = False,
    self_match: bool = False,
    no_overlap: bool = False,
    with_ngram: bool = False,
) -> list[int]:
    """The copy rule (every flag off), or one of its common slips (a flag on)."""
    ctx = [int(x) for x in ctx]
    n = len(ctx)
    sizes = list(range(min(max_n, n - 1), min_n - 1, -1))
    if shortest_first:
        sizes.reverse()
    for s in sizes:
        if s < 1:
            continue
        pattern = ctx[n - s :]
        last = n - s if self_match else (n - 2 * s if no_overlap else n - s - 1)
        starts = [i for i in range(0, last + 1) if ctx[i : i + s] == pattern]
        if starts:
            i = starts[-1] if latest else starts[0]
            begin = i if with_ngram else i + s
            return ctx[begin : min(begin + k, n)]
    return []


def reference_copy(ctx: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``k`` tokens after the earliest earlier occurrence of the longest suffix n-gram
    of ``ctx`` with ``min_n <= n <= max_n`` (``specdec_course.llm.lookup.lookup``'s rule)."""
    return copy_variant(ctx, k, min_n, max_n)


def reference_propose(ctx, k, vocab_size, min_n, max_n) -> tuple[torch.Tensor, torch.Tensor]:
    """``(drafts [kk], q [kk, V])``: the copy and its one-hot rows (float32)."""
    d = torch.tensor(reference_copy(ctx, k, min_n, max_n), dtype=torch.int64)
    q = torch.zeros(d.numel(), vocab_size)
    q[torch.arange(d.numel()), d] = 1.0
    return d, q


# --------------------------------------------------------------------------- lookup_copy

# (name, context, k, min_n, max_n): each tells the rule from one slip.
NAMED = [
    ("no match: the last token never occurred before", [1, 2, 3, 4, 5], 3, 1, 3),
    ("one match: copy what followed it", [5, 1, 2, 3, 9, 9, 1, 2], 3, 1, 3),
    ("several matches of the same n-gram", [1, 2, 3, 4, 1, 2, 7, 8, 1, 2], 2, 1, 2),
    ("a longer match beats a shorter, earlier one", [2, 5, 9, 7, 2, 6, 4, 7, 2], 2, 1, 3),
    ("a match near the end: only what the text holds after it", [4, 1, 2, 5, 1, 2], 5, 1, 2),
    ("a match that overlaps the last n-gram", [9, 3, 3, 5, 3, 3, 3, 3], 3, 1, 3),
    ("the longest n-grams occur only as themselves", [5, 3, 1, 2, 3], 2, 1, 3),
    ("max_n caps the n-gram", [2, 3, 8, 1, 2, 3, 9, 2, 3, 7, 1, 2, 3], 1, 1, 2),
    ("min_n: a shorter match does not count", [1, 2, 3, 4, 2], 2, 2, 3),
    ("k = 1", [1, 2, 1], 1, 1, 2),
    ("one token: nothing to match", [7], 2, 1, 3),
    ("the empty context", [], 2, 1, 3),
]

_SLIPS = [
    (dict(latest=True), "you took the most recent occurrence of the n-gram; the rule takes the "
     "earliest one (its first occurrence in the text)"),
    (dict(shortest_first=True), "you tried the shortest n first; the rule tries the longest "
     "n-gram first (max_n down to min_n) and stops at the first n that occurs earlier"),
    (dict(self_match=True), "the last n-gram matched itself: an occurrence counts only with at "
     "least one token after it, so the suffix itself never does (try a shorter n instead)"),
    (dict(no_overlap=True), "an earlier occurrence may overlap the last n-gram itself: it only "
     "needs at least one token after it"),
    (dict(with_ngram=True), "you copied the matched n-gram too: the drafts are the tokens that "
     "follow it"),
]  # fmt: skip


def _random_contexts(seed: int, count: int) -> list[tuple[list[int], int, int, int]]:
    g = torch.Generator().manual_seed(case_seed(seed))
    out = []
    for _ in range(count):
        V = int(torch.randint(2, 6, (), generator=g))
        n = int(torch.randint(0, 31, (), generator=g))
        lo = int(torch.randint(1, 4, (), generator=g))
        hi = lo + int(torch.randint(0, 3, (), generator=g))
        k = int(torch.randint(1, 9, (), generator=g))
        out.append((torch.randint(0, V, (n,), generator=g).tolist(), k, lo, hi))
    return out


def _ids(raw) -> list[int] | None:
    """Student output as a list of ints, or None when it is not a 1-D list of whole numbers."""
    v = as_vector(raw)
    if v is None or v.dim() != 1 or not bool(torch.isfinite(v).all()):
        return None
    if not all(float(x).is_integer() for x in v.tolist()):
        return None
    return [int(x) for x in v.tolist()]


def diagnose_copy(ctx, k, min_n, max_n, got: list[int]) -> str:
    """What a wrong copy probably got wrong."""
    exp = reference_copy(ctx, k, min_n, max_n)
    if len(got) > k:
        return f"at most k = {k} tokens are copied"
    for flags, why in _SLIPS:
        if got == copy_variant(ctx, k, min_n, max_n, **flags) != exp:
            return why
    if got == copy_variant(ctx, k, min_n, len(ctx)) != exp:
        return f"the n-gram is never longer than max_n = {max_n}"
    if got == copy_variant(ctx, k, 1, max_n) != exp:
        return (f"no n-gram shorter than min_n = {min_n} counts: without a match of that many "
                "tokens or more there are no drafts")  # fmt: skip
    if not exp and got:
        return "no n-gram of min_n to max_n tokens occurs earlier with a token after it: no drafts"
    if exp and not got:
        return "an earlier occurrence exists: copy what follows it"
    return "not the tokens the copy rule proposes"


def _copy_case(fn, name: str, ctx, k: int, min_n: int, max_n: int) -> Case:
    label = f"{name}: lookup_copy({ctx}, k={k}, min_n={min_n}, max_n={max_n})"
    exp = reference_copy(ctx, k, min_n, max_n)
    raw = call(label, fn, list(ctx), k, min_n, max_n)
    got = _ids(raw)
    if got is None:
        return Case(label, False, str(exp), fmt(raw), "return the drafts as a list of token ids")
    ok = got == exp
    return Case(
        label, ok, str(exp), str(got), "" if ok else diagnose_copy(ctx, k, min_n, max_n, got)
    )


@register(
    "ex11.lookup_copy",
    points=6,
    needs="lookup_copy",
    title="the copy rule: the longest earlier match of the text's last n-gram",
    hint="work the named case by hand on paper: which n is tried first, where may an earlier "
    "occurrence start and end (what must come after it?), and which occurrence wins when "
    "there are several? Lesson 11, section 3, and the rule in the notebook's first section",
)
def check_lookup_copy(fn) -> Iterator[Case]:
    for name, ctx, k, lo, hi in NAMED:
        yield _copy_case(fn, name, ctx, k, lo, hi)
    rand = _random_contexts(1, 60)
    yield first_wrong(
        "60 random contexts",
        (_copy_case(fn, f"60 random contexts, {i}", *x) for i, x in enumerate(rand)),
    )
