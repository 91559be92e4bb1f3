"""Exercise 08's checks: correct rules pass (visible and fresh cases), each common mistake fails.

Every check is exact (no sampling), so none of these tests can fail a correct rule by chance.
"""

from __future__ import annotations

import pytest

import specdec_grader as grading
from specdec_course import theory
from specdec_grader import run_check
from specdec_grader.judge.context import grading_seed


def next_k(k, drafted, accepted, k_max, *, grow_when_short=True, floor=1, idle_keeps=True):
    if drafted == 0 and idle_keeps:
        return k
    full = accepted == drafted if grow_when_short else accepted == drafted == k
    return min(k + 2, k_max) if full else max(k - 1, floor)


def alpha_estimate(outcomes, prior_alpha, prior_weight, *, count="looked", prior=True):
    acc = sum(a for _, a in outcomes)
    if count == "looked":
        looked = sum(a + (a < d) for d, a in outcomes)
    elif count == "drafted":
        looked = sum(d for d, _ in outcomes)
    else:  # the rejections forgotten
        looked = acc
    if not prior:
        return acc / looked if looked else prior_alpha
    return (acc + prior_weight * prior_alpha) / (looked + prior_weight)


def controller_k(outcomes, c, k_max, *, floor=1):
    alpha = min(1.0, alpha_estimate(outcomes, 0.5, 2.0))
    return max(floor, theory.optimal_gamma(alpha, c, k_max))


def confidence_stop(top_probs, p_min, *, keep_unsure=True, strict=True):
    for i, t in enumerate(top_probs):
        if (t < p_min) if strict else (t <= p_min):
            return i + 1 if keep_unsure else i
    return len(top_probs)


CORRECT = {
    "ex08.next_k": next_k,
    "ex08.alpha_estimate": alpha_estimate,
    "ex08.controller_k": controller_k,
    "ex08.confidence_stop": confidence_stop,
}


def _fails(check_id, fn, *words):
    res = run_check(check_id, fn)
    assert res.status in ("failed", "error") and res.points == 0, res.report()
    text = (res.message + " " + res.report()).lower()
    for w in words:
        assert w.lower() in text, f"{w!r} not in: {res.report()}"


def test_ex08_registers_four_checks_worth_ten_points():
    specs = grading.checks_for("ex08")
    assert [s.id for s in specs] == list(CORRECT)
    assert sum(s.points for s in specs) == 10


@pytest.mark.parametrize("seed", [None, 11, 12])
@pytest.mark.parametrize("check_id", list(CORRECT))
def test_correct_rules_get_full_points_on_visible_and_fresh_cases(check_id, seed):
    with grading_seed(seed):
        res = run_check(check_id, CORRECT[check_id])
    assert res.status == "passed", res.report()


def test_shrinking_after_a_short_but_fully_accepted_proposal_is_caught():
    _fails("ex08.next_k", lambda *a: next_k(*a, grow_when_short=False), "grow k")


def test_shrinking_to_zero_is_caught():
    _fails("ex08.next_k", lambda *a: next_k(*a, floor=0), "below 1")


def test_reacting_to_an_iteration_that_drafted_nothing_is_caught():
    _fails("ex08.next_k", lambda *a: next_k(*a, idle_keeps=False), "drafted nothing")


def test_counting_every_drafted_token_as_tested_is_caught():
    _fails(
        "ex08.alpha_estimate",
        lambda *a: alpha_estimate(*a, count="drafted"),
        "never looked at",
    )


def test_forgetting_the_rejections_is_caught():
    _fails("ex08.alpha_estimate", lambda *a: alpha_estimate(*a, count="accepted"), "rejections")


def test_forgetting_the_prior_is_caught():
    _fails("ex08.alpha_estimate", lambda *a: alpha_estimate(*a, prior=False), "prior")


def test_a_controller_that_switches_speculation_off_is_caught():
    _fails("ex08.controller_k", lambda *a: controller_k(*a, floor=0), "never be measured")


def test_a_controller_ignoring_k_max_is_caught():
    _fails("ex08.controller_k", lambda o, c, k_max: controller_k(o, c, 64), "k_max")


def test_dropping_the_unsure_draft_is_caught():
    _fails("ex08.confidence_stop", lambda *a: confidence_stop(*a, keep_unsure=False), "keep it")


def test_treating_exactly_p_min_as_unsure_is_caught():
    _fails("ex08.confidence_stop", lambda *a: confidence_stop(*a, strict=False))


def test_untouched_stubs_are_not_attempted():
    def stub(*args):
        raise NotImplementedError("replace this line with your code")

    for check_id in CORRECT:
        assert run_check(check_id, stub).status == "not attempted"
