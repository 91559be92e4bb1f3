"""Check ``ex04.speculative_step``: one full step with both caches under a given processing
(temperature, top-p), then 40 greedy tokens."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from specdec_course.decoding import generate
from specdec_course.sampling import process_logits
from specdec_course.verifier import RejectionResult, rejection_sample

from .._support import fmt, seeded
from ..context import case_seed
from ..core import Case, StudentError, call, register
from ._common import (
    ATOL,
    V,
    _as_ids,
    _fed,
    _models,
    _noisy_copy,
    _text,
    _tokens,
    _verifier_row,
)
from .commit_tokens import _commit_problem, _crop_error


def _are_probs(x: torch.Tensor) -> bool:
    x = x.detach().double()
    return bool((x >= 0).all() and ((x.sum(-1) - 1).abs() < 1e-4).all())


class _ForcedVerify:
    """A ``verify(draft_ids, q, p)`` that checks what it is given and forces the outcome."""

    def __init__(self, target, draft, ids: torch.Tensor, k: int, a: int, draft_len: int, process):
        self.target, self.draft, self.ids, self.k, self.a = target, draft, ids, k, a
        self.process = process  # logits -> the distribution both models are sampled from
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
                "verify takes the drafts as rejection_sample does, for a batch of one row",
            )
            d = torch.zeros(k, dtype=torch.long)
        ctx = torch.cat([self.ids, d])
        for c in self.counters:
            c.paused = True
        try:
            with torch.no_grad():
                p_raw = self.target(ctx[None])[0, n - 1 :]  # [k + 1, V] logits
                q_raw = torch.stack([self.draft(ctx[None, : n + j])[0, -1] for j in range(k)])
        finally:
            for c in self.counters:
                c.paused = False
        p_ref, q_ref = self.process(p_raw), self.process(q_raw)
        if ok_shape:
            self._check_q(q, q_ref, q_raw.softmax(-1))
            self._check_p(p, p_ref, p_raw.softmax(-1))
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
        bad = (~(err <= ATOL)).nonzero()  # (NaN fails too)
        return int(bad[0]) if len(bad) else None

    @staticmethod
    def _unprocessed(t, j: int, ref: torch.Tensor, plain: torch.Tensor) -> bool:
        """Whether row ``j`` of ``t`` is the plain softmax where the processed ``ref`` differs."""
        row, plain_j = t[0, j].detach().double(), plain[j].double()
        changes = bool((plain_j - ref[j].double()).abs().max() > ATOL)
        return changes and bool((row - plain_j).abs().max() <= ATOL)

    def _check_q(self, q, q_ref, q_plain) -> None:
        j = self._first_wrong_row(
            q,
            q_ref,
            "q",
            self.k,
            "verify takes the draft's k distributions as rejection_sample does, batch of one",
            "the draft's",
        )
        if j is None:
            return
        if self._unprocessed(q, j, q_ref, q_plain):
            msg = (
                f"q_{j + 1} is the softmax of the draft's logits, not process(logits): the "
                "draft samples from the processed distribution, and q must be the "
                "distribution each draft was sampled from (the rule corrects for exactly "
                "that proposal)"
            )
        elif j == 0:
            m = self.draft_len_before
            msg = (
                f"q_1 is not the draft model's distribution after the {self.ids.numel()} "
                f"committed tokens. The draft cache held {m} of them: its first call must "
                f"feed the {self.ids.numel() - m} it lacks"
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
                f"and {before}: was each draft fed to the draft model before the next?"
            )
        self._fail(f"q_{j + 1} = {fmt(q_ref[j])}", f"{fmt(q[0, j].detach())}", msg)

    def _check_p(self, p, p_ref, p_plain) -> None:
        j = self._first_wrong_row(
            p,
            p_ref,
            "p",
            self.k + 1,
            "the target scores the pending token and the k drafts in one call, and verify "
            "takes all of its distributions",
            "the target's",
        )
        if j is None:
            return
        if self._unprocessed(p, j, p_ref, p_plain):
            self._fail(
                f"p_{j + 1} = {fmt(p_ref[j])}",
                fmt(p[0, j].detach()),
                "p is the softmax of the target's logits, not process(logits): the target's "
                "distributions go through the same processing as the draft's, or the output "
                "follows the unprocessed target, not the one asked for",
            )
            return
        self._fail(
            f"p_{j + 1} = {fmt(p_ref[j])}",
            fmt(p[0, j].detach()),
            "p_1 .. p_{k+1} are not the target's distributions after the pending token and "
            "after each draft (what did the target call feed, and from which cache state?)",
        )


class _Counter:
    """Counts the calls of a model, by whatever entry they come: ``model(...)``,
    ``model.forward``, ``hidden_states``, ``decode_hidden`` or any of its submodules (a
    forward hook sees only the first). A call made from inside another counts once."""

    ENTRIES = ("forward", "hidden_states", "decode_hidden")

    def __init__(self, model):
        self.n = 0
        self.depth = 0
        self.paused = False
        self.patched: list[tuple[object, str]] = []
        for module in model.modules():
            names = self.ENTRIES if module is model else ("forward",)
            for name in names:
                if callable(getattr(module, name, None)):
                    self._wrap(module, name)

    def _wrap(self, module, name: str) -> None:
        inner = getattr(module, name)

        def counted(*args, **kwargs):
            self.depth += 1
            try:
                if self.depth == 1 and not self.paused:
                    self.n += 1
                return inner(*args, **kwargs)
            finally:
                self.depth -= 1

        object.__setattr__(module, name, counted)  # an instance attribute, shadowing the method
        self.patched.append((module, name))

    def remove(self):
        for module, name in self.patched:
            with contextlib.suppress(AttributeError):
                object.__delattr__(module, name)
        self.patched.clear()


# (k, forced number accepted) for consecutive steps: a rejection in the middle, full
# acceptance (the next step starts with the draft two tokens behind), a rejection at the first
# draft, two full acceptances in a row, a single draft after a full acceptance, ...
_STEPS = [(4, 2), (4, 4), (4, 0), (4, 4), (4, 4), (1, 1), (1, 0), (3, 3), (5, 1), (3, 2)]


class Process:
    """``process(logits) -> probabilities``: the sampling options of a step, applied to the
    last dimension (:func:`specdec_course.sampling.process_logits`)."""

    def __init__(self, temperature: float = 1.0, top_p: float | None = None):
        self.temperature, self.top_p = temperature, top_p

    def __call__(self, logits):
        return process_logits(torch.as_tensor(logits), self.temperature, None, self.top_p)

    def __str__(self) -> str:
        if self.temperature == 1.0 and self.top_p is None:
            return "softmax"
        top = "" if self.top_p is None else f", top-p {self.top_p}"
        return f"temperature {self.temperature}{top}"


# The processing of each step, in turn: plain softmax (lesson 04's loop), a colder and a
# hotter temperature with top-p (which leaves some tokens no probability at all).
_PROCESSES = (Process(), Process(0.7), Process(1.3, top_p=0.9))


def _step_case(fn, target, draft, ids, tc, dc, k, a, seed, i) -> tuple[Case, torch.Tensor]:
    n = ids.numel()
    behind = n - dc.length
    what = "full acceptance, bonus token" if a == k else f"rejection at position {a + 1}"
    process = _PROCESSES[i % len(_PROCESSES)]
    label = f"step {i}: n = {n}, draft cache at n - {behind}, k = {k}, {process}, {what}"
    verify = _ForcedVerify(target, draft, ids, k, a, dc.length, process)
    counts = verify.counters = _Counter(target), _Counter(draft)
    try:
        with seeded(case_seed(seed)) as g:
            out = call(
                label, fn, target, draft, ids.clone(), tc, dc, k, verify, process, generator=g
            )
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
    expected = torch.cat([ids, verify.result.token_ids[0, : a + 1]])
    problem = _commit_problem(
        label,
        out,
        ids,
        expected,
        a,
        k,
        (target, tc),
        (draft, dc),
        spelled_out=False,
        cache_message=_NOT_COMMITTED,
    )
    if problem is not None:
        return problem, ids
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
            "the catch-up rides along with the first draft call; there is one call per "
            "draft, no more",
        ), ids
    return Case(label, True), expected


_NOT_COMMITTED = (
    "the {name} cache holds keys/values of tokens that were not committed "
    "(or were fed at the wrong positions)"
)


@register(
    "ex04.speculative_step",
    points=4,
    needs="speculative_step",
    title="one full speculative step with both caches, under given sampling options",
    hint="follow the four steps of section 3 and, before each model call, say what that "
    "model's cache holds and which tokens it still lacks; lesson 04, section 1 runs one "
    "iteration at temperature 1, and section 7 says why both models' logits go through "
    "the same processing",
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
    greedy = Process(0.0)  # one-hot rows: the rule keeps a draft while it is the argmax

    with seeded(case_seed(302)) as g:

        def verify(draft_ids, q, p):
            return rejection_sample(draft_ids, q, p, generator=g)

        while ids.numel() < prompt.numel() + 40:
            out = call(label, fn, target, near, ids, tc, dc, 3, verify, greedy, generator=g)
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
