"""Exercise 09's checks: a correct proposer passes (visible and fresh cases), each slip fails.

The statistical cases (the chi-square of the drafted blocks, the summed fit) run on fixed
seeds; a correct proposer fails one of them by chance with probability below 1e-6 (the
report states it), and the wrong samplers below miss by orders of magnitude.
"""

from __future__ import annotations

import pytest
import torch

import specdec_grader as grading
from specdec_grader import run_check
from specdec_grader.judge.context import grading_seed


def _key(table, context, *, backoff=True, oldest=False):
    n = 1 + max(len(h) for h in table)
    ctx = tuple(context)
    if oldest and len(ctx) > n - 1:
        ctx = ctx[: n - 1]
    for L in range(min(n - 1, len(ctx)), -1, -1):
        h = ctx[len(ctx) - L :] if L else ()
        if h in table or not backoff:
            return h
    return ()


def ngram_q(table, context, *, smoothing="add-one", backoff=True, oldest=False):
    h = _key(table, context, backoff=backoff, oldest=oldest)
    V = table[()].numel()
    c = table[h].double() if h in table else torch.zeros(V, dtype=torch.float64)
    if smoothing == "raw":
        return c / c.sum()
    if smoothing == "one-total":
        return (c + 1) / (c.sum() + 1)
    if smoothing == "lesson":  # lesson 07's interpolated absolute discounting, D = 0.9
        p = torch.full((V,), 1.0 / V, dtype=torch.float64)
        for L in range(len(h) + 1):
            cc = table[h[len(h) - L :] if L else ()].double()
            p = ((cc - 0.9).clamp_min(0) + 0.9 * (cc > 0).sum() * p) / cc.sum()
        return p
    return (c + 1) / (c.sum() + V)


def ngram_propose(table, context, k, generator, *, sample_from=None, extend=True, nan=False):
    ctx, drafts, rows = list(context), [], []
    for _ in range(k):
        q = ngram_q(table, ctx)
        s = q if sample_from is None else sample_from(table, ctx, q)
        x = int(torch.multinomial(s, 1, generator=generator))
        drafts.append(x)
        rows.append(torch.full_like(q, float("nan")) if nan else q)
        if extend:
            ctx.append(x)
    return torch.tensor(drafts), torch.stack(rows)


CORRECT = {"ex09.ngram_q": ngram_q, "ex09.ngram_propose": ngram_propose}


def _fails(check_id, fn, *words):
    res = run_check(check_id, fn)
    assert res.status in ("failed", "error") and res.points == 0, res.report()
    text = (res.message + " " + res.report()).lower()
    for w in words:
        assert w.lower() in text, f"{w!r} not in: {res.report()}"


def test_ex09_registers_two_checks_worth_ten_points():
    specs = grading.checks_for("ex09")
    assert [s.id for s in specs] == list(CORRECT)
    assert sum(s.points for s in specs) == 10


@pytest.mark.parametrize("seed", [None, 11, 12])
@pytest.mark.parametrize("check_id", list(CORRECT))
def test_a_correct_proposer_gets_full_points_on_visible_and_fresh_cases(check_id, seed):
    with grading_seed(seed):
        res = run_check(check_id, CORRECT[check_id])
    assert res.status == "passed", res.report()
    assert res.false_failure_rate < 1e-6


def test_raw_frequencies_are_caught():
    _fails("ex09.ngram_q", lambda t, c: ngram_q(t, c, smoothing="raw"), "raw frequencies")


def test_a_row_that_does_not_sum_to_one_is_caught():
    _fails("ex09.ngram_q", lambda t, c: ngram_q(t, c, smoothing="one-total"), "sums to 1")


def test_no_backoff_is_caught():
    _fails("ex09.ngram_q", lambda t, c: ngram_q(t, c, backoff=False), "back off")


def test_the_oldest_tokens_as_context_are_caught():
    _fails("ex09.ngram_q", lambda t, c: ngram_q(t, c, oldest=True), "last n - 1")


def test_lesson_07s_interpolated_discounting_is_not_this_exercise():
    _fails("ex09.ngram_q", lambda t, c: ngram_q(t, c, smoothing="lesson"))


def test_rows_not_conditioned_on_the_drafts_are_caught_by_the_audit():
    _fails(
        "ex09.ngram_propose",
        lambda *a: ngram_propose(*a, extend=False),
        "after the context and the drafts before it",
    )


def test_nan_rows_fail_the_audit():
    _fails("ex09.ngram_propose", lambda *a: ngram_propose(*a, nan=True), "NaN")


def test_reporting_the_smoothed_q_but_sampling_the_raw_counts_is_caught():
    def raw(table, ctx, q):
        return ngram_q(table, ctx, smoothing="raw")

    _fails(
        "ex09.ngram_propose",
        lambda *a: ngram_propose(*a, sample_from=raw),
        "do not follow the rows you report",
    )


def test_reporting_q_but_sampling_its_square_is_caught():
    # A subtler mismatch: sharper than the reported row, as a temperature below 1 would be.
    _fails(
        "ex09.ngram_propose",
        lambda *a: ngram_propose(*a, sample_from=lambda t, c, q: q**2),
        "do not follow the rows you report",
    )


def test_a_greedy_draft_reporting_its_row_is_caught():
    def argmax(table, ctx, q):
        return torch.nn.functional.one_hot(q.argmax(), q.numel()).double()

    _fails("ex09.ngram_propose", lambda *a: ngram_propose(*a, sample_from=argmax))


def test_a_proposer_that_ignores_its_generator_still_passes_when_seeded_globally():
    def global_rng(table, context, k, generator):
        return ngram_propose(table, context, k, None)

    assert run_check("ex09.ngram_propose", global_rng).status == "passed"


def test_untouched_stubs_are_not_attempted():
    def stub(*args):
        raise NotImplementedError("replace this line with your code")

    for check_id in CORRECT:
        assert run_check(check_id, stub).status == "not attempted"
