"""Checks of exercise 02: expected tokens per verify call, speedup, and the best gamma.

Students implement, in ``exercises/ex02_acceptance.ipynb``:

- ``expected_tokens(alpha, gamma)``: ``(1 - alpha**(gamma + 1)) / (1 - alpha)``, ``gamma + 1``
  at ``alpha == 1``;
- ``speedup(alpha, gamma, c)``: ``expected_tokens(alpha, gamma) / (gamma * c + 1)``;
- ``optimal_gamma(alpha, c, max_gamma=64)``: the gamma in ``0..max_gamma`` with the largest
  speedup, 0 when speculation does not pay.

References: :mod:`specdec_course.theory` (Leviathan et al. 2023, Equation 1, Theorem 3.8).
All checks are exact (no sampling), to 1e-9 relative.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from specdec_course import theory

from ._support import as_number, fmt
from .context import case_seed, fresh_cases
from .core import Case, call, register

ALPHAS = [0.0, 0.1, 0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99, 1.0]
GAMMAS = [0, 1, 2, 3, 4, 5, 7, 8, 16]
COSTS = [0.0, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0]


def _random_inputs(seed: int, n: int) -> list[tuple[float, int, float]]:
    """``n`` random ``(alpha, gamma, c)``: alpha in [0, 1), gamma in 0..16, c in [0, 1)."""
    g = torch.Generator().manual_seed(case_seed(seed))
    a = torch.rand(n, generator=g, dtype=torch.float64).tolist()
    k = torch.randint(0, 17, (n,), generator=g).tolist()
    c = torch.rand(n, generator=g, dtype=torch.float64).tolist()
    return [(round(x, 6), int(y), round(z, 6)) for x, y, z in zip(a, k, c)]


def _close(got: float, exp: float) -> bool:
    return math.isfinite(got) and abs(got - exp) <= 1e-9 * max(1.0, abs(exp))


def _number_case(name: str, raw, exp: float, diagnose) -> Case:
    got = as_number(raw)
    if got is None:
        return Case(name, False, f"{exp:.6g}", fmt(raw), "return a number (a Python float)")
    ok = _close(got, exp)
    return Case(name, ok, f"{exp:.6g}", f"{got:.6g}", "" if ok else diagnose(got))


# --------------------------------------------------------------------------- expected tokens


def _diagnose_tokens(alpha: float, gamma: int, got: float) -> str:
    if math.isnan(got) or math.isinf(got):
        return (
            "NaN or inf: at alpha = 1 the formula is 0/0; every draft is accepted, return gamma + 1"
        )
    off_by_one = (
        (gamma >= 1 and _close(got, theory.expected_tokens(alpha, gamma - 1)))
        or _close(got, theory.expected_tokens(alpha, gamma + 1))
        or _close(got, theory.expected_tokens(alpha, gamma) - 1)
    )
    if off_by_one:
        return (
            "off by one: a verify call yields the accepted drafts plus one token from the "
            "target (resampled or bonus), so expected_tokens(alpha, 0) = 1 and the sum "
            "1 + alpha + ... + alpha**gamma is (1 - alpha**(gamma + 1)) / (1 - alpha)"
        )
    return "expected tokens = 1 + alpha + ... + alpha**gamma = (1 - alpha**(gamma+1)) / (1 - alpha)"


@register(
    "ex02.expected_tokens",
    points=3,
    needs="expected_tokens",
    title="expected tokens per verify call",
    hint="(1 - alpha**(gamma + 1)) / (1 - alpha), and gamma + 1 when alpha == 1",
)
def check_expected_tokens(fn) -> Iterator[Case]:
    groups = [
        ("gamma = 0 gives 1 token", [(a, 0) for a in (0.0, 0.5, 0.9)]),
        ("alpha = 0 gives 1 token", [(0.0, g) for g in (1, 4)]),
        ("alpha = 1 gives gamma + 1 tokens", [(1.0, g) for g in (1, 4, 8)]),
        ("alpha = 0.75: gamma = 3 and 7", [(0.75, 3), (0.75, 7)]),
        (
            f"{len(ALPHAS) * len(GAMMAS)} (alpha, gamma) pairs",
            [(a, g) for a in ALPHAS for g in GAMMAS],
        ),
    ]
    if fresh_cases():  # the batch grader's: drawn for this run
        groups.append(("100 random (alpha, gamma) pairs", [x[:2] for x in _random_inputs(1, 100)]))
    for name, pairs in groups:
        yield _first_failure(
            name,
            pairs,
            lambda a, g, nm=name: (
                f"{nm}, expected_tokens({a}, {g})",
                call(f"expected_tokens({a}, {g})", fn, a, g),
                theory.expected_tokens(a, g),
                lambda got, a=a, g=g: _diagnose_tokens(a, g, got),
            ),
        )


def _first_failure(name: str, args: list[tuple], run) -> Case:
    """One case for a group of inputs: passed, or the first input that went wrong."""
    for a in args:
        label, raw, exp, diagnose = run(*a)
        case = _number_case(label, raw, exp, diagnose)
        if not case.passed:
            return case
    return Case(name, True)


# --------------------------------------------------------------------------- speedup


def _diagnose_speedup(alpha: float, gamma: int, c: float, got: float) -> str:
    e = theory.expected_tokens(alpha, gamma)
    if gamma * c > 0 and _close(got, e / (gamma * c)):
        return "the cost of an iteration is gamma draft calls plus one target call: gamma * c + 1"
    if _close(got, e / (gamma + 1) / max(c, 1e-300)) or _close(got, e * (gamma * c + 1)):
        return "speedup = expected_tokens(alpha, gamma) / (gamma * c + 1)"
    return (
        "speedup = expected_tokens(alpha, gamma) / (gamma * c + 1); if your expected_tokens "
        "check fails, fix that first"
    )


@register(
    "ex02.speedup",
    points=3,
    needs="speedup",
    title="speedup with draft cost c (Theorem 3.8)",
    hint="expected_tokens(alpha, gamma) / (gamma * c + 1)",
)
def check_speedup(fn) -> Iterator[Case]:
    groups = [
        (
            "gamma = 0 is plain decoding (speedup 1)",
            [(a, 0, c) for a in (0.3, 0.9) for c in (0.0, 0.5)],
        ),
        ("c = 0 (free drafts): speedup = expected tokens", [(0.8, g, 0.0) for g in (1, 4)]),
        ("c = 1 (drafts as slow as the target) never helps", [(0.9, g, 1.0) for g in (1, 3)]),
        ("alpha = 1", [(1.0, g, c) for g in (1, 5) for c in (0.05, 0.5)]),
        (
            f"{len(ALPHAS) * len(GAMMAS) * len(COSTS)} (alpha, gamma, c) triples",
            [(a, g, c) for a in ALPHAS for g in GAMMAS for c in COSTS],
        ),
    ]
    if fresh_cases():
        groups.append(("100 random (alpha, gamma, c) triples", _random_inputs(2, 100)))
    for name, triples in groups:
        yield _first_failure(
            name,
            triples,
            lambda a, g, c: (
                f"speedup({a}, {g}, {c})",
                call(f"speedup({a}, {g}, {c})", fn, a, g, c),
                theory.speedup(a, g, c),
                lambda got, a=a, g=g, c=c: _diagnose_speedup(a, g, c, got),
            ),
        )


# --------------------------------------------------------------------------- best gamma


def _unambiguous(alpha: float, c: float, max_gamma: int) -> bool:
    # Only grade inputs whose best gamma beats the runner-up clearly, so a correct search with
    # a different tie rule or summation order cannot fail.
    s = sorted((theory.speedup(alpha, g, c) for g in range(max_gamma + 1)), reverse=True)
    return s[0] - s[1] > 1e-9 * s[0]


def _gamma_cases() -> list[tuple[str, list[tuple[float, float, int]]]]:
    grid = [
        (a, c, 64)
        for a in (0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
        for c in (0.01, 0.02, 0.05, 0.1, 0.2, 0.4)
        if a > c and _unambiguous(a, c, 64)
    ]
    cases = [
        ("alpha <= c: do not speculate (0)", [(0.25, 0.3, 64), (0.2, 0.5, 64), (0.0, 0.1, 64)]),
        ("drafts as slow as the target (c = 1): 0", [(0.95, 1.0, 64)]),
        ("the best gamma can be max_gamma itself", [(0.99, 0.001, 8), (0.95, 0.01, 5)]),
        ("a small max_gamma is respected", [(0.9, 0.01, 3), (0.8, 0.02, 1)]),
        (f"{len(grid)} (alpha, c) pairs", grid),
    ]
    if fresh_cases():
        picked = []
        for a, m, c in _random_inputs(3, 80):
            # c below alpha (where speculation may pay), max_gamma 1..16, a clear best gamma.
            c, m = round(c * a, 6), max(1, m)
            if _unambiguous(a, c, m) and len(picked) < 40:
                picked.append((a, c, m))
        cases.append((f"{len(picked)} random (alpha, c, max_gamma)", picked))
    return cases


def _diagnose_gamma(alpha: float, c: float, max_gamma: int, got: float) -> str:
    exp = theory.optimal_gamma(alpha, c, max_gamma)
    if not float(got).is_integer():
        return "return gamma (a whole number), not the speedup it reaches"
    got = int(got)
    if exp == 0 and got >= 1:
        return (
            "when no gamma >= 1 beats plain decoding (speedup 1, e.g. alpha <= c), "
            "return 0: do not speculate"
        )
    if exp == max_gamma and got == max_gamma - 1:
        return "search gamma = 0, 1, ..., max_gamma inclusive: range(max_gamma + 1)"
    if got > max_gamma:
        return f"gamma must not exceed max_gamma = {max_gamma}"
    return "return the gamma with the largest speedup(alpha, gamma, c), the smallest on ties"


@register(
    "ex02.optimal_gamma",
    points=4,
    needs="optimal_gamma",
    title="the best gamma for alpha and c",
    hint="max(range(max_gamma + 1), key=lambda g: speedup(alpha, g, c)) picks the smallest best",
)
def check_optimal_gamma(fn) -> Iterator[Case]:
    for name, triples in _gamma_cases():
        yield _first_failure(
            name,
            triples,
            lambda a, c, m: (
                f"optimal_gamma({a}, {c}, max_gamma={m})",
                call(f"optimal_gamma({a}, {c}, max_gamma={m})", fn, a, c, max_gamma=m),
                float(theory.optimal_gamma(a, c, m)),
                lambda got, a=a, c=c, m=m: _diagnose_gamma(a, c, m, got),
            ),
        )
