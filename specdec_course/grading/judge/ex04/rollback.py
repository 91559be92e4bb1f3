"""Check ``ex04.rollback``: the target cache cropped to the prefix and the accepted drafts."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from specdec_course.decoding import caches_consistent

from ..core import Case, call, register
from ._common import ATOL, V, _fed, _models, _next_logits, _tokens

_ROLLBACK_CASES = [
    # (label, number accepted of the 5 drafts)
    ("rejection at position 3 (2 accepted)", 2),
    ("rejection at position 1 (0 accepted)", 0),
    ("rejection at position 5 (4 accepted)", 4),
    ("all 5 drafts accepted", 5),
]


def _rollback_case(label, fn, target, prefix, drafts, a) -> Case:
    n, k = prefix.numel(), drafts.numel()
    cache = _fed(target, torch.cat([prefix, drafts]))
    call(label, fn, cache, n, a)
    keep = torch.cat([prefix, drafts[:a]])
    want = n + a
    got = cache.length
    if got != want:
        if got == want + 1 and a < k:
            msg = (
                f"you kept the rejected draft (position {a + 1}): only the {n}-token prefix "
                f"and the {a} accepted drafts stay in the cache"
            )
        elif got == want - 1:
            msg = "one position too few: the prefix and every accepted draft stay"
        elif got == n + k and a < k:
            msg = "the cache was not rolled back"
        else:
            msg = "the cache holds neither more nor less than the prefix and the accepted drafts"
        return Case(label, False, f"cache.length {want} ({n} prefix + {a} accepted)", f"{got}", msg)
    if not caches_consistent(target, cache, keep):
        return Case(
            label,
            False,
            "the first positions unchanged",
            "keys/values differ from a fresh run over the kept tokens",
            "the cached keys and values changed: a rollback moves the length only",
        )
    # The next step sees exactly what a fresh run over the kept tokens would.
    t = torch.tensor([(int(drafts[a]) + 1) % V if a < k else 3])
    with torch.no_grad():
        nxt = target(t[None], cache)[0, -1]
    fresh = _next_logits(target, torch.cat([keep, t]))
    diff = (nxt - fresh).abs().max().item()
    if not diff <= ATOL:  # (NaN fails too)
        return Case(
            label,
            False,
            "the next step's logits equal a fresh run over the kept tokens + the new one",
            f"largest difference {diff:.2e}",
            "after the rollback the next forward does not continue from the kept tokens: "
            "were the cached keys and values changed?",
        )
    return Case(f"{label}: cache holds {want} positions, next step equals a fresh run", True)


def _raises_value_error(label, fn, target, prefix, drafts, a) -> Case:
    cache = _fed(target, torch.cat([prefix, drafts]))
    name = f"rollback(cache, {prefix.numel()}, {a}) with {drafts.numel()} drafts raises ValueError"
    try:
        fn(cache, prefix.numel(), a)
    except ValueError:
        return Case(name, True)
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - the wrong kind of error is a failed case
        return Case(
            name, False, "ValueError", type(e).__name__, "the wrong kind of error for bad input"
        )
    return Case(
        name,
        False,
        "ValueError",
        f"no error (cache.length {cache.length})",
        "a number of accepted drafts that the cache cannot hold must raise ValueError",
    )


@register(
    "ex04.rollback",
    points=2,
    needs="rollback",
    title="rolling the target cache back to prefix + accepted drafts",
    hint="draw the scene of section 1: which positions of the cache hold the prefix, which "
    "the accepted drafts, which the rejected one and those after it? A crop keeps the "
    "first positions only; how many drafts can the cache hold at most?",
)
def check_rollback(fn) -> Iterator[Case]:
    target, _ = _models()
    prefix, drafts = _tokens(10, 100), _tokens(5, 101)
    for label, a in _ROLLBACK_CASES:
        case = _rollback_case(f"10-token prefix, 5 drafts, {label}", fn, target, prefix, drafts, a)
        yield case
        if not case.passed:
            return
    # A second round on top of the first: the prefix is now 13 tokens (12 kept + 1 new).
    first = torch.cat([prefix, drafts[:2], torch.tensor([(int(drafts[2]) + 1) % V])])
    more = _tokens(5, 102)
    yield _rollback_case(
        "a second step: 13-token prefix, 5 drafts, 3 accepted", fn, target, first, more, 3
    )
    yield _raises_value_error("", fn, target, prefix, drafts, -1)
    yield _raises_value_error("", fn, target, prefix, drafts, 6)
