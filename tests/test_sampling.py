"""Exactness of the one-position rule: analytically (float64, 1e-12) and by chi-square.

Every chi-square test here uses threshold df + 10*sqrt(2 df); with 5 to 16 outcomes
(df 4 to 15) its false-failure rate is between 1.7e-6 and 4.9e-9 per test (the result object
reports the exact figure, asserted below to be < 1e-5).
"""

import numpy as np
import pytest
import torch

from specdec_course import sampling, stats, theory
from specdec_course.sampling import MIN_TEMPERATURE, SamplingOptions, process_logits

P = torch.tensor([0.50, 0.25, 0.15, 0.07, 0.03], dtype=torch.float64)
Q = torch.tensor([0.30, 0.40, 0.10, 0.15, 0.05], dtype=torch.float64)


def _pairs(n=40, V=12, seed=0):
    """Random (p, q) pairs plus the awkward ones: zeros in p and q, p == q, one-hot q,
    and an anti-correlated draft (draft logits = -target logits)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        logits = torch.randn(V, generator=g, dtype=torch.float64) * (1 + i % 4)
        p = logits.softmax(0)
        q = torch.randn(V, generator=g, dtype=torch.float64).mul(2).softmax(0)
        out.append((f"random{i}", p, q))
    lp = torch.randn(V, generator=g, dtype=torch.float64) * 2
    p = lp.softmax(0)
    out.append(("anti-correlated", p, (-lp).softmax(0)))
    pz = p.clone()
    pz[:4] = 0
    pz /= pz.sum()
    out.append(("zeros in p", pz, q))
    qz = q.clone()
    qz[-5:] = 0
    qz /= qz.sum()
    out.append(("zeros in q", p, qz))
    out.append(("zeros in both", pz, qz))
    out.append(("p == q", p, p.clone()))
    out.append(("one-hot q", p, torch.nn.functional.one_hot(torch.tensor(3), V).double()))
    out.append(
        ("one-hot q where p is 0", pz, torch.nn.functional.one_hot(torch.tensor(0), V).double())
    )
    out.append(
        ("disjoint supports", pz, torch.cat([torch.full((4,), 0.25), torch.zeros(V - 4)]).double())
    )
    return out


@pytest.mark.parametrize("draft", ["sample", "greedy"])
def test_rule_output_distribution_equals_target_exactly(draft):
    for name, p, q in _pairs():
        out = sampling.speculative_output_distribution(p, q, draft=draft)
        assert torch.allclose(out, p, rtol=0, atol=1e-12), name


def test_residual_is_normalised_positive_part_of_p_minus_q():
    for name, p, q in _pairs():
        r = sampling.residual_distribution(p, q)
        if torch.equal(p, q):
            assert torch.equal(r, p), "p == q is documented to return p"
            continue
        expected = (p - q).clamp_min(0)
        assert torch.allclose(r, expected / expected.sum(), atol=1e-15), name
        assert r.sum().item() == pytest.approx(1.0, abs=1e-12)


def test_residual_of_the_five_token_example():
    r = sampling.residual_distribution(P, Q)
    assert torch.allclose(r, torch.tensor([0.8, 0, 0.2, 0, 0], dtype=torch.float64), atol=1e-12)


def test_naive_rule_puts_0425_on_token_zero():
    naive = sampling.speculative_output_distribution(P, Q, resample="target")
    assert naive[0].item() == pytest.approx(0.425, abs=1e-12)  # min(.5,.3) + .25 * .5
    assert not torch.allclose(naive, P, atol=1e-3)


def _sample_counts(p, q, n, seed, **kw):
    g = torch.Generator().manual_seed(seed)
    tokens = [sampling.speculative_sample(p, q, generator=g, **kw)[0] for _ in range(n)]
    return stats.counts(tokens, p.numel())


@pytest.mark.parametrize(
    "case",
    ["five-token sampled", "five-token greedy", "anti-correlated", "zeros", "p == q", "one-hot q"],
)
def test_speculative_samples_pass_chi_square_against_target(case):
    g = torch.Generator().manual_seed(3)
    V = 8
    lp = torch.randn(V, generator=g, dtype=torch.float64) * 1.5
    p8 = lp.softmax(0)
    p, q, draft = {
        "five-token sampled": (P, Q, "sample"),
        "five-token greedy": (P, Q, "greedy"),
        "anti-correlated": (p8, (-lp).softmax(0), "sample"),
        "zeros": (
            torch.tensor([0.0, 0.4, 0.0, 0.3, 0.2, 0.1], dtype=torch.float64),
            torch.tensor([0.5, 0.0, 0.1, 0.0, 0.2, 0.2], dtype=torch.float64),
            "sample",
        ),
        "p == q": (p8, p8.clone(), "sample"),
        "one-hot q": (p8, torch.nn.functional.one_hot(torch.tensor(2), V).double(), "sample"),
    }[case]
    c = _sample_counts(p, q, 100_000, seed=11, draft=draft)
    res = stats.chi_square_test(c, p)
    assert res.false_failure_rate < 1e-5
    assert res.passed, str(res)


def test_chi_square_flags_the_naive_rule_as_biased():
    c = _sample_counts(P, Q, 100_000, seed=12, resample="target")
    res = stats.chi_square_test(c, P)
    assert not res.passed, str(res)
    assert res.statistic > 50 * res.threshold


def test_acceptance_frequency_matches_alpha():
    g = torch.Generator().manual_seed(5)
    n = 40_000
    acc = sum(sampling.speculative_sample(P, Q, generator=g)[1] for _ in range(n))
    # Binomial(n, 0.75): sd = 0.0022; 6 sd bounds fail by chance with probability 2e-9.
    assert abs(acc / n - theory.acceptance_rate(P, Q)) < 6 * np.sqrt(0.75 * 0.25 / n)
    acc_g = sum(sampling.speculative_sample(P, Q, generator=g, draft="greedy")[1] for _ in range(n))
    assert abs(acc_g / n - 0.25) < 6 * np.sqrt(0.25 * 0.75 / n)


def test_greedy_draft_proposes_argmax():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    q = torch.tensor([0.1, 0.7, 0.2], dtype=torch.float64)
    # p(argmax q) = 0: the draft is always rejected and the residual is p.
    for _ in range(50):
        assert sampling.speculative_sample(p, q, generator=g, draft="greedy") == (2, False)


def test_zero_probability_tokens_are_never_emitted():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.0, 0.5, 0.5, 0.0], dtype=torch.float64)
    q = torch.tensor([0.7, 0.1, 0.1, 0.1], dtype=torch.float64)
    toks = {sampling.speculative_sample(p, q, generator=g)[0] for _ in range(3000)}
    assert toks <= {1, 2}


def test_same_seed_same_samples():
    a = [
        sampling.speculative_sample(P, Q, generator=torch.Generator().manual_seed(9))
        for _ in range(3)
    ]
    b = [
        sampling.speculative_sample(P, Q, generator=torch.Generator().manual_seed(9))
        for _ in range(3)
    ]
    assert a == b


def test_exponential_race_samples_proportionally_to_unnormalised_weights():
    w = torch.tensor([3.0, 0.0, 1.0, 6.0, 0.5])
    g = torch.Generator().manual_seed(21)
    noise = sampling.exp_noise((100_000, 5), generator=g)
    winners = (w / noise).argmax(-1)
    res = stats.chi_square_test(stats.counts(winners, 5), (w / w.sum()).double())
    assert res.passed, str(res)
    assert sampling.exponential_race(w, noise=noise[0]) == int(winners[0])


def test_exponential_race_with_one_positive_weight_returns_it():
    assert (
        sampling.exponential_race([0.0, 0.0, 2.0], generator=torch.Generator().manual_seed(0)) == 2
    )


@pytest.mark.parametrize(
    "p, q, match",
    [
        ([0.5, 0.5], [0.2, 0.3, 0.5], "same shape"),
        ([[0.5, 0.5]], [[0.5, 0.5]], "1-D"),
        ([0.5, float("nan")], [0.5, 0.5], "NaN"),
        ([1.2, -0.2], [0.5, 0.5], "negative"),
        ([0.5, 0.6], [0.5, 0.5], "sum to 1"),
        ([0.5, 0.5], [2.0, 3.0], "sum to 1"),
        ([], [], "empty"),
        ("ab", [0.5, 0.5], "torch.Tensor"),
    ],
)
def test_bad_distributions_raise_value_error_naming_the_argument(p, q, match):
    with pytest.raises(ValueError, match=match):
        sampling.speculative_sample(p, q)
    with pytest.raises(ValueError, match=match):
        sampling.residual_distribution(p, q)


def test_bad_options_raise():
    with pytest.raises(ValueError, match="draft must be"):
        sampling.speculative_sample(P, Q, draft="argmax")
    with pytest.raises(ValueError, match="resample must be"):
        sampling.speculative_sample(P, Q, resample="p")
    with pytest.raises(ValueError, match="all zero"):
        sampling.exponential_race([0.0, 0.0])


def test_numpy_and_lists_are_accepted():
    r1 = sampling.residual_distribution(np.array([0.5, 0.5]), np.array([0.9, 0.1]))
    r2 = sampling.residual_distribution([0.5, 0.5], [0.9, 0.1])
    assert torch.equal(r1, r2) and torch.equal(r1, torch.tensor([0.0, 1.0], dtype=torch.float64))


# --------------------------------------------------------------------------- logit processing


def test_temperature_zero_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    probs = sampling.process_logits(logits, temperature=0)
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_temperature_scales_logits():
    logits = torch.randn(10, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(sampling.process_logits(logits, 0.5), (logits / 0.5).softmax(-1))


def test_top_k_keeps_k_largest():
    logits = torch.tensor([1.0, 4.0, 3.0, 2.0, 0.0])
    probs = sampling.process_logits(logits, top_k=2)
    assert torch.equal(probs > 0, torch.tensor([False, True, True, False, False]))
    assert torch.allclose(probs[1:3], torch.tensor([4.0, 3.0]).softmax(0))


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = torch.tensor([0.1, 0.5, 0.25, 0.15])
    out = sampling.process_logits(probs.log(), top_p=0.7)
    # 0.5 + 0.25 = 0.75 >= 0.7: keep tokens 1 and 2 only.
    assert torch.equal(out > 0, torch.tensor([False, True, True, False]))
    assert torch.allclose(out[[1, 2]], torch.tensor([0.5, 0.25]) / 0.75)
    top1 = sampling.process_logits(probs.log(), top_p=0.3)
    assert torch.equal(top1, torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_processing_options_are_validated():
    with pytest.raises(ValueError, match="temperature"):
        sampling.process_logits(torch.zeros(3), temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        sampling.process_logits(torch.zeros(3), top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        sampling.process_logits(torch.zeros(3), top_p=1.5)


@pytest.mark.parametrize("t", [1e-320, 1e-7, float("inf"), float("nan"), -0.5, True, "1"])
def test_temperatures_that_underflow_or_are_not_finite_are_rejected_with_the_range(t):
    with pytest.raises(ValueError, match=r"0 \(greedy\) or a finite number >= 1e-06"):
        SamplingOptions(t)
    with pytest.raises(ValueError, match="finite number"):
        process_logits(torch.zeros(3), t)


def test_the_smallest_temperature_gives_finite_probabilities():
    logits = torch.tensor([30.0, -30.0, 29.999])
    p = process_logits(logits, MIN_TEMPERATURE)
    assert torch.isfinite(p).all() and p.sum().item() == pytest.approx(1.0)
    assert torch.isfinite(SamplingOptions(MIN_TEMPERATURE).logits(logits)).all()


def test_the_accept_test_is_one_rule_on_floats_tensors_and_arrays():
    # sampling.accepts is the accept test of every Python path: Python floats (the batch-1
    # loops), float64 tensors (the batched verifier) and NumPy arrays (the batched loop)
    # must give the same verdicts, with p(x) = 0 never accepted and u = q/p on the boundary.
    g = torch.Generator().manual_seed(0)
    u = sampling.uniform_open_closed((2000,), generator=g)
    q = torch.rand(2000, generator=g, dtype=torch.float64)
    p = torch.rand(2000, generator=g, dtype=torch.float64)
    p[::7] = 0.0
    q[::11] = 0.0
    boundary = (p[::13] / q[::13]).nan_to_num(nan=1.0).clamp(min=1e-300, max=1.0)
    u[::13] = boundary  # on the boundary u = p/q (or past it by rounding)
    want = [pp > 0 and uu * qq <= pp for uu, qq, pp in zip(u.tolist(), q.tolist(), p.tolist())]
    on_floats = [sampling.accepts(*t) for t in zip(u.tolist(), q.tolist(), p.tolist())]
    assert on_floats == want
    assert sampling.accepts(u, q, p).tolist() == want
    assert sampling.accepts(u.numpy(), q.numpy(), p.numpy()).tolist() == want
    assert not sampling.accepts(1e-300, 1.0, 0.0)  # probability 0 is never accepted
    # float32 p and q promoted exactly to u's float64, as the verifiers compare them
    p32, q32 = p.float(), q.float()
    got = sampling.accepts(u.numpy(), q32.numpy(), p32.numpy()).tolist()
    assert got == sampling.accepts(u, q32.double(), p32.double()).tolist()
