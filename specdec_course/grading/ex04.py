"""Checks of exercise 04: rolling the KV caches back after verification, and one full step.

Students implement, in ``exercises/ex04_rollback.ipynb``:

- ``rollback(cache, prefix_len, num_accepted)``: the cache holds ``prefix_len`` committed
  tokens followed by the drafts the target scored; keep the prefix and the first
  ``num_accepted`` drafts (``cache.crop(prefix_len + num_accepted)``); a ``ValueError``
  unless ``0 <= num_accepted <= cache.length - prefix_len``;
- ``commit_tokens(ids, token_ids, num_accepted, target_cache, draft_cache) -> new_ids``: the
  bookkeeping after the verifier: append ``token_ids[0, :a + 1]`` (accepted drafts and the
  recovered or bonus token) to the ``n`` committed ``ids``, crop the target cache to
  ``n' - 1`` and the draft cache to ``min(draft_cache.length, n' - 1)``;
- ``speculative_step(target, draft, ids, target_cache, draft_cache, k, verify,
  generator=None) -> new_ids``: one iteration of speculative decoding at temperature 1: the
  draft feeds its catch-up ``ids[draft_cache.length:]`` and samples ``k`` drafts, the target
  scores the pending token and the drafts in one call, ``verify(draft_ids, q, p)`` decides,
  and both caches are rolled back.

The cache invariant is the package's (see :mod:`specdec_course.decoding`): with ``n``
committed tokens the target cache holds the first ``n - 1`` (the last one is pending), the
draft cache the first ``n - 1`` or, right after a full acceptance, ``n - 2``.

The checks use two small random ``CharGPT`` models (fast and deterministic) and compare the
caches with a fresh run over the committed tokens (:func:`specdec_course.decoding.
caches_consistent`). ``speculative_step`` is called with a ``verify`` that forces the outcome
(a rejection in the middle, at the first draft, at the last, full acceptance) and checks
the ``q`` and ``p`` it receives against the models; a last case runs the step at
temperature 0 through :func:`specdec_course.verifier.rejection_sample` and compares the
output with :func:`specdec_course.decoding.generate`'s greedy tokens.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch
from torch.nn import functional as F

from specdec_course.decoding import caches_consistent, generate
from specdec_course.model import CharGPT, GPTConfig
from specdec_course.verifier import RejectionResult, rejection_sample

from ._support import fmt, seeded
from .core import Case, StudentError, call, register

ATOL = 1e-5
TARGET_CFG = GPTConfig(vocab_size=17, block_size=64, n_layer=2, n_head=2, n_embd=16)
DRAFT_CFG = GPTConfig(vocab_size=17, block_size=64, n_layer=1, n_head=2, n_embd=16)
V = TARGET_CFG.vocab_size


def _model(cfg: GPTConfig, seed: int, scale: float = 4.0) -> CharGPT:
    torch.manual_seed(seed)
    m = CharGPT(cfg).eval()
    with torch.no_grad():  # larger weights than at initialisation: far from uniform outputs
        for p in m.parameters():
            p.mul_(scale)
    m.requires_grad_(False)  # student code may call the models outside no_grad
    return m


_MODELS: dict[str, CharGPT] = {}


def _models() -> tuple[CharGPT, CharGPT]:
    if not _MODELS:
        _MODELS["target"] = _model(TARGET_CFG, 0)
        _MODELS["draft"] = _model(DRAFT_CFG, 1)
    return _MODELS["target"], _MODELS["draft"]


def _noisy_copy(model: CharGPT, seed: int, noise: float) -> CharGPT:
    """A draft that agrees with ``model`` often but not always (for the greedy case)."""
    g = torch.Generator().manual_seed(seed)
    d = CharGPT(model.config).eval()
    d.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in d.parameters():
            p.add_(noise * p.abs().mean() * torch.randn(p.shape, generator=g))
    d.requires_grad_(False)
    return d


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


def _fed(model: CharGPT, ids: torch.Tensor):
    """A fresh cache that holds ``ids`` (fed in one call)."""
    cache = model.new_cache(1)
    if ids.numel():
        with torch.no_grad():
            model(ids[None], cache)
    return cache


def _next_logits(model: CharGPT, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids[None])[0, -1]


def _as_ids(x) -> torch.Tensor | None:
    try:
        t = torch.as_tensor(x)
    except Exception:  # noqa: BLE001 - not a sequence of ids
        return None
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1 or t.is_floating_point() or t.is_complex():
        return None
    return t.detach().to("cpu", torch.long)


def _text(ids: torch.Tensor) -> str:
    return "[" + " ".join(str(int(i)) for i in ids) + "]"


# --------------------------------------------------------------------------- rollback

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
                f"you kept the rejected draft (position {a + 1}): the cache must hold the "
                f"{n}-token prefix and the {a} accepted drafts only, crop(prefix_len + "
                "num_accepted)"
            )
        elif got == want - 1:
            msg = (
                "one position too few: the prefix and every accepted draft stay; "
                "crop(prefix_len + num_accepted)"
            )
        elif got == n + k and a < k:
            msg = "the cache was not rolled back: call cache.crop(...)"
        else:
            msg = (
                "the cache must hold the prefix and the accepted drafts: prefix_len + num_accepted"
            )
        return Case(label, False, f"cache.length {want} ({n} prefix + {a} accepted)", f"{got}", msg)
    if not caches_consistent(target, cache, keep):
        return Case(
            label,
            False,
            "the first positions unchanged",
            "keys/values differ from a fresh run over the kept tokens",
            "rollback only moves the length: do not change or move the cached keys and values",
        )
    # The next step sees exactly what a fresh run over the kept tokens would.
    t = torch.tensor([(int(drafts[a]) + 1) % V if a < k else 3])
    with torch.no_grad():
        nxt = target(t[None], cache)[0, -1]
    fresh = _next_logits(target, torch.cat([keep, t]))
    diff = (nxt - fresh).abs().max().item()
    if diff > ATOL:
        return Case(
            label,
            False,
            "the next step's logits equal a fresh run over the kept tokens + the new one",
            f"largest difference {diff:.2e}",
            "after rollback, a forward with the cache must continue from position "
            "prefix_len + num_accepted: keep cache.k / cache.v and only crop the length",
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
        return Case(name, False, "ValueError", type(e).__name__, "raise ValueError")
    return Case(
        name,
        False,
        "ValueError",
        f"no error (cache.length {cache.length})",
        "num_accepted must lie in 0 .. the number of drafts in the cache "
        "(cache.length - prefix_len): raise ValueError otherwise",
    )


@register(
    "ex04.rollback",
    points=2,
    needs="rollback",
    title="rolling the target cache back to prefix + accepted drafts",
    hint="check 0 <= num_accepted <= cache.length - prefix_len, then "
    "cache.crop(prefix_len + num_accepted)",
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


# --------------------------------------------------------------------------- commit_tokens


def _verifier_row(drafts: torch.Tensor, a: int, p: torch.Tensor) -> RejectionResult:
    """What the verifier returns for ``a`` accepted drafts (B = 1): accepted + new token.

    After a rejection the new token is the target's favourite other than the rejected draft
    (so it always differs from it); after full acceptance the bonus is ``argmax p[k]``.
    """
    k = drafts.numel()
    row = torch.full((1, k + 1), -1, dtype=torch.long)
    row[0, :a] = drafts[:a]
    if a < k:
        w = p[a].clone()
        w[int(drafts[a])] = -1.0
        row[0, a] = int(w.argmax())
    else:
        row[0, a] = int(p[k].argmax())
    return RejectionResult(row, torch.tensor([a]))


def _diagnose_ids(ids, expected, got, a, k) -> str:
    n = ids.numel()
    if (got < 0).any():
        return (
            "your ids contain -1: those are the verifier's placeholders; keep only "
            "token_ids[0, :num_accepted + 1]"
        )
    if got.numel() == n + a and torch.equal(got, expected[: n + a]):
        if a == k:
            return (
                "you dropped the bonus token: when all k drafts are accepted the verifier adds "
                "one more token, drawn from the target's last row; keep token_ids[0, :k + 1]"
            )
        return (
            "you dropped the recovered token: after the accepted drafts the verifier emits one "
            "new token in their place; keep token_ids[0, :num_accepted + 1]"
        )
    if got.numel() == n + a + 1 and torch.equal(got[: n + a], expected[: n + a]):
        return (
            "the last token is not the verifier's: append the token it emitted "
            "(token_ids[0, num_accepted]), not the rejected draft"
        )
    if got.numel() == a + 1:
        return "return every committed token: the old ids followed by the new ones"
    return "new ids = torch.cat([ids, token_ids[0, :num_accepted + 1]])"


def _diagnose_target(got: int, n: int, a: int, k: int) -> str:
    new = n + a + 1
    if got == new:
        return (
            f"you kept the rejected draft: the target cache holds {got} positions, the last of "
            f"them draft {a + 1}, which was rejected; the new token is pending (fed with the "
            "next drafts), so crop the target cache to len(new_ids) - 1"
        )
    if got == n + k:
        return "the target cache was not rolled back: crop it to len(new_ids) - 1"
    if got == new - 2:
        return (
            "one position too few: the target cache keeps every committed token but the last "
            "(pending) one, len(new_ids) - 1"
        )
    return "the target cache must hold every committed token but the last: len(new_ids) - 1"


def _diagnose_draft(got: int, want: int, n: int, a: int, k: int) -> str:
    new = n + a + 1
    if a == k and got == new - 1:
        return (
            "you forgot the draft's catch-up: after full acceptance the draft model never fed "
            f"its own last draft d_{k}, so its cache holds only len(new_ids) - 2 positions; "
            "crop it to min(draft_cache.length, len(new_ids) - 1) and let the next step feed "
            "the two missing tokens. Setting cache.length past what was fed leaves "
            "garbage in the cache"
        )
    if a < k - 1 and got == new:
        return (
            f"the draft cache still holds the rejected draft d_{a + 1}: crop it to "
            "min(draft_cache.length, len(new_ids) - 1)"
        )
    if got == n + k - 1 and want != got:
        return "the draft cache was not rolled back: crop it to min(its length, len(new_ids) - 1)"
    if got < want:
        return (
            "the draft cache was cropped too far: keep every committed token it has already "
            "fed, min(draft_cache.length, len(new_ids) - 1); what you drop it must feed again"
        )
    return "crop the draft cache to min(draft_cache.length, len(new_ids) - 1)"


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
            "cannot grow it; crop to min(draft_cache.length, len(new_ids) - 1), the next step "
            "feeds the two missing tokens"
        )
    if length == tc_len and n_asked == tc_len + 1:
        return (
            f"crop({n_asked}) on a target cache of {tc_len} positions: the target cache "
            "keeps every committed token but the last (pending) one, len(new_ids) - 1"
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
    got = _as_ids(out)
    if got is None:
        return Case(
            label,
            False,
            f"new ids {_text(expected)}",
            fmt(out),
            "return the new committed ids as a 1-D int64 tensor",
        )
    if not torch.equal(got, expected):
        return Case(
            label,
            False,
            f"new ids {_text(expected[n:])} after the {n} old ones",
            f"{_text(got[n:])} after them ({got.numel()} ids)" if got.numel() >= n else _text(got),
            _diagnose_ids(ids, expected, got, a, k),
        )
    n_new = expected.numel()
    if tc.length != n_new - 1:
        return Case(
            label,
            False,
            f"target cache length {n_new - 1} (len(new_ids) - 1)",
            str(tc.length),
            _diagnose_target(tc.length, n, a, k),
        )
    want_dc = min(dc_len, n_new - 1)
    if dc.length != want_dc:
        return Case(
            label,
            False,
            f"draft cache length {want_dc} (min({dc_len}, len(new_ids) - 1))",
            str(dc.length),
            _diagnose_draft(dc.length, want_dc, n, a, k),
        )
    for name, model, cache in (("target", target, tc), ("draft", draft, dc)):
        if not caches_consistent(model, cache, expected):
            return Case(
                label,
                False,
                f"the {name} cache equals a fresh run over the committed tokens",
                "its keys/values differ",
                "roll back with cache.crop only: do not change the cached keys and values",
            )
    return Case(label, True)


# (n, k, accepted): a rejection in the middle, at the first draft, at the last draft, full
# acceptance, and the same with a single draft.
_COMMIT_CASES = [(10, 5, 2), (10, 5, 0), (10, 5, 4), (10, 5, 5), (7, 1, 0), (7, 1, 1), (12, 3, 3)]


@register(
    "ex04.commit_tokens",
    points=4,
    needs="commit_tokens",
    title="committing the verifier's tokens and rolling both caches back",
    hint="a = int(num_accepted[0]); new = torch.cat([ids, token_ids[0, :a + 1]]); "
    "target_cache.crop(len(new) - 1); draft_cache.crop(min(draft_cache.length, len(new) - 1))",
)
def check_commit_tokens(fn) -> Iterator[Case]:
    target, draft = _models()
    for i, (n, k, a) in enumerate(_COMMIT_CASES):
        case = _commit_case(fn, target, draft, n, k, a, 200 + 10 * i)
        yield case
        if not case.passed:
            return


# --------------------------------------------------------------------------- speculative_step


def _are_probs(x: torch.Tensor) -> bool:
    x = x.detach().double()
    return bool((x >= 0).all() and ((x.sum(-1) - 1).abs() < 1e-4).all())


class _ForcedVerify:
    """A ``verify(draft_ids, q, p)`` that checks what it is given and forces the outcome."""

    def __init__(self, target, draft, ids: torch.Tensor, k: int, a: int, draft_len: int):
        self.target, self.draft, self.ids, self.k, self.a = target, draft, ids, k, a
        self.draft_len_before = draft_len  # what the draft cache held when the step began
        self.calls = 0
        self.counters: tuple[_Counter, ...] = ()  # paused while this computes the references
        self.problem: tuple[str, str, str] | None = None  # (expected, got, message)
        self.result: RejectionResult | None = None

    def _fail(self, expected: str, got: str, message: str) -> None:
        if self.problem is None:
            self.problem = (expected, got, message)

    def __call__(self, draft_ids, q, p):
        self.calls += 1
        k, n = self.k, self.ids.numel()
        d = _as_ids(draft_ids)
        ok_shape = (
            isinstance(draft_ids, torch.Tensor)
            and tuple(draft_ids.shape) == (1, k)
            and d is not None
            and bool(((d >= 0) & (d < V)).all())
        )
        if not ok_shape:
            self._fail(
                f"draft_ids of shape [1, k] = [1, {k}], ids in [0, {V})",
                fmt(draft_ids),
                "pass verify the k drafts as a [1, k] int64 tensor (batch of one row), "
                "as rejection_sample takes them",
            )
            d = torch.zeros(k, dtype=torch.long)
        ctx = torch.cat([self.ids, d])
        for c in self.counters:
            c.paused = True
        try:
            with torch.no_grad():
                p_ref = self.target(ctx[None])[0, n - 1 :].softmax(-1)  # [k + 1, V]
                q_ref = torch.stack(
                    [self.draft(ctx[None, : n + j])[0, -1].softmax(-1) for j in range(k)]
                )
        finally:
            for c in self.counters:
                c.paused = False
        if ok_shape:
            self._check_q(q, q_ref)
            self._check_p(p, p_ref)
        self.result = _verifier_row(d, self.a, p_ref)
        return self.result

    def _first_wrong_row(self, t, ref, name: str, rows: int, shape_hint: str, model: str):
        """Index of the first of ``t``'s ``rows`` distributions that differs from ``ref``.

        ``None`` when all match, or after reporting a wrong shape or rows that are not
        probabilities (``model`` names whose logits need a softmax).
        """
        shape = f"[1, {'k' if rows == self.k else 'k + 1'}, V] = [1, {rows}, {V}]"
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (1, rows, V):
            self._fail(
                f"{name} of shape {shape}",
                fmt(tuple(t.shape)) if isinstance(t, torch.Tensor) else fmt(t),
                shape_hint,
            )
            return None
        if not _are_probs(t):
            self._fail(
                f"{name}: probabilities, each row summing to 1",
                f"rows summing to {fmt(t[0].detach().double().sum(-1))}",
                f"{name} holds logits or log-probabilities: apply softmax to {model} logits",
            )
            return None
        err = (t[0].detach().double() - ref.double()).abs().amax(-1)
        bad = (err > ATOL).nonzero()
        return int(bad[0]) if len(bad) else None

    def _check_q(self, q, q_ref) -> None:
        j = self._first_wrong_row(
            q,
            q_ref,
            "q",
            self.k,
            "pass verify the draft's k distributions stacked as [1, k, V]",
            "the draft's",
        )
        if j is None:
            return
        if j == 0:
            m = self.draft_len_before
            msg = (
                f"q_1 is not the draft model's distribution after the {self.ids.numel()} "
                f"committed tokens. The draft cache held {m} of them: its first call "
                f"must feed ids[draft_cache.length:], the {self.ids.numel() - m} missing "
                "token(s)"
            )
            if self.ids.numel() - m == 2:
                msg += (
                    " (after a full acceptance that is two: the last draft it never "
                    "fed, and the bonus token): you forgot the draft's catch-up"
                )
        else:
            before = "d_1" if j == 1 else f"d_1 .. d_{j}"
            msg = (
                f"q_{j + 1} is not the draft's distribution after the committed tokens "
                f"and {before}: feed each draft to the draft model before drafting the next"
            )
        self._fail(f"q_{j + 1} = {fmt(q_ref[j])}", f"{fmt(q[0, j].detach())}", msg)

    def _check_p(self, p, p_ref) -> None:
        j = self._first_wrong_row(
            p,
            p_ref,
            "p",
            self.k + 1,
            "the target scores the pending token and the k drafts in one call: its k + 1 "
            "distributions, stacked as [1, k + 1, V]",
            "the target's",
        )
        if j is None:
            return
        self._fail(
            f"p_{j + 1} = {fmt(p_ref[j])}",
            fmt(p[0, j].detach()),
            "p_1 .. p_{k+1} are the target's distributions after the pending token "
            "ids[-1] and after each draft: feed torch.cat([ids[-1:], drafts]) to the "
            "target with its cache (which holds every committed token but the last)",
        )


class _Counter:
    """Counts forward calls of a model (student code calls the models as functions)."""

    def __init__(self, model):
        self.n = 0
        self.paused = False
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *args):
        self.n += not self.paused

    def remove(self):
        self.handle.remove()


# (k, forced number accepted) for consecutive steps: a rejection in the middle, full
# acceptance (the next step starts with the draft two tokens behind), a rejection at the first
# draft, two full acceptances in a row, a single draft after a full acceptance, ...
_STEPS = [(4, 2), (4, 4), (4, 0), (4, 4), (4, 4), (1, 1), (1, 0), (3, 3), (5, 1), (3, 2)]


def _step_case(fn, target, draft, ids, tc, dc, k, a, seed, i) -> tuple[Case, torch.Tensor]:
    n = ids.numel()
    behind = n - dc.length
    what = "full acceptance, bonus token" if a == k else f"rejection at position {a + 1}"
    label = f"step {i}: n = {n}, draft cache at n - {behind}, k = {k}, {what}"
    verify = _ForcedVerify(target, draft, ids, k, a, dc.length)
    counts = verify.counters = _Counter(target), _Counter(draft)
    try:
        with seeded(seed) as g:
            out = call(label, fn, target, draft, ids.clone(), tc, dc, k, verify, generator=g)
    except StudentError as e:
        if verify.problem is not None:  # what went wrong first
            return Case(label, False, *verify.problem), ids
        msg = _crop_error(e, n + k, n + k - 1, a, k)
        if msg is None:
            raise
        return Case(label, False, "no error", f"{type(e.exc).__name__}: {e.exc}", msg), ids
    finally:
        for c in counts:
            c.remove()
    if verify.calls != 1:
        return Case(
            label,
            False,
            "verify called once",
            f"called {verify.calls} times",
            "one step drafts k tokens, scores them once and calls verify once",
        ), ids
    if verify.problem is not None:
        return Case(label, False, *verify.problem), ids
    res = verify.result
    expected = torch.cat([ids, res.token_ids[0, : a + 1]])
    got = _as_ids(out)
    if got is None or not torch.equal(got, expected):
        msg = (
            "return the new committed ids as a 1-D int64 tensor"
            if got is None
            else _diagnose_ids(ids, expected, got, a, k)
        )
        shown = fmt(out) if got is None else f"{_text(got[n:])} after them ({got.numel()} ids)"
        return Case(
            label, False, f"new ids {_text(expected[n:])} after the {n} old ones", shown, msg
        ), ids
    n_new = expected.numel()
    if tc.length != n_new - 1:
        return Case(
            label,
            False,
            f"target cache length {n_new - 1}",
            str(tc.length),
            _diagnose_target(tc.length, n, a, k),
        ), ids
    fed_by_draft = n + k - 1
    want_dc = min(fed_by_draft, n_new - 1)
    if dc.length != want_dc:
        return Case(
            label,
            False,
            f"draft cache length {want_dc}",
            str(dc.length),
            _diagnose_draft(dc.length, want_dc, n, a, k),
        ), ids
    for name, model, cache in (("target", target, tc), ("draft", draft, dc)):
        if not caches_consistent(model, cache, expected):
            return Case(
                label,
                False,
                f"the {name} cache equals a fresh run over the committed tokens",
                "its keys/values differ",
                f"the {name} cache holds keys/values of tokens that were not committed "
                "(or were fed at the wrong positions)",
            ), ids
    t_calls, d_calls = counts[0].n, counts[1].n
    if t_calls > 1:
        return Case(
            label,
            False,
            "1 target call",
            f"{t_calls} calls",
            "score the pending token and all k drafts in ONE target call: that is where the "
            "speedup comes from",
        ), ids
    if d_calls > k:
        return Case(
            label,
            False,
            f"{k} draft calls",
            f"{d_calls} calls",
            "the catch-up rides along with the first draft call: feed "
            "ids[draft_cache.length:] in it, then one draft per call",
        ), ids
    return Case(label, True), expected


def _greedy_verify(draft_ids, q, p):
    # Temperature 0: one-hot target rows; the verifier then keeps drafts while they equal
    # the target's argmax and emits its argmax. The drafts' own distributions do not matter.
    return rejection_sample(draft_ids, None, F.one_hot(p.argmax(-1), p.shape[-1]).float())


@register(
    "ex04.speculative_step",
    points=4,
    needs="speculative_step",
    title="one full speculative step with both caches",
    hint="feed = ids[draft_cache.length:]; k draft calls (sample each, feed it next); "
    "p = softmax(target(cat([ids[-1:], drafts])[None], target_cache)[0]); "
    "token_ids, num_accepted = verify(drafts[None], q[None], p[None]); then commit_tokens",
)
def check_speculative_step(fn) -> Iterator[Case]:
    target, draft = _models()
    ids = _tokens(10, 300)
    tc, dc = _fed(target, ids[:-1]), _fed(draft, ids[:-1])
    for i, (k, a) in enumerate(_STEPS, 1):
        case, ids = _step_case(fn, target, draft, ids, tc, dc, k, a, 300 + i, i)
        if not case.passed:
            yield case
            return
    yield Case(f"{len(_STEPS)} steps with forced outcomes, caches checked after each", True)

    # Temperature 0, end to end: the target's greedy output, whatever the draft proposes.
    near = _noisy_copy(target, 7, 0.5)
    prompt = _tokens(8, 301)
    ids = prompt.clone()
    tc, dc = _fed(target, ids[:-1]), _fed(near, ids[:-1])
    label = "40 tokens at temperature 0 equal the target's greedy output"
    with seeded(302) as g:
        while ids.numel() < prompt.numel() + 40:
            out = call(label, fn, target, near, ids, tc, dc, 3, _greedy_verify, generator=g)
            got = _as_ids(out)
            if got is None or got.numel() <= ids.numel():
                yield Case(label, False, "longer ids after each step", fmt(out))
                return
            ids = got
    ref = generate(target, prompt, ids.numel() - prompt.numel(), temperature=0)
    if torch.equal(ids, ref):
        yield Case(label, True)
        return
    first = int((ids != ref).nonzero()[0])
    yield Case(
        label,
        False,
        f"greedy tokens {_text(ref[first : first + 8])} from position {first}",
        _text(ids[first : first + 8]),
        "the committed tokens drift from the target's greedy output: a cache holds a token "
        "that was not committed, or misses one",
    )
