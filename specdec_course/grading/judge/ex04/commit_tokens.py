"""Check ``ex04.commit_tokens``: the verifier's tokens committed, both caches rolled back.

What a commit must leave (the ids, both cache lengths and contents) is checked by one
function, :func:`_commit_problem`, that ``ex04.speculative_step`` uses too: a step ends with
the same bookkeeping.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from specdec_course.decoding import caches_consistent
from specdec_course.model import CharGPT, KVCache

from .._support import fmt
from ..core import Case, StudentError, call, register
from ._common import _as_ids, _fed, _models, _text, _tokens, _verifier_row


def _diagnose_ids(ids, expected, got, a, k) -> str:
    n = ids.numel()
    if (got < 0).any():
        return "your ids contain -1: those are the verifier's placeholders, not tokens"
    if got.numel() == n + a and torch.equal(got, expected[: n + a]):
        if a == k:
            return (
                "you dropped the bonus token: when all k drafts are accepted the verifier adds "
                "one more token, drawn from the target's last row"
            )
        return (
            "you dropped the recovered token: after the accepted drafts the verifier emits one "
            "new token of its own"
        )
    if got.numel() == n + a + 1 and torch.equal(got[: n + a], expected[: n + a]):
        return "the last token is not the one the verifier emitted (the rejected draft?)"
    if got.numel() == a + 1:
        return "only the new tokens came back: return every committed token, old and new"
    return "the new ids are not the old ids followed by the verifier's accepted and new tokens"


def _diagnose_target(got: int, n: int, a: int, k: int) -> str:
    new = n + a + 1
    if got == new:
        return (
            f"you kept the rejected draft: the target cache holds {got} positions, the last of "
            f"them draft {a + 1}, which was rejected"
        )
    if got == n + k:
        return "the target cache was not rolled back"
    if got == new - 2:
        return "one position too few: a committed token is missing from the target cache"
    return "the target cache does not hold what the conventions say (see the notebook's top)"


def _diagnose_draft(got: int, want: int, n: int, a: int, k: int) -> str:
    new = n + a + 1
    if a == k and got == new - 1:
        return (
            "you forgot the draft's catch-up: after full acceptance the draft model never fed "
            f"its own last draft d_{k}, so its cache cannot hold it. Setting cache.length past "
            "what was fed leaves garbage in the cache"
        )
    if a < k - 1 and got == new:
        return f"the draft cache still holds the rejected draft d_{a + 1}"
    if got == n + k - 1 and want != got:
        return "the draft cache was not rolled back"
    if got < want:
        return (
            "the draft cache was cropped too far: it dropped committed tokens it had already "
            "fed, which it would have to feed again"
        )
    return "the draft cache does not hold what the conventions say (see the notebook's top)"


def _crop_error(e: StudentError, tc_len: int, dc_len: int, a: int, k: int) -> str | None:
    """A message for a ``KVCache.crop`` ValueError raised inside the student's code."""
    if not isinstance(e.exc, ValueError):
        return None
    m = re.search(r"cache\.length \((\d+)\); got (-?\d+)", str(e.exc))
    if not m:
        return None
    length, n_asked = int(m.group(1)), int(m.group(2))
    if length == dc_len and a == k:
        return (
            f"you forgot the draft's catch-up: after full acceptance the draft cache holds "
            f"{dc_len} positions (it never fed its last draft d_{k}), and crop({n_asked}) "
            "cannot grow it"
        )
    if length == tc_len and n_asked == tc_len + 1:
        return (
            f"crop({n_asked}) on a target cache of {tc_len} positions: the newest committed "
            "token is pending, not cached"
        )
    return None


_CROP_ONLY = "the cached keys and values changed: rolling back moves the length only"


def _commit_problem(
    label: str,
    out,
    ids: torch.Tensor,
    expected: torch.Tensor,
    a: int,
    k: int,
    target: tuple[CharGPT, KVCache],
    draft: tuple[CharGPT, KVCache],
    *,
    spelled_out: bool,
    cache_message: str,
) -> Case | None:
    """The first thing wrong after a commit of ``a`` of ``k`` drafts, else ``None``.

    Checked in order: the ids returned (``out``, to equal ``expected``), the target cache's
    length, the draft cache's (which had fed the ``n`` committed tokens and ``k - 1`` drafts),
    then both caches' contents, said by ``cache_message`` (``{name}``: which cache).
    ``spelled_out`` shows the expected lengths with their formulas and every expected id
    (``ex04.commit_tokens``; ``ex04.speculative_step``'s labels are long already).
    """
    n = ids.numel()
    (target_model, tc), (draft_model, dc) = target, draft
    got = _as_ids(out)
    if got is None:
        return Case(
            label,
            False,
            f"new ids {_text(expected)}"
            if spelled_out
            else f"new ids {_text(expected[n:])} after the {n} old ones",
            fmt(out),
            "return the new committed ids as a 1-D int64 tensor",
        )
    if not torch.equal(got, expected):
        shown = f"{_text(got[n:])} after them ({got.numel()} ids)"
        return Case(
            label,
            False,
            f"new ids {_text(expected[n:])} after the {n} old ones",
            _text(got) if spelled_out and got.numel() < n else shown,
            _diagnose_ids(ids, expected, got, a, k),
        )
    n_new = expected.numel()
    if tc.length != n_new - 1:
        return Case(
            label,
            False,
            f"target cache length {n_new - 1}",
            str(tc.length),
            _diagnose_target(tc.length, n, a, k),
        )
    fed = n + k - 1
    want_dc = min(fed, n_new - 1)
    if dc.length != want_dc:
        return Case(
            label,
            False,
            f"draft cache length {want_dc}",
            str(dc.length),
            _diagnose_draft(dc.length, want_dc, n, a, k),
        )
    for name, model, cache in (("target", target_model, tc), ("draft", draft_model, dc)):
        if not caches_consistent(model, cache, expected):
            return Case(
                label,
                False,
                f"the {name} cache equals a fresh run over the committed tokens",
                "its keys/values differ",
                cache_message.format(name=name),
            )
    return None


def _commit_case(fn, target, draft, n: int, k: int, a: int, seed: int) -> Case:
    ids, drafts = _tokens(n, seed), _tokens(k, seed + 1)
    # The caches as one step leaves them before verification: the target scored the pending
    # token and all k drafts; the draft fed every draft but its last.
    tc = _fed(target, torch.cat([ids, drafts]))
    dc = _fed(draft, torch.cat([ids, drafts[: k - 1]]))
    with torch.no_grad():
        p = target(torch.cat([ids, drafts])[None])[0, n - 1 :].softmax(-1)
    res = _verifier_row(drafts, a, p)
    what = "full acceptance, bonus token" if a == k else f"rejection at position {a + 1}"
    label = f"n = {n}, k = {k}, {a} accepted ({what})"
    tc_len, dc_len = tc.length, dc.length
    try:
        out = call(label, fn, ids.clone(), res.token_ids.clone(), res.num_accepted.clone(), tc, dc)
    except StudentError as e:
        msg = _crop_error(e, tc_len, dc_len, a, k)
        if msg is None:
            raise
        return Case(label, False, "no error", f"{type(e.exc).__name__}: {e.exc}", msg)
    expected = torch.cat([ids, res.token_ids[0, : a + 1]])
    problem = _commit_problem(
        label,
        out,
        ids,
        expected,
        a,
        k,
        (target, tc),
        (draft, dc),
        spelled_out=True,
        cache_message=_CROP_ONLY,
    )
    return problem or Case(label, True)


# (n, k, accepted): a rejection in the middle, at the first draft, at the last draft, full
# acceptance, and the same with a single draft.
_COMMIT_CASES = [(10, 5, 2), (10, 5, 0), (10, 5, 4), (10, 5, 5), (7, 1, 0), (7, 1, 1), (12, 3, 3)]


@register(
    "ex04.commit_tokens",
    points=4,
    needs="commit_tokens",
    title="committing the verifier's tokens and rolling both caches back",
    hint="write down, for both outcomes of the table in section 2, which committed tokens "
    "each cache has fed: the target never holds the pending token, and the draft cannot "
    "hold a token it never fed. The lengths follow from that",
)
def check_commit_tokens(fn) -> Iterator[Case]:
    target, draft = _models()
    for i, (n, k, a) in enumerate(_COMMIT_CASES):
        case = _commit_case(fn, target, draft, n, k, a, 200 + 10 * i)
        yield case
        if not case.passed:
            return
