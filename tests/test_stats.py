import math

import numpy as np
import pytest
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
