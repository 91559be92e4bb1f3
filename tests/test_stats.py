import math

import numpy as np
import pytest
import torch
from scipy import stats as sps

from specdec_course import stats


def test_threshold_is_mean_plus_ten_standard_deviations():
    assert stats.chi_square_threshold(8) == pytest.approx(8 + 10 * 4)


def test_exact_counts_pass_and_shifted_counts_fail():
    p = np.array([0.5, 0.25, 0.15, 0.07, 0.03])
    n = 100_000
    assert stats.chi_square_test(p * n, p).statistic == pytest.approx(0.0)
    biased = np.array([0.425, 0.3125, 0.1375, 0.0875, 0.0375]) * n
    res = stats.chi_square_test(biased, p)
    assert not res.passed and res.statistic > 1000


def test_statistic_and_p_value_match_scipy_when_no_bins_merge():
    obs = np.array([480, 260, 160, 70, 30])
    p = np.array([0.5, 0.25, 0.15, 0.07, 0.03])
    res = stats.chi_square_test(obs, p)
    ref = sps.chisquare(obs, p * obs.sum())
    assert res.statistic == pytest.approx(ref.statistic)
    assert res.p_value == pytest.approx(ref.pvalue)
    assert res.df == 4
    assert res.false_failure_rate == pytest.approx(sps.chi2.sf(4 + 10 * math.sqrt(8), 4))


def test_small_expected_bins_are_merged_until_each_reaches_five():
    p = np.array([0.9, 0.05, 0.03, 0.01, 0.005, 0.005])
    obs = np.array([90, 5, 3, 1, 1, 0])  # n = 100: expected 90, 5, 3, 1, .5, .5
    res = stats.chi_square_test(obs, p)
    # .5 + .5 + 1 + 3 = 5 forms one bin, then 5, then 90.
    assert res.bins == 3 and res.df == 2


def test_an_impossible_outcome_fails_outright():
    res = stats.chi_square_test([50, 50, 1], [0.5, 0.5, 0.0])
    assert not res.passed and math.isinf(res.statistic)


def test_zero_probability_bins_with_no_observations_are_ignored():
    res = stats.chi_square_test([50, 50, 0], [0.5, 0.5, 0.0])
    assert res.passed and res.df == 1


def test_bad_input_raises():
    with pytest.raises(ValueError, match="bins"):
        stats.chi_square_test([1, 2], [0.5, 0.25, 0.25])
    with pytest.raises(ValueError, match="sum to 1"):
        stats.chi_square_test([1, 2], [0.5, 0.6])
    with pytest.raises(ValueError, match="no samples"):
        stats.chi_square_test([0, 0], [0.5, 0.5])
    with pytest.raises(ValueError, match="lie in"):
        stats.counts([0, 3], 3)


def test_round_probs_is_exact_binary_summing_to_one_and_blind_to_last_bits():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(3 * torch.randn(8, 65, generator=g, dtype=torch.float64), -1)
    r = stats.round_probs(p)
    assert r.dtype == torch.float64 and r.shape == p.shape
    assert torch.equal(r * 2**24, torch.round(r * 2**24))  # multiples of 2^-24
    assert torch.equal(r.sum(-1), torch.ones(8, dtype=torch.float64))  # exactly 1
    assert torch.equal(r.float().double(), r)  # exact in float32 too
    assert (r - p).abs().max() < 2**-24 * 65
    # Probabilities that differ in their last bits (another CPU's summation order) round alike.
    wobble = p * (1 + 4e-16 * torch.randn(8, 65, generator=g, dtype=torch.float64))
    assert torch.equal(stats.round_probs(wobble / wobble.sum(-1, keepdim=True)), r)


def test_round_probs_rejects_what_is_not_a_distribution():
    for bad in (
        torch.tensor([0.5, -0.1, 0.6]),
        torch.tensor([float("nan"), 1.0]),
        torch.tensor([]),
    ):
        with pytest.raises(ValueError):
            stats.round_probs(bad)
    with pytest.raises(ValueError, match="bits"):
        stats.round_probs(torch.tensor([1.0]), bits=60)


def test_format_rate_prints_a_bound_that_holds():
    assert stats.format_rate(1.6948e-06) == "< 1e-05"
    assert stats.format_rate(5.0e-11) == "< 1e-10"
    assert stats.format_rate(9.99e-5) == "< 1e-04"
    assert stats.format_rate(1e-7) == "< 1e-07"
    assert stats.format_rate(0.0) == "0"
    for rate in (3.14159e-7, 1.0001e-3, 9.9999e-9, 1e-7):
        bound = float(stats.format_rate(rate).removeprefix("< "))
        assert rate <= bound < rate * 10  # the next power of ten, no mantissa digits
