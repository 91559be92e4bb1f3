"""Exercise 11's check of ``lookup_propose``: an audit of the drafts and their one-hot rows,
greedy identity through ``decoding.speculative_generate``, and a chi-square test of the
loop's text at temperature 1 against the target's exact law (see the package's docstring)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from specdec_course.decoding import generate, speculative_generate
from specdec_course.model import GPTConfig
from specdec_course.stats import chi_square_test
from specdec_course.stats import counts as _counts

from .._support import as_vector, first_wrong, fmt, random_model
from ..context import case_seed, fresh_cases
from ..core import Case, call, register
from .copy_rule import (
    NAMED,
    _ids,
    _random_contexts,
    diagnose_copy,
    reference_copy,
    reference_propose,
)

_TOL = 1e-6  # how far a one-hot row may be from exactly one-hot


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
