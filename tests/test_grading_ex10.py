"""Exercise 10's checks: a correct rule passes (visible and fresh cases), each slip fails.

Every check is exact (no sampling), so none of these tests can fail a correct rule by chance.
"""

from __future__ import annotations

import math

import pytest
import torch

import specdec_grader as grading
from specdec_grader import run_check
from specdec_grader.judge.context import grading_seed


def coin_thresholds(p, q, draft, *, cap=True, carry=True, zero_zero=1.0, last="weight",
                    tokenwise=False, next_row=True):  # fmt: skip
    k = len(draft)
    w, ratio = [1.0], []
    for i in range(k):
        px, qx = float(p[i, draft[i]]), float(q[i, draft[i]])
        ratio.append(min(1.0, px / qx))
        num = (w[-1] if carry else 1.0) * px
        w.append(num / qx if not cap else (1.0 if num >= qx else num / qx))
    h = []
    for i in range(1, k):
        j = i if next_row else i - 1
        r = float((w[i] * p[j] - q[j]).clamp_min(0).sum())
        den = r + 1 - w[i]
        h.append(ratio[i - 1] if tokenwise else (r / den if den > 0 else zero_zero))
    if last == "weight":
        h.append(w[k])
    else:  # the last draft's own ratio, as token-wise verification would
        h.append(ratio[-1])
    return torch.tensor(w, dtype=torch.float64), torch.tensor(h, dtype=torch.float64)


def emitted_law(p, q, draft, *, guard=True, longest=True, weighted=True, bonus=True):
    k, V = len(draft), p.shape[1]
    w, h = coin_thresholds(p, q, draft)
    if not longest:  # token-wise: stop at the first failed coin
        a = [min(1.0, float(p[i, draft[i]] / q[i, draft[i]])) for i in range(k)]
        keep = [math.prod(a[:i]) * (1 - a[i]) if i < k else math.prod(a) for i in range(k + 1)]
        w = torch.ones(k + 1, dtype=torch.float64)
    else:
        keep = [
            (1.0 if i == 0 else float(h[i - 1])) * (float(torch.prod(1 - h[i:])) if i < k else 1.0)
            for i in range(k + 1)
        ]
    law = torch.zeros(k + 1, V, dtype=torch.float64)
    for i in range(k + 1):
        if i == k and bonus:
            law[i] = keep[i] * p[k]
        else:
            res = ((w[i] if weighted else 1.0) * p[min(i, k)] - q[min(i, k - 1)]).clamp_min(0)
            if res.sum() > 0 or not guard:  # no residual mass: the block (almost) never stops
                law[i] = keep[i] * res / res.sum()
    return law


CORRECT = {"ex10.coin_thresholds": coin_thresholds, "ex10.emitted_law": emitted_law}


def _fails(check_id, fn, *words):
    res = run_check(check_id, fn)
    assert res.status in ("failed", "error") and res.points == 0, res.report()
    text = (res.message + " " + res.report()).lower()
    for w in words:
        assert w.lower() in text, f"{w!r} not in: {res.report()}"


def test_ex10_registers_two_checks_worth_ten_points():
    specs = grading.checks_for("ex10")
    assert [s.id for s in specs] == list(CORRECT)
    assert sum(s.points for s in specs) == 10


@pytest.mark.parametrize("seed", [None, 11, 12])
@pytest.mark.parametrize("check_id", list(CORRECT))
def test_a_correct_rule_gets_full_points_on_visible_and_fresh_cases(check_id, seed):
    with grading_seed(seed):
        res = run_check(check_id, CORRECT[check_id])
    assert res.status == "passed", res.report()


@pytest.mark.parametrize("value", [0.0, 0.5])
def test_any_threshold_in_0_1_is_exact_where_the_formula_is_0_over_0(value):
    res = run_check("ex10.coin_thresholds", lambda *a: coin_thresholds(*a, zero_zero=value))
    assert res.status == "passed", res.report()


def test_nan_at_0_over_0_is_caught():
    _fails(
        "ex10.coin_thresholds",
        lambda *a: coin_thresholds(*a, zero_zero=math.nan),
        "NaN or inf in a threshold",
    )


def test_inf_at_0_over_0_is_caught():
    _fails("ex10.coin_thresholds", lambda *a: coin_thresholds(*a, zero_zero=math.inf), "NaN or inf")


def test_an_uncapped_weight_is_caught():
    _fails("ex10.coin_thresholds", lambda *a: coin_thresholds(*a, cap=False), "capped at 1")


def test_a_weight_that_forgets_the_prefix_is_caught():
    _fails("ex10.coin_thresholds", lambda *a: coin_thresholds(*a, carry=False), "forward")


def test_the_last_drafts_own_ratio_as_its_threshold_is_caught():
    _fails("ex10.coin_thresholds", lambda *a: coin_thresholds(*a, last="ratio"), "last draft")


def test_token_wise_thresholds_are_caught():
    _fails("ex10.coin_thresholds", lambda *a: coin_thresholds(*a, tokenwise=True), "token-wise")


def test_the_residual_of_the_wrong_position_is_caught():
    _fails("ex10.coin_thresholds", lambda *a: coin_thresholds(*a, next_row=False), "next position")


def test_zero_times_zero_over_zero_in_the_law_is_caught():
    _fails("ex10.emitted_law", lambda *a: emitted_law(*a, guard=False), "never stop at")


def test_token_wise_verifications_law_is_caught():
    _fails("ex10.emitted_law", lambda *a: emitted_law(*a, longest=False), "token-wise")


def test_an_unweighted_residual_is_caught():
    _fails("ex10.emitted_law", lambda *a: emitted_law(*a, weighted=False), "weight")


def test_a_residual_instead_of_the_bonus_row_is_caught():
    _fails("ex10.emitted_law", lambda *a: emitted_law(*a, bonus=False))


def test_untouched_stubs_are_not_attempted():
    def stub(*args):
        raise NotImplementedError("replace this line with your code")

    for check_id in CORRECT:
        assert run_check(check_id, stub).status == "not attempted"
