"""Check ``ex03.rollback``: ragged rows rolled back after verification, each by its own
rejected count, the buffers untouched, and the next cached step still equal to the package's.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .._support import as_vector, fmt
from ..core import Case, call_inplace, register
from ._common import _lengths_text, _like
from .attention import _compare_step, _Ragged


def _bad_rollback(rollback, K, V, lengths, rejected) -> Case:
    name = f"rollback with lengths {_lengths_text(lengths)}, {_lengths_text(rejected)} rejected"
    try:
        rollback(K, V, lengths.clone(), rejected.clone())
    except ValueError:
        return Case(f"{name} raises ValueError", True)
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - the wrong kind of error is a failed case
        return Case(
            f"{name} raises ValueError",
            False,
            "ValueError",
            type(e).__name__,
            "raise ValueError for a row that cannot be rolled back",
        )
    return Case(
        f"{name} raises ValueError",
        False,
        "ValueError",
        "no error",
        "a row cannot forget more positions than it holds, nor a negative number: that "
        "call must raise ValueError",
    )


@register(
    "ex03.rollback",
    points=2,
    needs=("cached_attention", "rollback"),
    title="rolling ragged rows back after verification",
    hint="each row forgets its own rejected positions, and a forgotten position needs no "
    "clearing: the next step overwrites it, provided every row's length says where its "
    "cache ends",
)
def check_rollback(attend, rollback) -> Iterator[Case]:
    cases = [
        ("nothing, some and everything rejected", [0, 0, 0], 8, [0, 3, 8]),
        ("ragged rows", [2, 6, 0], 5, [1, 5, 0]),
        ("equal rows, equal rollback", [4, 4], 3, [2, 2]),
    ]
    for seed, (name, start, fed, rejected) in enumerate(cases):
        ref = _Ragged(10 + seed, start)
        failed = _compare_step(f"{name}: before the rollback", attend, ref, fed)
        if failed is not None:
            yield failed
            return
        lengths, r = ref.lengths, torch.tensor(rejected)
        K_before, V_before = ref.K.clone(), ref.V.clone()
        label = f"{name}: rollback(K, V, {_lengths_text(lengths)}, {_lengths_text(r)})"
        raw, after = call_inplace(label, rollback, ref.K, ref.V, lengths, r)
        got = as_vector(raw)
        K_after, V_after, lengths_in, r_in = after
        want = lengths - r
        if got is None or got.shape != want.shape or not torch.equal(got, want.double()):
            msg = "the new lengths are wrong"
            if got is not None and got.shape == want.shape:
                if torch.equal(got, r.double()):
                    msg = "you returned the numbers rejected; return each row's new length"
                elif torch.equal(got, lengths.double()):
                    msg = "the lengths did not change: nothing was rolled back"
                elif torch.equal(got, (lengths + r).double()):
                    msg = "a rollback shortens each row by what it rejected; yours grew"
            yield Case(label, False, f"new lengths {_lengths_text(want)}", fmt(got), msg)
            return
        if not (
            _like(lengths_in, lengths)
            and _like(r_in, r)
            and torch.equal(lengths_in, lengths)
            and torch.equal(r_in, r)
        ):
            yield Case(
                label,
                False,
                "lengths and num_rejected unchanged",
                "changed in place",
                "your rollback changed the caller's lengths or num_rejected; return new lengths",
            )
            return
        if not (
            _like(K_after, K_before)
            and _like(V_after, V_before)
            and torch.equal(K_after, K_before)
            and torch.equal(V_after, V_before)
        ):
            yield Case(
                label,
                False,
                "K and V unchanged",
                "the buffers changed",
                "a rollback moves the lengths only: no copying, no zeroing",
            )
            return
        for cache, n in zip(ref.caches, want.tolist()):
            cache.crop(n)  # the package's rollback, row by row
        failed = _compare_step(f"{name}: the step after the rollback", attend, ref, 2)
        yield failed or Case(
            f"{name}: rolled back to {_lengths_text(want)}, the next step equals the package", True
        )
    ref = _Ragged(99, [0, 0, 0])
    lengths = torch.tensor([8, 8, 8])
    for bad in ([0, 9, 0], [-1, 0, 0]):
        yield _bad_rollback(rollback, ref.K, ref.V, lengths, torch.tensor(bad))
