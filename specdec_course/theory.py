"""Closed-form results of speculative decoding.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding"
(ICML 2023, arXiv:2211.17192): acceptance rate (Definition 3.1 / Theorem 3.5), expected
tokens per iteration (Equation 1), and the walltime improvement (Theorem 3.8).

Notation: ``alpha`` is the expected probability that one drafted token is accepted, ``gamma``
the number of tokens drafted per iteration, ``c`` the cost of one draft call divided by the
cost of one target call.
"""

from __future__ import annotations

import math

from ._validate import ProbLike, check_pair

__all__ = ["acceptance_rate", "tv_distance", "expected_tokens", "speedup", "optimal_gamma"]


def acceptance_rate(p: ProbLike, q: ProbLike) -> float:
    """Probability that a token drafted from ``q`` is accepted by ``p``: ``sum(min(p, q))``."""
    p, q = (t.double() for t in check_pair(p, q))
    return float(min(1.0, max(0.0, p.minimum(q).sum().item())))


def tv_distance(p: ProbLike, q: ProbLike) -> float:
    """Total variation distance ``0.5 * sum|p - q|``; equals ``1 - acceptance_rate(p, q)``."""
    p, q = (t.double() for t in check_pair(p, q))
    return float(min(1.0, 0.5 * (p - q).abs().sum().item()))


def _check_alpha(alpha: float) -> float:
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"alpha must be a number in [0, 1]; got {alpha!r}") from None
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"alpha must be in [0, 1]; got {alpha!r}")
    return a


def _check_gamma(gamma: int) -> int:
    if isinstance(gamma, bool) or not float(gamma).is_integer() or gamma < 0:
        raise ValueError(f"gamma must be a whole number >= 0 (tokens drafted); got {gamma!r}")
    return int(gamma)


def _check_cost(c: float) -> float:
    try:
        c = float(c)
    except (TypeError, ValueError):
        raise ValueError(f"c must be a number >= 0 (draft cost / target cost); got {c!r}") from None
    if not c >= 0 or math.isinf(c):
        raise ValueError(f"c must be a finite number >= 0 (draft cost / target cost); got {c!r}")
    return c


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens produced by one verify call: ``(1 - alpha**(gamma+1)) / (1 - alpha)``.

    The accepted prefix length is a truncated geometric variable; the rejected (or bonus)
    position always adds one token, so the value lies in ``[1, gamma + 1]`` and is exactly
    ``gamma + 1`` at ``alpha == 1`` (the limit of the formula).
    """
    a, g = _check_alpha(alpha), _check_gamma(gamma)
    if a == 1.0:
        return float(g + 1)
    return (1.0 - a ** (g + 1)) / (1.0 - a)


def speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected walltime improvement of Theorem 3.8: ``E[tokens] / (gamma * c + 1)``.

    One iteration costs ``gamma`` draft calls plus one target call, i.e. ``gamma * c + 1``
    target-call units, and yields ``expected_tokens(alpha, gamma)`` tokens, where plain
    decoding yields one token per target call.
    """
    return expected_tokens(alpha, gamma) / (_check_gamma(gamma) * _check_cost(c) + 1.0)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """The ``gamma`` in ``0..max_gamma`` with the largest ``speedup`` (the smallest on ties).

    Returns 0, "do not speculate", exactly when no gamma >= 1 beats plain decoding, which is
    the case whenever ``alpha <= c``.
    """
    _check_alpha(alpha), _check_cost(c)
    max_gamma = _check_gamma(max_gamma)
    best, best_s = 0, 1.0
    for g in range(1, max_gamma + 1):
        s = speedup(alpha, g, c)
        if s > best_s * (1 + 1e-12):
            best, best_s = g, s
    return best
