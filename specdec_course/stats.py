"""Goodness-of-fit checks used by every statistical test in the course.

A sampler is checked against the exact distribution it should follow (never against another
sample) with Pearson's chi-square test. Bins whose expected count is below ``min_expected``
are merged, smallest first, so the chi-square approximation holds.

Threshold. We reject when ``chi2 > df + 10 * sqrt(2 * df)``: the mean of the chi-square
distribution plus ten of its standard deviations. Its false-failure rate (the probability that
an exact sampler fails) is ``scipy.stats.chi2.sf(threshold, df)``, which every result reports:
1.0e-4 at df = 1, 1.7e-5 at df = 2, 1.7e-6 at df = 4, 4.9e-9 at df = 15 and 1.2e-10 at
df = 30, falling further as df grows. A
wrong sampler with a bias of a few percent over 100k samples overshoots it by orders of
magnitude.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats as _sps

__all__ = [
    "ChiSquareResult",
    "chi_square_test",
    "chi_square_threshold",
    "counts",
    "frequencies",
    "format_rate",
    "round_probs",
]


def chi_square_threshold(df: int) -> float:
    """Rejection threshold ``df + 10 * sqrt(2 * df)`` (mean plus ten standard deviations)."""
    return df + 10.0 * math.sqrt(2.0 * df)


@dataclass(frozen=True)
class ChiSquareResult:
    statistic: float
    df: int
    threshold: float
    p_value: float
    false_failure_rate: float
    passed: bool
    n: int
    bins: int

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"chi2 = {self.statistic:.2f} on {self.df} df (threshold {self.threshold:.1f}, "
            f"false-failure rate {format_rate(self.false_failure_rate)}), n = {self.n}: {verdict}"
        )


def format_rate(rate: float) -> str:
    """A small probability as a bound that reads the same on every machine: ``"< 1e-10"``.

    The rate is rounded *up* to the next power of ten, so the printed bound always holds and
    carries no digit that another machine could print differently: a chi-square test's rate
    follows its degrees of freedom, which pooling sets from expected counts computed in
    floating point, so two CPUs may disagree in the mantissa but rarely in the decade.
    """
    if not rate > 0:
        return "0"
    exp = math.ceil(math.log10(rate))
    if 10.0**exp < rate:  # log10's rounding: the bound must hold
        exp += 1
    elif 10.0 ** (exp - 1) >= rate:  # a power of ten is its own bound
        exp -= 1
    return f"< 1e{exp:+03d}"


def round_probs(probs, bits: int = 24) -> torch.Tensor:
    """``probs`` rounded to multiples of ``2**-bits`` that sum to exactly 1 (float64).

    Why: probabilities computed on two CPUs differ in their last bits (SIMD width changes the
    summation order), and an inverse-CDF draw near a boundary then lands in another bin, so a
    printed histogram changes from one machine to the next. Multiples of ``2**-bits`` are
    exact in float64 (and in float32 for ``bits <= 24``): every sum over them is exact in any
    order, so every machine samples exactly the same distribution from the same random
    numbers. Each row's rounding remainder goes to its largest entry. Compute ``probs`` in
    float64 first, so that rounding itself does not fall on a boundary.
    """
    t = torch.as_tensor(probs).double()
    if t.numel() == 0 or torch.isnan(t).any() or (t < 0).any():
        raise ValueError("probs must be a non-empty tensor of non-negative probabilities")
    if not 1 <= bits <= 48:
        raise ValueError(f"bits must lie in 1 .. 48; got {bits}")
    scale = 2.0**bits
    r = (t * scale).round_().div_(scale)  # one new tensor: tables of 60,000+ rows pass here
    rest = 1.0 - r.sum(dim=-1, keepdim=True)  # exact: every term is a multiple of 2**-bits
    r.scatter_add_(-1, r.argmax(dim=-1, keepdim=True), rest)
    if (r < 0).any():
        raise ValueError("probs must sum to 1 along the last axis before rounding")
    return r


def counts(samples, num_classes: int) -> np.ndarray:
    """Histogram of integer samples in ``[0, num_classes)`` as an int64 numpy array."""
    s = torch.as_tensor(samples).flatten().to(torch.int64)
    if s.numel() and (s.min() < 0 or s.max() >= num_classes):
        raise ValueError(f"samples must lie in [0, {num_classes}); got min {s.min()} max {s.max()}")
    return torch.bincount(s, minlength=num_classes).numpy()


def frequencies(samples, num_classes: int) -> np.ndarray:
    """Empirical distribution of integer samples (counts divided by their number)."""
    c = counts(samples, num_classes)
    return c / max(1, c.sum())


def chi_square_test(observed, expected_probs, *, min_expected: float = 5.0) -> ChiSquareResult:
    """Pearson's chi-square test of observed counts against exact probabilities.

    ``observed``: counts per outcome (any shape, flattened); ``expected_probs``: the exact
    probabilities of the same outcomes (summing to 1). Outcomes with probability 0 must never
    be observed: one such observation fails the test outright (statistic ``inf``).
    """
    obs = np.asarray(torch.as_tensor(observed).double().flatten().numpy(), dtype=np.float64)
    probs = np.asarray(torch.as_tensor(expected_probs).double().flatten().numpy(), dtype=np.float64)
    if obs.shape != probs.shape:
        raise ValueError(f"observed has {obs.size} bins but expected_probs has {probs.size}")
    if np.any(probs < 0) or not np.all(np.isfinite(probs)) or abs(probs.sum() - 1) > 1e-6:
        raise ValueError("expected_probs must be finite, >= 0 and sum to 1")
    if np.any(obs < 0):
        raise ValueError("observed counts must be >= 0")
    n = int(obs.sum())
    if n == 0:
        raise ValueError("observed holds no samples")
    impossible = (probs == 0) & (obs > 0)
    if impossible.any():
        return ChiSquareResult(math.inf, 0, 0.0, 0.0, 0.0, False, n, int(probs.size))
    exp = probs * n
    keep = probs > 0
    obs, exp = obs[keep], exp[keep]
    order = np.argsort(exp, kind="stable")
    groups_o, groups_e = [], []
    acc_o = acc_e = 0.0
    for i in order:
        acc_o += obs[i]
        acc_e += exp[i]
        if acc_e >= min_expected:
            groups_o.append(acc_o)
            groups_e.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0:  # leftover small mass joins the last (largest so far) group
        if groups_e:
            groups_o[-1] += acc_o
            groups_e[-1] += acc_e
        else:
            groups_o.append(acc_o)
            groups_e.append(acc_e)
    go, ge = np.array(groups_o), np.array(groups_e)
    df = len(ge) - 1
    if df == 0:
        return ChiSquareResult(0.0, 0, 0.0, 1.0, 0.0, True, n, 1)
    stat = float(((go - ge) ** 2 / ge).sum())
    thr = chi_square_threshold(df)
    return ChiSquareResult(
        statistic=stat,
        df=df,
        threshold=thr,
        p_value=float(_sps.chi2.sf(stat, df)),
        false_failure_rate=float(_sps.chi2.sf(thr, df)),
        passed=stat <= thr,
        n=n,
        bins=len(ge),
    )
