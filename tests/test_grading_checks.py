"""The checks of exercises 01 and 02: right answers get full points, wrong ones lose them.

Each mutation below is a mistake students make; its check must fail and its message must
point to the mistake. The statistical check of ``speculative_sample`` uses fixed seeds and
``specdec_course.stats.chi_square_test`` against the exact (token, accepted) law; its
false-failure rate is below 1e-5 (asserted below), so a correct sampler fails it by chance
less than once in 100,000 runs, and with the fixed seeds these tests are deterministic.
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats as sps

import specdec_grader as grading
from specdec_course import sampling, stats, theory
from specdec_grader import run_check
from specdec_grader.judge import ex01, ex02

# --------------------------------------------------------------------------- correct answers


def residual_ok(p, q):
    # Row by row over the last axis: one position [V], or a batch of rows [..., V].
    r = (p - q).clamp(min=0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(1e-300), p)


def lesson_01_residual(p, q):
    # Lesson 01's cell (section 2), with the p == q guard it leaves out: one position only.
    r = torch.clamp(p - q, min=0)
    return r / r.sum() if r.sum() > 0 else p.clone()


def sample_with(residual=residual_ok, accept="p/q", draft="sample", resample="sample"):
    """A speculative sampler with one part swapped for a common mistake."""

    def speculative_sample(p, q, generator=None):
        if draft == "sample":
            x = int(torch.multinomial(q, 1, generator=generator))
        else:
            x = int(q.argmax())
        u = 1.0 - torch.rand((), dtype=torch.float64, generator=generator).item()
        ratio = p[x] / q[x] if accept == "p/q" else q[x] / p[x].clamp_min(1e-300)
        if u <= ratio:
            return x, True
        dist = residual(p, q)
        if resample == "sample":
            return int(torch.multinomial(dist, 1, generator=generator)), False
        return int(dist.argmax()), False

    return speculative_sample


def p_value_ok(counts, probs):
    keep = probs > 0
    e = counts.sum() * probs[keep]
    stat = float(((counts[keep] - e) ** 2 / e).sum())
    return float(sps.chi2.sf(stat, int(keep.sum()) - 1))


def expected_tokens_ok(alphas):
    total, reach = 1.0, 1.0
    for a in alphas:
        reach *= a
        total += reach
    return total


def speedup_ok(alphas, c, target_cost):
    return expected_tokens_ok(alphas) / (len(alphas) * c + target_cost(len(alphas) + 1))


def optimal_gamma_ok(alphas, c, target_cost):
    return max(range(len(alphas) + 1), key=lambda g: speedup_ok(alphas[:g], c, target_cost))


CORRECT = {
    "ex01.residual_distribution": ex01._reference_residual,
    "ex01.speculative_sample": sampling.speculative_sample,
    "ex01.chi_square_p_value": p_value_ok,
    "ex02.expected_tokens": expected_tokens_ok,
    "ex02.speedup": speedup_ok,
    "ex02.optimal_gamma": optimal_gamma_ok,
}


def test_every_registered_check_of_ex01_and_ex02_is_covered_here():
    ids = {s.id for ex in ("ex01", "ex02") for s in grading.checks_for(ex)}
    assert ids == set(CORRECT)
    assert sum(s.points for s in grading.checks_for("ex01")) == 10
    assert sum(s.points for s in grading.checks_for("ex02")) == 10


@pytest.mark.parametrize("check_id", sorted(CORRECT))
def test_the_package_reference_gets_full_points(check_id):
    res = run_check(check_id, CORRECT[check_id])
    assert res.status == "passed", res.report()
    assert res.points == res.max_points > 0


def test_a_plain_student_solution_gets_full_points_for_ex01():
    for cid, fn in [
        ("ex01.residual_distribution", residual_ok),
        ("ex01.speculative_sample", sample_with()),
    ]:
        assert run_check(cid, fn).passed, cid


def test_statistical_check_states_a_false_failure_rate_below_1e_5():
    res = run_check("ex01.speculative_sample", sampling.speculative_sample)
    assert 0 < res.false_failure_rate < 1e-5
    assert "by chance" in res.report()


def test_sample_sizes_make_the_naive_rule_fail_beyond_doubt():
    # Exact, not sampled: on the 5-token case the naive rule's chi-square statistic follows a
    # noncentral chi-square with noncentrality lam = n * sum((law_naive - law)^2 / law) over
    # the (token, accepted) bins. Its mean must sit more than 6 of its standard deviations
    # above the threshold, so that the naive rule passes by chance essentially never.
    name, pl, ql, n = ex01._SAMPLE_CASES[0]
    p, q = ex01._t(pl), ex01._t(ql)
    law = ex01._joint_law(p, q)
    alpha = theory.acceptance_rate(p, q)
    naive = torch.cat([torch.minimum(p, q), (1 - alpha) * p])
    keep = law > 0
    lam = n * float(((naive[keep] - law[keep]) ** 2 / law[keep]).sum())
    df = int(keep.sum()) - 1
    mean, sd = df + lam, math.sqrt(2 * (df + 2 * lam))
    assert mean - 6 * sd > stats.chi_square_threshold(df)
    assert sps.ncx2.cdf(stats.chi_square_threshold(df), df, lam) < 1e-9


def test_p_value_cases_pass_and_fail_as_their_names_say():
    cases = {name: ex01._reference_p_value(c, p) for name, c, p in ex01._p_value_cases()}
    assert cases["50,000 exact samples of p (should pass, p-value > 0.05)"] > 0.05
    assert cases["50,000 samples of the naive rule (should fail, p-value tiny)"] < 1e-6


# --------------------------------------------------------------------------- mutations


def _fails(check_id, fn, *words):
    res = run_check(check_id, fn)
    assert res.status in ("failed", "error"), res.report()
    assert res.points == 0
    text = (res.message + " " + res.report()).lower()
    for w in words:
        assert w.lower() in text, f"{w!r} not in: {res.report()}"
    return res


def test_resampling_from_p_instead_of_the_residual_is_caught():
    _fails(
        "ex01.speculative_sample", sample_with(residual=lambda p, q: p), "residual", "not from p"
    )


def test_forgetting_to_normalise_the_residual_is_caught():
    _fails("ex01.residual_distribution", lambda p, q: (p - q).clamp(min=0), "forgot to normalise")


def test_accepting_with_q_over_p_is_caught():
    _fails("ex01.speculative_sample", sample_with(accept="q/p"), "accepted", "p(x)/q(x)")


def test_argmax_draft_instead_of_sampling_is_caught():
    _fails("ex01.speculative_sample", sample_with(draft="argmax"), "argmax")


def test_argmax_resample_instead_of_sampling_is_caught():
    _fails("ex01.speculative_sample", sample_with(resample="argmax"), "sampled, not argmax")


def test_off_by_one_in_expected_tokens_is_caught():
    _fails("ex02.expected_tokens", lambda alphas: expected_tokens_ok(alphas) - 1, "one token short")


def test_adding_the_rates_instead_of_chaining_them_is_caught():
    _fails("ex02.expected_tokens", lambda alphas: 1.0 + sum(alphas), "added the rates")


def test_one_rate_for_every_draft_is_caught():
    def first_rate(alphas):
        return theory.expected_tokens(alphas[0], len(alphas)) if alphas else 1.0

    _fails("ex02.expected_tokens", first_rate, "first draft's rate")


def test_a_chi_square_check_that_always_passes_is_caught():
    _fails("ex01.chi_square_p_value", lambda counts, probs: 1.0, "always passes")


def test_wrong_degrees_of_freedom_are_caught():
    def df_k(counts, probs):
        keep = probs > 0
        e = counts.sum() * probs[keep]
        return float(sps.chi2.sf(float(((counts[keep] - e) ** 2 / e).sum()), int(keep.sum())))

    _fails("ex01.chi_square_p_value", df_k, "degrees of freedom")


def test_keeping_zero_probability_outcomes_is_caught():
    def no_drop(counts, probs):
        e = counts.sum() * probs
        return float(sps.chi2.sf(float(((counts - e) ** 2 / e).sum()), len(probs) - 1))

    _fails("ex01.chi_square_p_value", no_drop, "probability is 0")


def test_nan_when_p_equals_q_is_caught():
    def no_guard(p, q):
        r = (p - q).clamp(min=0)
        return r / r.sum()

    _fails("ex01.residual_distribution", no_guard, "p == q")


def test_lesson_01s_residual_fails_the_batch_cases():
    # The lesson's cell as printed: NaN on the p == q position.
    def lesson_cell(p, q):
        r = torch.clamp(p - q, min=0)
        return r / r.sum()

    _fails("ex01.residual_distribution", lesson_cell, "p == q")
    # Even with the guard, one sum for the whole batch mixes the rows.
    res = _fails("ex01.residual_distribution", lesson_01_residual, "whole batch by one sum")
    assert [c.passed for c in res.cases[:5]] == [True] * 5, res.report()  # the 1-D cases pass


def test_a_batch_row_with_p_equal_to_q_is_caught():
    def guard_for_one_position(p, q):  # per-row sums, but the p == q guard only for 1-D
        r = (p - q).clamp(min=0)
        if p.dim() == 1:
            return lesson_01_residual(p, q)
        return r / r.sum(-1, keepdim=True)

    _fails("ex01.residual_distribution", guard_for_one_position, "row 1 of the batch", "p == q")


def test_residual_of_q_minus_p_is_caught():
    _fails("ex01.residual_distribution", lambda p, q: residual_ok(q, p), "max(p - q, 0)")


def test_changing_p_in_place_is_caught():
    def in_place(p, q):
        p -= q
        p.clamp_(min=0)
        return p / p.sum() if p.sum() > 0 else p

    _fails("ex01.residual_distribution", in_place, "in place")


def test_a_closed_form_that_divides_by_zero_is_reported_with_its_case():
    def closed(alphas):
        a, g = (alphas[0] if alphas else 0.0), len(alphas)
        return (1 - a ** (g + 1)) / (1 - a)

    res = _fails("ex02.expected_tokens", closed)
    assert res.status == "error"
    assert "ZeroDivisionError" in res.message and "expected_tokens([1])" in res.message


def test_speedup_that_prices_the_target_call_as_one_step_is_caught():
    _fails(
        "ex02.speedup",
        lambda alphas, c, cost: expected_tokens_ok(alphas) / (len(alphas) * c + 1),
        "one plain step",
    )


def test_speedup_that_prices_the_target_call_over_gamma_tokens_is_caught():
    _fails(
        "ex02.speedup",
        lambda alphas, c, cost: (
            expected_tokens_ok(alphas) / (len(alphas) * c + cost(max(len(alphas), 1)))
        ),
        "without the pending token",
    )


def test_searching_gamma_only_up_to_len_minus_one_is_caught():
    def short(alphas, c, cost):
        return max(range(max(len(alphas), 1)), key=lambda g: speedup_ok(alphas[:g], c, cost))

    _fails("ex02.optimal_gamma", short, "never tried")


def test_never_returning_zero_gamma_is_caught():
    def from_one(alphas, c, cost):
        if not alphas:
            return 0
        return max(range(1, len(alphas) + 1), key=lambda g: speedup_ok(alphas[:g], c, cost))

    _fails("ex02.optimal_gamma", from_one, "do not speculate")


def test_stopping_at_the_first_fall_of_the_speedup_is_caught():
    def greedy(alphas, c, cost):
        g = 0
        while g < len(alphas) and speedup_ok(alphas[: g + 1], c, cost) >= speedup_ok(
            alphas[:g], c, cost
        ):
            g += 1
        return g

    _fails("ex02.optimal_gamma", greedy, "first gamma where the speedup falls")


def test_a_target_cost_outside_its_domain_raises_a_clear_error():
    with pytest.raises(ValueError, match="whole number"):
        ex02.LESSON04_COST(2.5)
    assert ex02.TargetCost.free()(7) == 1.0


# --------------------------------------------------------------------------- inline check


def _stub(*args, **kwargs):
    raise NotImplementedError("replace this line with your code")


def test_inline_check_reports_a_stub_as_not_attempted_with_zero_points(capsys):
    assert grading.check("ex01.residual_distribution", _stub) is None
    out = capsys.readouterr().out
    assert "0/3 points" in out and "NOT ATTEMPTED" in out


def test_inline_check_prints_points_cases_and_the_first_failure(capsys):
    grading.check("ex01.residual_distribution", lambda p, q: (p - q).clamp(min=0))
    out = capsys.readouterr().out
    assert "0/3 points, FAILED" in out
    assert "first failure: 5-token example" in out
    assert "expected:" in out and "got:" in out
    # The first failure names what is wrong; the fuller hint only on request.
    assert "hint:" not in out and "hint=True" in out
    grading.check("ex01.residual_distribution", lambda p, q: (p - q).clamp(min=0), hint=True)
    out = capsys.readouterr().out
    assert "hint:" in out and "hint=True" not in out


@pytest.mark.parametrize(
    "args",
    [
        ("ex01.no_such_check", residual_ok),
        ("ex99.anything", residual_ok),
        ("not an id", residual_ok),
        ("ex01.residual_distribution",),
        ("ex01", residual_ok),
    ],
)
def test_inline_check_never_raises_on_a_malformed_call(args, capsys):
    assert grading.check(*args) is None
    assert "check could not run" in capsys.readouterr().out


@pytest.mark.parametrize(
    "obj, status",
    [
        (42, "error"),
        (lambda p, q: "not numbers", "failed"),
        (lambda p, q: 1 / 0, "error"),
        (lambda p, q, extra: p, "error"),
        (lambda p, q: torch.ones(3), "failed"),
    ],
)
def test_inline_check_reports_odd_student_objects_without_raising(obj, status, capsys):
    grading.check("ex01.residual_distribution", obj)
    assert "0/3 points" in capsys.readouterr().out
    assert run_check("ex01.residual_distribution", obj).status == status


def test_a_function_that_loops_forever_times_out():
    def forever(p, q):
        while True:
            pass

    res = run_check("ex01.residual_distribution", forever, time_limit=0.3)
    assert res.status == "timeout" and res.points == 0


def test_whole_exercise_check_finds_functions_by_name(capsys):
    ns = {"expected_tokens": expected_tokens_ok, "speedup": speedup_ok}
    grading.check("ex02", ns)
    out = capsys.readouterr().out
    assert "ex02: 6/10 points" in out
    report = grading.grade_namespace("ex02", ns)
    missing = report.results[-1]
    assert missing.status == "missing" and "optimal_gamma" in missing.message


def test_a_function_imported_from_the_package_gets_no_points():
    ns = {"expected_tokens": sampling.residual_distribution, "speedup": speedup_ok}
    first = grading.grade_namespace("ex02", ns).results[0]
    assert first.status == "failed" and first.points == 0
    assert "imported rather than written" in first.message


def test_inline_check_stays_quiet_under_the_batch_grader(monkeypatch, capsys):
    monkeypatch.setenv(grading.BATCH_ENV, "1")
    grading.check("ex01.residual_distribution", _stub)
    assert "graded by the batch grader" in capsys.readouterr().out


def test_when_implemented_skips_only_not_implemented_errors(capsys):
    with grading.when_implemented("the plot"):
        _stub()
    assert "skipped the plot" in capsys.readouterr().out
    with pytest.raises(ZeroDivisionError), grading.when_implemented():
        _ = 1 / 0


def test_checks_leave_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    run_check("ex01.speculative_sample", sampling.speculative_sample)
    assert torch.equal(torch.rand(3), before)


# --------------------------------------------------------------------------- registry


def test_register_rejects_malformed_ids_duplicates_and_bad_points():
    with pytest.raises(ValueError, match="check_id"):
        grading.register("residual", points=1, needs="f")
    with pytest.raises(ValueError, match="points"):
        grading.register("ex01.x", points=0, needs="f")
    with pytest.raises(ValueError, match="needs"):
        grading.register("ex01.x", points=1, needs="not a name")
    with pytest.raises(ValueError, match="already registered"):

        @grading.register("ex01.residual_distribution", points=1, needs="f")
        def another(f):
            yield grading.Case("x", True)


def test_exercises_are_discovered_from_module_names():
    assert {"ex01", "ex02"} <= set(grading.exercises())
    with pytest.raises(ValueError, match="unknown exercise"):
        grading.checks_for("ex99")


def test_check_results_round_trip_through_dicts():
    res = run_check("ex01.residual_distribution", lambda p, q: p)
    again = grading.CheckResult.from_dict(res.to_dict())
    assert again == res and math.isclose(again.points, 0)
