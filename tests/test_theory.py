import math

import pytest
import torch

from specdec_course import theory

P = [0.50, 0.25, 0.15, 0.07, 0.03]
Q = [0.30, 0.40, 0.10, 0.15, 0.05]


def test_acceptance_rate_of_the_five_token_example_is_three_quarters():
    assert theory.acceptance_rate(P, Q) == pytest.approx(0.75, abs=1e-12)


def test_tv_distance_is_one_minus_acceptance():
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        p = torch.rand(17, generator=g, dtype=torch.float64).softmax(0)
        q = torch.rand(17, generator=g, dtype=torch.float64).pow(3).softmax(0)
        assert theory.tv_distance(p, q) == pytest.approx(
            1 - theory.acceptance_rate(p, q), abs=1e-12
        )


def test_acceptance_is_one_for_equal_and_zero_for_disjoint_distributions():
    assert theory.acceptance_rate(P, P) == pytest.approx(1.0)
    assert theory.acceptance_rate([1, 0, 0], [0, 0.5, 0.5]) == 0.0
    assert theory.tv_distance([1, 0, 0], [0, 0.5, 0.5]) == 1.0


@pytest.mark.parametrize(
    "alpha, gamma, expected",
    [
        (0.75, 3, 2.734375),
        (0.75, 7, 3.59954833984375),
        (0.9, 3, 3.439),
        (0.9, 7, 5.6953279),
        (0.0, 5, 1.0),
        (1.0, 5, 6.0),
        (0.5, 0, 1.0),
        (1.0, 0, 1.0),
    ],
)
def test_expected_tokens_matches_hand_computed_values(alpha, gamma, expected):
    assert theory.expected_tokens(alpha, gamma) == pytest.approx(expected, rel=1e-12)


def test_expected_tokens_is_the_mean_of_a_truncated_geometric_count():
    for alpha in (0.1, 0.5, 0.83, 0.99):
        for gamma in range(0, 9):
            direct = sum(alpha**i for i in range(gamma + 1))  # P(at least i accepted), i=0..gamma
            assert theory.expected_tokens(alpha, gamma) == pytest.approx(direct, rel=1e-12)


def test_expected_tokens_is_continuous_at_alpha_one():
    assert theory.expected_tokens(1 - 1e-9, 4) == pytest.approx(5.0, rel=1e-6)


def test_speedup_follows_theorem_3_8():
    assert theory.speedup(0.75, 3, 0.1) == pytest.approx(2.734375 / 1.3)
    assert theory.speedup(0.8, 0, 0.5) == 1.0  # no drafting: plain decoding
    assert theory.speedup(1.0, 4, 0.0) == 5.0
    assert theory.speedup(0.0, 4, 0.25) == pytest.approx(0.5)


def test_optimal_gamma_maximises_speedup_over_the_grid():
    for alpha in (0.5, 0.7, 0.8, 0.9, 0.95):
        for c in (0.01, 0.05, 0.1, 0.3):
            g = theory.optimal_gamma(alpha, c)
            best = max(theory.speedup(alpha, k, c) for k in range(0, 65))
            assert theory.speedup(alpha, g, c) == pytest.approx(best, rel=1e-12)
            assert g >= 1


def test_optimal_gamma_is_zero_when_speculation_cannot_win():
    assert theory.optimal_gamma(0.3, 0.3) == 0
    assert theory.optimal_gamma(0.2, 0.5) == 0
    assert all(theory.speedup(0.3, g, 0.3) <= 1 for g in range(20))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: theory.expected_tokens(1.5, 3), "alpha"),
        (lambda: theory.expected_tokens(-0.1, 3), "alpha"),
        (lambda: theory.expected_tokens(0.5, -1), "gamma"),
        (lambda: theory.expected_tokens(0.5, 2.5), "gamma"),
        (lambda: theory.speedup(0.5, 2, -0.1), "c must"),
        (lambda: theory.speedup(0.5, 2, math.nan), "c must"),
        (lambda: theory.acceptance_rate([0.5, 0.5], [1.0]), "same shape"),
        (lambda: theory.acceptance_rate([0.5, 0.6], [0.5, 0.5]), "sum to 1"),
        (lambda: theory.tv_distance([[0.5, 0.5]], [[0.5, 0.5]]), "1-D"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
