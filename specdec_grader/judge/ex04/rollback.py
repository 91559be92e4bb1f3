"""Check ``ex04.rollback``: a batch of rows, each cropped to its prefix and its accepted drafts.

Rows share one cache but not their lengths: row ``b`` held ``prefix_lens[b]`` committed
tokens, the target call fed it its drafts, and the verifier accepted ``num_accepted[b]`` of
them. The new length of row ``b`` is ``prefix_lens[b] + num_accepted[b]``. Lesson 04's
one-row code (one ``cache.crop(n)``, one number for the cache) gives every row the same
length; the check names that mistake.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .._support import as_vector, fmt
from ..core import Case, StudentError, call_inplace, register


def _vec(xs) -> str:
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


# (label, lengths after the target call, prefix lengths, accepted): rows that fed different
# numbers of drafts, each accepting its own number of them.
_ROLLBACK_CASES = [
    ("one row, rejection at position 3", [15], [10], [2]),
    ("three rows of equal prefix, 0, 2 and all 5 accepted", [15, 15, 15], [10, 10, 10], [0, 2, 5]),
    ("ragged rows: prefixes 12, 7, 20; 4, 4, 2 drafts fed", [16, 11, 22], [12, 7, 20], [3, 0, 2]),
    ("four rows, row 0 accepting most", [9, 14, 6, 30], [5, 10, 2, 26], [4, 1, 0, 2]),
]


def _diagnose(got: torch.Tensor, lengths, prefix, a) -> str:
    want = prefix + a
    if torch.equal(got, lengths.double()):
        return "the lengths did not change: nothing was rolled back"
    if torch.equal(got, (want + (a < lengths - prefix).long()).double()):
        return (
            "you kept the rejected draft: a row that rejected a draft keeps its prefix and "
            "its accepted drafts only"
        )
    if got.numel() > 1 and bool((got == got[0]).all()) and not bool((want == want[0]).all()):
        return (
            "every row got the same length, as one crop of the whole cache gives one sequence "
            "(lesson 04's one-row rollback): in a batch each row keeps its own prefix and its "
            "own accepted drafts"
        )
    if torch.equal(got, (prefix + a[0]).double()) or torch.equal(got, (prefix[0] + a).double()):
        return "row 0's numbers were used for every row: each row has its own prefix and count"
    if torch.equal(got, (want - 1).double()):
        return "one position too few in every row: the prefix and every accepted draft stay"
    return "the new lengths are not each row's prefix plus its accepted drafts"


def _bad_rollback(fn, lengths, prefix, a) -> Case:
    name = (
        f"rollback({_vec(lengths)}, {_vec(prefix)}, {_vec(a)}) raises ValueError "
        "(a row cannot accept more drafts than it fed, nor a negative number)"
    )
    try:
        call_inplace(name, fn, lengths, prefix, a)
    except NotImplementedError:
        raise
    except StudentError as e:
        exc = e.exc
        if isinstance(exc, ValueError):
            return Case(name, True)
        return Case(
            name, False, "ValueError", type(exc).__name__, "the wrong kind of error for bad input"
        )
    return Case(
        name,
        False,
        "ValueError",
        "no error",
        "every row must be checked, not only the first: a row whose count the cache cannot "
        "hold must raise ValueError",
    )


@register(
    "ex04.rollback",
    points=2,
    needs="rollback",
    title="rolling a batch of ragged rows back to prefix + accepted drafts",
    hint="draw section 1's scene for two rows that accepted different numbers of drafts: "
    "which positions of each row hold its prefix, which its accepted drafts? How many "
    "drafts can a row's cache hold at most?",
)
def check_rollback(fn) -> Iterator[Case]:
    for label, lengths, prefix, accepted in _ROLLBACK_CASES:
        lengths, prefix, a = (torch.tensor(x) for x in (lengths, prefix, accepted))
        want = prefix + a
        name = f"{label}: rollback({_vec(lengths)}, {_vec(prefix)}, {_vec(a)})"
        raw, after = call_inplace(name, fn, lengths, prefix, a)
        got = as_vector(raw)
        if got is None or got.shape != want.shape or not torch.equal(got, want.double()):
            msg = "return each row's new length, a tensor of B whole numbers"
            if got is not None and got.shape == want.shape:
                msg = _diagnose(got, lengths, prefix, a)
            yield Case(name, False, f"new lengths {_vec(want)}", fmt(raw), msg)
            return
        if not all(
            isinstance(x, torch.Tensor) and x.shape == y.shape and torch.equal(x, y)
            for x, y in zip(after, (lengths, prefix, a))
        ):
            yield Case(
                name,
                False,
                "lengths, prefix_lens and num_accepted unchanged",
                "changed in place",
                "your rollback changed the caller's tensors; return the new lengths",
            )
            return
        yield Case(f"{name} = {_vec(want)}", True)
    yield _bad_rollback(fn, torch.tensor([15, 15]), torch.tensor([10, 10]), torch.tensor([2, 6]))
    yield _bad_rollback(fn, torch.tensor([15, 15]), torch.tensor([10, 10]), torch.tensor([-1, 0]))
