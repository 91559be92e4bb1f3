"""Check ``ex04.commit_tokens``: a batch's verified tokens committed row by row, with each
row's new target and draft cache lengths.

Every row accepted its own number of drafts, so every row commits its own number of tokens
and its caches keep their own lengths; lesson 04's one-row commit (one ``crop`` per cache,
one count) gives them all the same, and the check names that mistake. What one row's step
must leave in real caches (the ids, both cache lengths and contents) is checked by
:func:`_commit_problem`, which ``ex04.speculative_step`` uses.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from specdec_course.decoding import caches_consistent
from specdec_course.model import CharGPT, KVCache

from .._support import fmt
from ..core import Case, StudentError, call_inplace, register
from ._common import V, _as_ids, _text, _tokens


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


def _vec(xs) -> str:
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


def _batch(ns: list[int], k: int, accepted: list[int], seed: int):
    """A batch as the verifier leaves it: committed ids (padded with -1), its answer."""
    B, width = len(ns), max(ns) + k + 1
    ids = torch.full((B, width), -1, dtype=torch.long)
    token_ids = torch.full((B, k + 1), -1, dtype=torch.long)
    for b, (n, a) in enumerate(zip(ns, accepted)):
        ids[b, :n] = _tokens(n, seed + b)
        drafts = _tokens(k, seed + 50 + b)
        token_ids[b, :a] = drafts[:a]
        # the recovered token differs from the rejected draft; the bonus is any token
        token_ids[b, a] = (int(drafts[a]) + 1) % V if a < k else int(_tokens(1, seed + 90 + b))
    return ids, token_ids


def _same(x: torch.Tensor) -> bool:
    return x.numel() > 1 and bool((x == x[0]).all())


def _diagnose_batch_n(got, n, a, k) -> str:
    want = n + a + 1
    if torch.equal(got, n + a):
        return (
            "you dropped the verifier's new token: every row commits its accepted drafts and "
            "one token more (recovered after a rejection, the bonus after full acceptance)"
        )
    if torch.equal(got, n + k + 1) and not torch.equal(a, torch.full_like(a, k)):
        return (
            "every row committed all k + 1 entries of the verifier's row: its -1s are "
            "placeholders, not tokens; row b commits a_b + 1"
        )
    if torch.equal(got, n + int(a[0]) + 1) or (_same(got) and not _same(want)):
        return (
            "every row committed the same number of tokens, as lesson 04's one-row commit "
            "does: in a batch each row accepted its own number of drafts, a_b, and commits "
            "a_b + 1 tokens"
        )
    return "the new lengths are not each row's old length plus its accepted drafts plus one"


def _diagnose_batch_target(got, n, a, k) -> str:
    want = n + a
    if _same(got) and not _same(want):
        return (
            "every row's target cache got the same length, as one crop of the whole cache gives "
            "one sequence (lesson 04's one-row rollback): in a batch each row keeps its own "
            "committed tokens but the pending one"
        )
    if torch.equal(got, want + 1):
        return (
            "you kept the rejected draft (or cached the pending token): the target cache "
            "holds every committed token but the newest, which is pending"
        )
    if torch.equal(got, n + k):
        return "the target cache was not rolled back"
    if torch.equal(got, want - 1):
        return "one position too few: a committed token is missing from the target cache"
    rows = (got != want).nonzero().flatten().tolist()
    return f"row {rows[0]}'s target cache does not hold what the conventions say"


def _diagnose_batch_draft(got, want, n, a, k) -> str:
    full = a == k
    if bool(full.any()) and torch.equal(got[full], (n + a + 1)[full] - 1):
        b = int(full.nonzero()[0])
        return (
            f"you forgot the draft's catch-up (row {b} accepted all {k} drafts): the draft "
            f"model never fed its last draft d_{k}, so that row's cache cannot hold it"
        )
    if _same(got) and not _same(want):
        return (
            "every row's draft cache got the same length, as one crop gives one sequence: in "
            "a batch each row keeps what it fed of its own committed tokens"
        )
    if bool((got > want).any()):
        return "a row's draft cache still holds a rejected draft"
    if torch.equal(got, n + k - 1):
        return "the draft cache was not rolled back"
    return (
        "the draft cache was cropped too far: a row dropped committed tokens it had already "
        "fed, which it would have to feed again"
    )


# (committed lengths n, drafts k, accepted per row): one row, equal rows with every outcome,
# ragged rows, single drafts, two full acceptances beside a rejection.
_COMMIT_CASES = [
    ([10], 5, [2]),
    ([10, 10, 10], 5, [2, 5, 0]),
    ([7, 12, 9], 3, [3, 1, 2]),
    ([5, 8, 6, 11], 1, [0, 1, 1, 0]),
    ([12, 4, 9], 4, [4, 3, 4]),
]


def _commit_batch_case(fn, ns, k, accepted, seed) -> Case:
    n, a = torch.tensor(ns), torch.tensor(accepted)
    ids, token_ids = _batch(ns, k, accepted, seed)
    tl, dl = n + k, n + k - 1  # the target fed the pending token and k drafts; the draft k - 1
    label = f"n = {_vec(n)}, k = {k}, accepted {_vec(a)}"
    args = (ids, n, token_ids, a, tl, dl)
    out, after = call_inplace(label, fn, *args)
    new_n = n + a + 1
    want_t, want_d = new_n - 1, torch.minimum(dl, new_n - 1)
    shape = "(ids, n, target_lengths, draft_lengths)"
    if not isinstance(out, (tuple, list)) or len(out) != 4:
        return Case(label, False, f"a tuple {shape}", fmt(out), f"return the four of {shape}")
    got_ids, got_n, got_t, got_d = (_as_long(x) for x in out)
    for name, got, want, diag in (
        ("n", got_n, new_n, _diagnose_batch_n),
        ("target_lengths", got_t, want_t, _diagnose_batch_target),
    ):
        if got is None or got.shape != want.shape or not torch.equal(got, want):
            msg = f"{name}: one whole number per row"
            if got is not None and got.shape == want.shape:
                msg = diag(got, n, a, k)
            return Case(label, False, f"{name} {_vec(want)}", fmt(got), msg)
    if got_d is None or got_d.shape != want_d.shape or not torch.equal(got_d, want_d):
        msg = "draft_lengths: one whole number per row"
        if got_d is not None and got_d.shape == want_d.shape:
            msg = _diagnose_batch_draft(got_d, want_d, n, a, k)
        return Case(label, False, f"draft_lengths {_vec(want_d)}", fmt(got_d), msg)
    if (
        got_ids is None
        or got_ids.dim() != 2
        or got_ids.shape[0] != len(ns)
        or (got_ids.shape[1] < int(new_n.max()))
    ):
        return Case(
            label,
            False,
            f"ids of {len(ns)} rows, at least {int(new_n.max())} columns",
            fmt(out[0]),
            "return the committed ids as a 2-D int64 tensor, one row per sequence",
        )
    for b in range(len(ns)):
        m, nb, ab = int(new_n[b]), ns[b], accepted[b]
        want_row = torch.cat([ids[b, :nb], token_ids[b, : ab + 1]])
        if not torch.equal(got_ids[b, :m], want_row):
            row = got_ids[b, :m]
            msg = f"row {b}'s new tokens are not written right after its {nb} committed ones"
            if bool((row < 0).any()):
                msg = (
                    f"row {b} holds -1 among its committed tokens: the verifier's "
                    "placeholders are not tokens, and each row's new tokens start at its own "
                    "length"
                )
            elif not torch.equal(row[:nb], ids[b, :nb]):
                msg = f"row {b}'s old committed tokens changed"
            return Case(
                label,
                False,
                f"row {b}: {_text(want_row[nb:])} after its {nb} old tokens",
                _text(row[nb:]),
                msg,
            )
    if not all(
        isinstance(x, torch.Tensor) and x.shape == y.shape and torch.equal(x, y)
        for x, y in zip(after, args)
    ):
        return Case(
            label,
            False,
            "the arguments unchanged",
            "changed in place",
            "your commit changed the caller's tensors; return new ones",
        )
    return Case(f"{label}: n -> {_vec(new_n)}, target {_vec(want_t)}, draft {_vec(want_d)}", True)


def _as_long(x) -> torch.Tensor | None:
    try:
        t = torch.as_tensor(x)
    except Exception:  # noqa: BLE001 - not numbers
        return None
    if t.is_floating_point() or t.is_complex():
        if not bool((t == t.round()).all()):
            return None
    return t.detach().to("cpu", torch.long)


@register(
    "ex04.commit_tokens",
    points=4,
    needs="commit_tokens",
    title="committing a batch's verified tokens, row by row, and both caches' new lengths",
    hint="fill in section 2's table for one row first, then ask which numbers in it differ "
    "from row to row: the target never holds the pending token, and the draft cannot hold "
    "a token it never fed",
)
def check_commit_tokens(fn) -> Iterator[Case]:
    for i, (ns, k, accepted) in enumerate(_COMMIT_CASES):
        case = _commit_batch_case(fn, ns, k, accepted, 200 + 100 * i)
        yield case
        if not case.passed:
            return
