"""Checks of exercise 11: prompt lookup, a draft that copies from the text with an exact q.

Students implement, in ``exercises/ex11_prompt_lookup.ipynb``, lesson 11's prompt lookup
(Saxena 2023; vLLM's n-gram draft) as two functions of the committed text:

- ``lookup_copy(context, k, min_n, max_n) -> list[int]``: the copy rule of
  ``specdec_course.llm.lookup.lookup``. For ``n`` from ``min(max_n, len(context) - 1)`` down
  to ``min_n``, the last ``n`` tokens are looked for earlier in the context, at a place with
  at least one token after it (it may overlap the last ``n`` tokens); the first ``n`` with
  such a place wins, and of its places the *earliest*. The drafts are the up to ``k`` tokens
  that follow it, as many as the context holds; none where no ``n`` matches;
- ``lookup_propose(context, k, vocab_size, min_n, max_n) -> (drafts [kk], q [kk, V])``: the
  same drafts and the distribution each was drawn from: one-hot, a 1 at ``drafts[j]``.

``lookup_copy`` is compared exactly with :func:`reference_copy` on named contexts (no match,
several matches, a longer match against a shorter earlier one, a match near the end or
overlapping the last n-gram, the ``min_n`` and ``max_n`` bounds) and 60 random ones; a wrong
answer is named by the slip it matches. ``lookup_propose`` is graded by an **audit** (the
drafts are the rule's, every row one-hot at its draft), by **greedy identity** (through
``decoding.speculative_generate`` on a small random target: plain greedy decoding's text, in
the reference proposer's number of target calls) and by a **chi-square test** at temperature
1 (1,200 runs of three new tokens against the target's exact joint law; its false-failure
rate, below 1e-6, is stated). The loop asks the student's function once per distinct
(context, k) and keeps the answer: the drafts are a function of the committed text.

The course's own rule lives in ``specdec_course.llm``, which the grader may not import (the
import-linter contract "Grading imports no ... real LLM"), so :func:`reference_copy` states
it once more; ``tests/test_grading_ex11.py`` pins it to ``llm.lookup.lookup``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from specdec_course.decoding import generate, speculative_generate
from specdec_course.model import GPTConfig
from specdec_course.stats import chi_square_test
from specdec_course.stats import counts as _counts

from ._support import as_vector, first_wrong, fmt, random_model
from .context import case_seed, fresh_cases
from .core import Case, call, register

# Not in the sandbox while ex11 is graded: the real LLM's subpackage is in none
# (edition.LEFT_OUT); listed so that the copy scan flags a notebook that forwards to them.
PUBLIC_IMPLEMENTATIONS = (
    "specdec_course.llm.lookup.lookup",
    "specdec_course.llm.lookup.PromptLookup.propose",
)
ALLOWED = {
    "specdec_course.decoding.speculative_generate": "the loop the student's proposer is run "
    "through (lesson 04); it drafts nothing itself",
    "specdec_course.decoding.generate": "plain greedy decoding, which greedy identity compares "
    "with",
    "specdec_course.model.GPTConfig": "the shape of the small random target the loop runs",
    "specdec_course.stats.chi_square_test": "the statistics tool the checks use",
    "specdec_course.stats.counts": "a histogram",
}

__all__ = ["reference_copy", "reference_propose", "copy_variant", "exact_law"]

_TOL = 1e-6


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


# --------------------------------------------------------------------------- lookup_propose


def _proposal(out, k: int, V: int) -> tuple[list[int], torch.Tensor, str]:
    """``(drafts, q, "")`` from a student's ``(drafts, q)``, or ``([], empty, why)``."""
    bad = [], torch.zeros(0, V, dtype=torch.float64)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        return *bad, "return a pair (drafts, q)"
    d = _ids(out[0])
    if d is None:
        return *bad, "drafts: a 1-D int64 tensor or a list of token ids"
    if len(d) > k:
        return *bad, f"{len(d)} drafts: at most k = {k}"
    if any(not 0 <= x < V for x in d):
        return *bad, f"drafts must be token ids in 0 .. {V - 1}"
    if not d and out[1] is None:
        return d, bad[1], ""
    q = as_vector(out[1])
    if q is None or tuple(q.shape) != (len(d), V):
        shape = "?" if q is None else tuple(q.shape)
        return *bad, (f"q: one row of {V} probabilities per draft, shape ({len(d)}, {V}); "
                      f"got shape {shape}")  # fmt: skip
    return d, q, ""


def audit_rows(drafts: list[int], q: torch.Tensor) -> str:
    """'' when row ``j`` of ``q`` is one-hot at ``drafts[j]`` for every ``j``, else why not."""
    for j, x in enumerate(drafts):
        row = q[j]
        if not bool(torch.isfinite(row).all()):
            return f"row {j} holds NaN or inf"
        if bool((row < 0).any()):
            return f"row {j} has negative entries: a probability is never negative"
        one = torch.zeros_like(row)
        one[x] = 1.0
        if (row - one).abs().max() <= _TOL:
            continue
        s = float(row.sum())
        if not abs(s - 1) <= _TOL:
            return f"row {j} sums to {s:.6g}, not 1: it is not a distribution"
        top = int(row.argmax())
        if top != x and float(row[top]) >= 1 - _TOL:
            return (f"row {j} puts its mass on token {top}, but draft {j} is token {x}: each "
                    "row is the distribution its own draft was drawn from")  # fmt: skip
        return (f"row {j} spreads its mass ({float(row[x]):.4g} on draft {j}, token {x}): the "
                "copy is a fixed function of the text, so what was the chance of drawing "
                "exactly that draft?")  # fmt: skip
    return ""


def _audit_case(fn, name: str, ctx, k: int, min_n: int, max_n: int, V: int) -> Case:
    label = f"{name}: lookup_propose({ctx}, k={k}, vocab_size={V}, min_n={min_n}, max_n={max_n})"
    exp = reference_copy(ctx, k, min_n, max_n)
    raw = call(label, fn, list(ctx), k, V, min_n, max_n)
    d, q, bad = _proposal(raw, k, V)
    if bad:
        return Case(label, False, "(drafts [kk], q [kk, V])", fmt(raw), bad)
    if d != exp:
        why = diagnose_copy(ctx, k, min_n, max_n, d)
        why = f"the drafts are not the copy rule's (does lookup_copy pass its check?): {why}"
        return Case(label, False, f"drafts {exp}", f"drafts {d}", why)
    why = audit_rows(d, q)
    return Case(label, not why, f"drafts {exp}, each row one-hot at its draft",
                f"drafts {d}, q {fmt(q)}", why)  # fmt: skip


class _Invalid(Exception):
    """A proposal the loop cannot use, with why."""


class LoopProposer:
    """``lookup_propose`` (the student's, or :func:`reference_propose`) as a proposer for
    ``decoding.speculative_generate``; each (context, k) is asked once and its answer kept."""

    def __init__(self, fn, vocab_size: int, min_n: int, max_n: int, *, student: bool = True):
        self.fn, self.student = fn, student
        self.vocab_size, self.min_n, self.max_n = vocab_size, min_n, max_n
        self.device = torch.device("cpu")
        self.memo: dict = {}

    def start(self, ids, n, sampling, generator, max_new_tokens, k) -> None:
        pass

    def propose(self, ids, n, k, out):
        ctx = ids[:n].tolist()
        key = (tuple(ctx), k)
        if key not in self.memo:
            args = (ctx, k, self.vocab_size, self.min_n, self.max_n)
            label = (f"in the loop, after {n} tokens ending {ctx[-6:]}: lookup_propose(context, "
                     f"k={k}, vocab_size={self.vocab_size}, min_n={self.min_n}, "
                     f"max_n={self.max_n})")  # fmt: skip
            raw = call(label, self.fn, *args) if self.student else self.fn(*args)
            d, q, bad = _proposal(raw, k, self.vocab_size)
            if bad:
                raise _Invalid(f"{label}: {bad}")
            self.memo[key] = (torch.tensor(d, dtype=torch.int64), q.float())
        d, q = self.memo[key]
        kk = int(d.numel())
        if kk == 0:
            return 0, None
        out[:kk] = d
        return kk, q

    def commit(self, ids, n) -> None:
        pass


def exact_law(target, prompt: torch.Tensor, m: int) -> torch.Tensor:
    """The law of the ``m`` tokens after ``prompt`` at temperature 1, over ``V**m`` outcomes
    (the first token most significant), from the target's own distributions."""
    V = target.config.vocab_size
    law = torch.ones(1, dtype=torch.float64)
    prefixes: list[list[int]] = [[]]
    with torch.inference_mode():
        for _ in range(m):
            rows = []
            for pre in prefixes:
                ids = torch.cat([prompt, torch.tensor(pre, dtype=torch.int64)])
                rows.append(target(ids[None])[0, -1].double().softmax(-1))
            law = (law[:, None] * torch.stack(rows)).flatten()
            prefixes = [[*pre, v] for pre in prefixes for v in range(V)]
    return law / law.sum()


_GREEDY_CFG = GPTConfig(vocab_size=6, block_size=64, n_layer=1, n_head=2, n_embd=16)
_LAW_CFG = GPTConfig(vocab_size=3, block_size=32, n_layer=1, n_head=1, n_embd=8)
_LAW_RUNS, _LAW_TOKENS = 1200, 3


def _greedy_cases():
    cases = [
        ("a prompt that repeats itself", 11, [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4], 4, 1, 3),
        ("n-grams of 2 to 4 tokens", 12, [5, 5, 2, 1, 5, 5, 2, 0, 3, 5, 5], 3, 2, 4),
    ]
    if fresh_cases():
        g = torch.Generator().manual_seed(case_seed(13))
        prompt = torch.randint(0, 6, (12,), generator=g).tolist()
        cases.append(("a random prompt", 14, prompt, 4, 1, 3))
    return cases


def _greedy_case(fn, name: str, seed: int, prompt, k: int, lo: int, hi: int) -> Case | None:
    target = random_model(_GREEDY_CFG, case_seed(seed), 3.0, frozen=True)
    ids, m, V = torch.tensor(prompt), 30, _GREEDY_CFG.vocab_size
    plain = generate(target, ids, m, temperature=0)
    ref, ref_st = speculative_generate(
        target, LoopProposer(reference_propose, V, lo, hi, student=False), ids, m, k=k,
        temperature=0,
    )  # fmt: skip
    if not torch.equal(ref, plain):
        return None  # two float paths split a near tie: nothing to grade on this prompt
    label = f"greedy identity, {name}: {m} tokens after {prompt}, k={k}, min_n={lo}, max_n={hi}"
    out, st = speculative_generate(target, LoopProposer(fn, V, lo, hi), ids, m, k=k, temperature=0)
    same = torch.equal(out, plain)
    ok = same and st.target_calls == ref_st.target_calls
    msg = ""
    if not same:
        msg = "the text differs from plain greedy decoding"
    elif not ok:
        msg = (f"the text is right, but it took {st.target_calls} target calls where the copy "
               f"rule takes {ref_st.target_calls}: your drafts differ from the rule's on the "
               "text the loop writes")  # fmt: skip
    return Case(label, ok, f"plain greedy text in {ref_st.target_calls} target calls",
                f"{'the same' if same else 'another'} text in {st.target_calls} target calls",
                msg)  # fmt: skip


def _law_case(fn) -> Case:
    seed = case_seed(21)
    target = random_model(_LAW_CFG, seed, 1.5, frozen=True)
    V, m = _LAW_CFG.vocab_size, _LAW_TOKENS
    if fresh_cases():
        prompt = torch.randint(0, V, (9,), generator=torch.Generator().manual_seed(seed)).tolist()
    else:
        prompt = [0, 1, 2, 0, 1, 1, 2, 0, 1]
    k, lo, hi = 2, 1, 3
    ids = torch.tensor(prompt)
    law = exact_law(target, ids, m)
    prop = LoopProposer(fn, V, lo, hi)
    g = torch.Generator().manual_seed(case_seed(22))
    outcomes = torch.empty(_LAW_RUNS, dtype=torch.int64)
    for r in range(_LAW_RUNS):
        out, _ = speculative_generate(target, prop, ids, m, k=k, temperature=1.0, generator=g)
        outcomes[r] = sum(int(x) * V ** (m - 1 - j) for j, x in enumerate(out[-m:].tolist()))
    res = chi_square_test(_counts(outcomes, V**m), law)
    freq = torch.as_tensor(_counts(outcomes, V**m)) / _LAW_RUNS
    return Case(
        f"temperature 1, {_LAW_RUNS} runs of {m} tokens after {prompt} (k={k}, min_n={lo}, "
        f"max_n={hi}): chi-square against the target's exact law",
        res.passed,
        expected=f"frequencies {fmt(law)}",
        got=f"{fmt(freq)} ({res})",
        message=""
        if res.passed
        else "the text does not follow the target's law: the verifier "
        "reads each draft's probability under the draft's distribution from your rows, and "
        "they are not what the drafts were drawn from",
        false_failure_rate=res.false_failure_rate,
    )


@register(
    "ex11.lookup_propose",
    points=4,
    needs="lookup_propose",
    title="the proposal and its exact q (audited, greedy identity, then chi-square)",
    hint="the drafts are lookup_copy's. For q, ask what the distribution of a draft is when "
    "the draft is a fixed function of the text (lesson 01 and lesson 07, section 4: the "
    "verifier needs the very distribution each draft was drawn from)",
)
def check_lookup_propose(fn) -> Iterator[Case]:
    V = 10
    name, ctx, k, lo, hi = NAMED[1]
    with_drafts = _audit_case(fn, f"returns (drafts, q), {name}", ctx, k, lo, hi, V)
    yield with_drafts
    for name, ctx, k, lo, hi in NAMED:
        yield _audit_case(fn, f"audit, {name}", ctx, k, lo, hi, V)
    rand = _random_contexts(2, 30)
    yield first_wrong(
        "audit, 30 random contexts",
        (_audit_case(fn, f"audit, 30 random contexts, {i}", c, k, lo, hi, 6)
         for i, (c, k, lo, hi) in enumerate(rand)),
    )  # fmt: skip
    try:
        for case in _greedy_cases():
            got = _greedy_case(fn, *case)
            if got is not None:
                yield got
        yield _law_case(fn)
    except _Invalid as e:
        yield Case("the proposer in the loop", False, "(drafts [kk], q [kk, V])", "", str(e))
