"""Checks of exercise 02: acceptance that fades along the draft, and a target call that is not free.

Lesson 02 assumes one acceptance rate alpha for every draft and a target call that costs one
plain decoding step whatever it scores (Theorem 3.8). Lesson 04 measures both assumptions
failing on a CPU. Students implement, in ``exercises/ex02_acceptance.ipynb``, the formulas
without them:

- ``expected_tokens(alphas)``: ``alphas[i]`` is the probability that draft ``i + 1`` is
  accepted given that drafts ``1 .. i`` were; one verify call yields ``A + 1`` tokens (``A``
  accepted drafts, then the target's own), so ``E = 1 + sum_i prod_{j <= i} alphas[j]``;
- ``speedup(alphas, c, target_cost)``: ``gamma = len(alphas)`` draft calls of cost ``c`` and
  one target call over ``gamma + 1`` tokens, which costs ``target_cost(gamma + 1)`` plain
  steps: ``E / (gamma * c + target_cost(gamma + 1))`` (lesson 04's cost-aware prediction);
- ``optimal_gamma(alphas, c, target_cost)``: the ``gamma`` in ``0 .. len(alphas)`` with the
  largest ``speedup(alphas[:gamma], c, target_cost)``, the smallest on ties.

With equal rates and ``target_cost == 1`` these are :mod:`specdec_course.theory`'s
``expected_tokens``, ``speedup`` and ``optimal_gamma`` (Leviathan et al. 2023, Equation 1 and
Theorem 3.8), and the checks include those cases against the package. ``target_cost`` is the
judge's own callable (:class:`TargetCost`); under the batch grader the student's code calls
it through the channel. All checks are exact (no sampling), to 1e-9 relative.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from specdec_course import theory

from ._support import as_number, first_wrong, fmt
from .context import case_seed, fresh_cases
from .core import Case, call, register

# Not withheld: the package's closed forms take one alpha, the exercise's functions a list
# of per-position alphas (the checks' cases differ by position), and the solution compares
# with them.
# k="auto"'s rule (decoding.auto_k) evaluates ex02's per-position expected tokens and the
# rate it divides by a call's cost: withheld while ex02 is graded.
PUBLIC_IMPLEMENTATIONS: tuple[str, ...] = (
    "specdec_course.decoding.auto_k.expected_tokens_by_depth",
    "specdec_course.decoding.auto_k.AutoK.rates",
)
ALLOWED = {
    "specdec_course.theory.expected_tokens": "one alpha for every position; used to diagnose",
    "specdec_course.theory.speedup": "one alpha for every position",
    "specdec_course.theory.optimal_gamma": "one alpha for every position",
}

__all__ = ["LESSON04_COST", "TargetCost", "reference_expected_tokens", "reference_speedup"]


class TargetCost:
    """What one target call over ``n`` tokens costs, in plain decoding steps (1-token calls).

    A table of measured sizes and costs, linearly interpolated (and flat past its ends), as
    lesson 04's ``bench.forward_costs`` measures it; ``TargetCost.free()`` is Theorem 3.8's
    assumption, every call costing one step. Calling it with anything but a whole number of
    tokens >= 1 raises ``ValueError``.
    """

    def __init__(self, label: str, sizes: Sequence[float], costs: Sequence[float]):
        self.label = label
        self.sizes = [float(s) for s in sizes]
        self.costs = [float(c) for c in costs]

    @classmethod
    def free(cls) -> TargetCost:
        return cls("free extra tokens (every call costs 1)", [1.0], [1.0])

    @classmethod
    def linear(cls, slope: float) -> TargetCost:
        return cls(f"1 + {slope:g} (n - 1)", [1.0, 65.0], [1.0, 1.0 + 64.0 * slope])

    def __call__(self, n) -> float:
        x = as_number(n)
        if x is None or not x.is_integer() or x < 1:
            raise ValueError(
                f"target_cost(n) takes the number of tokens one target call scores, a whole "
                f"number >= 1; got {n!r}"
            )
        return float(np.interp(x, self.sizes, self.costs))

    def __repr__(self) -> str:
        return f"target_cost: {self.label}"


# Lesson 04's measured cost of a cached target call over n tokens (data/results, rounded).
LESSON04_COST = TargetCost(
    "lesson 04's measured costs",
    [1, 2, 4, 8, 16],
    [1.0, 1.171, 1.273, 1.396, 1.695],
)
# The switch from matrix-vector to matrix-matrix products makes a call over 4 or more tokens
# dearer at once (lesson 04, section 5): a step that a search stopping at the first fall misses.
STEP_COST = TargetCost("1 up to 3 tokens, then 1.5", [1, 3, 4, 65], [1.0, 1.0, 1.5, 1.5])


def reference_expected_tokens(alphas: Sequence[float]) -> float:
    """``1 + sum_i prod_{j <= i} alphas[j]``: the accepted prefix plus the target's token."""
    total, reach = 1.0, 1.0
    for a in alphas:
        reach *= a  # the chance that every draft up to this one is accepted
        total += reach
    return total


def reference_speedup(alphas: Sequence[float], c: float, target_cost) -> float:
    """Tokens per iteration over its cost in plain steps: ``gamma`` drafts, one scoring call."""
    g = len(alphas)
    return reference_expected_tokens(alphas) / (g * c + target_cost(g + 1))


def _reference_gamma(alphas, c, target_cost) -> int:
    s = [reference_speedup(alphas[:g], c, target_cost) for g in range(len(alphas) + 1)]
    return max(range(len(s)), key=lambda g: (s[g], -g))


def _close(got: float, exp: float) -> bool:
    return math.isfinite(got) and abs(got - exp) <= 1e-9 * max(1.0, abs(exp))


def _number_case(name: str, raw, exp: float, diagnose) -> Case:
    got = as_number(raw)
    if got is None:
        return Case(name, False, f"{exp:.6g}", fmt(raw), "return a number (a Python float)")
    ok = _close(got, exp)
    return Case(name, ok, f"{exp:.6g}", f"{got:.6g}", "" if ok else diagnose(got))


def _first_failure(name: str, inputs: list[tuple], run) -> Case:
    """One case for a group of inputs: passed, or the first input that went wrong."""
    return first_wrong(name, (_number_case(*run(*args)) for args in inputs))


def _rates(x: Sequence[float]) -> str:
    return "[" + ", ".join(f"{a:g}" for a in x) + "]"


def _random_rates(seed: int, n: int, longest: int = 12) -> list[list[float]]:
    """``n`` random rate lists of length 0..longest, each rate in [0, 1), rounded."""
    g = torch.Generator().manual_seed(case_seed(seed))
    out = []
    for _ in range(n):
        k = int(torch.randint(0, longest + 1, (), generator=g))
        out.append([round(x, 6) for x in torch.rand(k, generator=g, dtype=torch.float64).tolist()])
    return out


ALPHAS = [0.0, 0.1, 0.5, 0.75, 0.9, 0.99, 1.0]
GAMMAS = [0, 1, 2, 3, 5, 8]
FADING = [0.9, 0.8, 0.7, 0.6, 0.5]


# --------------------------------------------------------------------------- expected tokens


def _diagnose_tokens(alphas: list[float], got: float) -> str:
    exp = reference_expected_tokens(alphas)
    if math.isnan(got) or math.isinf(got):
        return "NaN or inf: nothing here needs a division (is a closed form dividing by 1 - 1?)"
    if _close(got, exp - 1):
        return (
            "one token short: a verify call also yields one token of the target's own, "
            "recovered or bonus, after the accepted drafts"
        )
    if alphas and _close(got, 1 + sum(alphas)):
        return (
            "you added the rates: a draft counts only when every draft before it was accepted too"
        )
    if len(alphas) > 1 and _close(got, reference_expected_tokens(alphas[:-1])):
        return "the last draft was left out"
    if len(alphas) > 1 and _close(got, theory.expected_tokens(alphas[0], len(alphas))):
        return "you used the first draft's rate for every draft: the rates differ by position"
    mean = sum(alphas) / len(alphas) if alphas else 0.0
    if len(alphas) > 1 and _close(got, theory.expected_tokens(mean, len(alphas))):
        return "you used the mean rate for every draft: the rates differ by position"
    return "wrong value for these rates"


@register(
    "ex02.expected_tokens",
    points=3,
    needs="expected_tokens",
    title="expected tokens per verify call, acceptance by position",
    hint="a verify call yields the accepted drafts and then one token of the target's own; "
    "ask when draft i is accepted (think of what must have happened before it). With equal "
    "rates your answer must agree with lesson 02's closed form (section 2)",
)
def check_expected_tokens(fn) -> Iterator[Case]:
    groups = [
        ("no drafts: one token", [[]]),
        ("one draft", [[0.3], [0.0], [1.0]]),
        (
            "a draft that is always rejected ends the accepted run",
            [[0.0, 1.0, 1.0], [0.8, 0.0, 1.0]],
        ),
        (
            f"{len(ALPHAS) * len(GAMMAS)} equal-rate lists (lesson 02's closed form)",
            [[a] * g for a in ALPHAS for g in GAMMAS],
        ),
        ("acceptance that fades along the draft", [FADING, FADING[:2], [0.99, 0.5, 0.1]]),
        ("acceptance that rises", [[0.5, 0.9, 0.95], [0.1, 1.0]]),
    ]
    if fresh_cases():  # the batch grader's: drawn for this run
        groups.append(("50 random rate lists", _random_rates(1, 50)))
    for name, lists in groups:
        yield _first_failure(
            name,
            [(x,) for x in lists],
            lambda x, nm=name: (
                f"{nm}: expected_tokens({_rates(x)})",
                call(f"expected_tokens({_rates(x)})", fn, list(x)),
                reference_expected_tokens(x)
                if len(set(x)) != 1
                else theory.expected_tokens(x[0], len(x)),
                lambda got, x=x: _diagnose_tokens(x, got),
            ),
        )


# --------------------------------------------------------------------------- speedup


def _diagnose_speedup(alphas: list[float], c: float, cost: TargetCost, got: float) -> str:
    g = len(alphas)
    e = reference_expected_tokens(alphas)
    if _close(got, e / (g * c + 1)) and cost(g + 1) != 1:
        return (
            "you priced the target call as one plain step, as Theorem 3.8 does: this "
            "target_cost says otherwise (or over the drafts alone, without the pending token)"
        )
    if g and _close(got, e / (g * c + cost(g))):
        return (
            f"you priced the target call over {g} token(s); it scores the pending token "
            f"too, {g + 1} tokens in all"
        )
    if g and c > 0 and _close(got, e / cost(g + 1)):
        return "the draft calls were left out of the cost: each of them costs c"
    if _close(got, e * (g * c + cost(g + 1))):
        return "tokens per iteration times its cost: the speedup divides them"
    return "wrong speedup for these inputs; if your expected_tokens check fails, fix that first"


def _speedup_inputs() -> list[tuple[str, list[tuple[list[float], float, TargetCost]]]]:
    free, lin = TargetCost.free(), TargetCost.linear(0.1)
    groups = [
        (
            "no drafts is plain decoding (speedup 1)",
            [([], c, k) for c in (0.0, 0.5) for k in (free, lin)],
        ),
        (
            "free extra tokens and equal rates: Theorem 3.8",
            [([a] * g, c, free) for a in ALPHAS for g in GAMMAS for c in (0.0, 0.05, 0.3, 1.0)],
        ),
        (
            "a target call whose cost grows with the tokens it scores",
            [
                ([a] * g, c, k)
                for a in (0.5, 0.9)
                for g in (1, 4, 8)
                for c in (0.05, 0.3)
                for k in (lin, TargetCost.linear(0.02))
            ],
        ),  # fmt: skip
        (
            "lesson 04's measured costs, acceptance that fades",
            [(FADING[:g], c, LESSON04_COST) for g in (1, 3, 5) for c in (0.05, 0.287)],
        ),
        ("a cost that jumps at 4 tokens", [([0.9] * g, 0.05, STEP_COST) for g in (2, 3, 4)]),
    ]
    if fresh_cases():
        g = torch.Generator().manual_seed(case_seed(2))
        rand = []
        for x in _random_rates(3, 40):
            c = round(float(torch.rand((), generator=g)), 6)
            rand.append((x, c, TargetCost.linear(round(float(torch.rand((), generator=g)) / 4, 6))))
        groups.append(("40 random (alphas, c, target_cost)", rand))
    return groups


@register(
    "ex02.speedup",
    points=3,
    needs="speedup",
    title="speedup with draft cost c and a target call priced by target_cost",
    hint="measure one iteration in plain decoding steps: what does each draft call cost, how "
    "many tokens does the one target call score, and what does target_cost say that costs? "
    "The speedup is what an iteration yields over what it costs (lesson 04, section 6: the "
    "cost-aware prediction)",
)
def check_speedup(fn) -> Iterator[Case]:
    for name, triples in _speedup_inputs():
        yield _first_failure(
            name,
            triples,
            lambda x, c, k: (
                f"speedup({_rates(x)}, {c:g}, {k.label})",
                call(f"speedup({_rates(x)}, {c:g}, {k.label})", fn, list(x), c, k),
                theory.speedup(x[0], len(x), c)
                if k.label.startswith("free") and len(set(x)) == 1
                else reference_speedup(x, c, k),
                lambda got, x=x, c=c, k=k: _diagnose_speedup(x, c, k, got),
            ),
        )


# --------------------------------------------------------------------------- best gamma


def _unambiguous(alphas, c, cost) -> bool:
    # Only grade inputs whose best gamma beats the runner-up clearly, so a correct search with
    # a different tie rule or summation order cannot fail.
    s = sorted(reference_speedup(alphas[:g], c, cost) for g in range(len(alphas) + 1))
    return len(s) == 1 or s[-1] - s[-2] > 1e-9 * s[-1]


def _gamma_inputs() -> list[tuple[str, list[tuple[list[float], float, TargetCost]]]]:
    free = TargetCost.free()
    grid = [
        ([a] * 64, c, free)
        for a in (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
        for c in (0.01, 0.05, 0.1, 0.4)
        if a > c and _unambiguous([a] * 64, c, free)
    ]
    groups = [
        (
            "alpha <= c: do not speculate (0)",
            [([0.25] * 8, 0.3, free), ([0.2] * 8, 0.5, free), ([0.0] * 4, 0.1, free)],
        ),
        ("no drafts to choose from: 0", [([], 0.05, free)]),
        ("drafts as slow as the target (c = 1): 0", [([0.95] * 8, 1.0, free)]),
        (
            "the best can be the longest draft",
            [([0.99] * 8, 0.001, free), ([0.95] * 5, 0.01, free)],
        ),
        (f"{len(grid)} equal-rate cases with free extra tokens (lesson 02)", grid),
        ("acceptance that fades", [(FADING + [0.4, 0.3], c, free) for c in (0.01, 0.1)]),
        (
            "a target call whose cost grows: shorter drafts",
            [([0.9] * 16, 0.02, TargetCost.linear(s)) for s in (0.05, 0.2)],
        ),
        ("a cost that jumps at 4 tokens", [([0.9] * 12, c, STEP_COST) for c in (0.05, 0.02)]),
        (
            "lesson 04's measured costs",
            [([0.84] * 12, 0.287, LESSON04_COST), (FADING, 0.05, LESSON04_COST)],
        ),
    ]
    groups = [(n, [t for t in ts if _unambiguous(*t)]) for n, ts in groups]
    if fresh_cases():
        g = torch.Generator().manual_seed(case_seed(4))
        picked = []
        for x in _random_rates(5, 80, longest=16):
            # Rates that fade from a random start (as drafts do), a cost below the first rate.
            x = sorted(x, reverse=True)
            c = round(float(torch.rand((), generator=g)) * (x[0] if x else 1.0), 6)
            cost = TargetCost.linear(round(float(torch.rand((), generator=g)) / 4, 6))
            if _unambiguous(x, c, cost) and len(picked) < 40:
                picked.append((x, c, cost))
        groups.append((f"{len(picked)} random (alphas, c, target_cost)", picked))
    return groups


def _diagnose_gamma(alphas, c, cost, got: float) -> str:
    exp = _reference_gamma(alphas, c, cost)
    if not float(got).is_integer():
        return "the answer is a whole number of drafts, not the speedup it reaches"
    got = int(got)
    s = [reference_speedup(alphas[:g], c, cost) for g in range(len(alphas) + 1)]
    if got > len(alphas) or got < 0:
        return f"gamma must lie in 0 .. len(alphas) = 0 .. {len(alphas)}"
    if exp == 0 and got >= 1:
        return (
            "no number of drafts beats plain decoding here (speedup 1 at gamma = 0): the "
            "answer is 0, do not speculate"
        )
    if exp == len(alphas) and got == exp - 1:
        return "the longest draft, gamma = len(alphas), was never tried"
    peak = next((g for g in range(len(s) - 1) if s[g + 1] < s[g]), len(s) - 1)
    if got == peak != exp:
        return (
            f"you stopped at the first gamma where the speedup falls ({peak}); with a cost "
            "that jumps, a longer draft can be better again: try every gamma"
        )
    free = [reference_speedup(alphas[:g], c, TargetCost.free()) for g in range(len(s))]
    if got == max(range(len(s)), key=lambda g: (free[g], -g)) != exp:
        return "you picked the best gamma for free extra tokens: price the target call too"
    return "that gamma does not give the largest speedup (the smallest gamma on ties)"


@register(
    "ex02.optimal_gamma",
    points=4,
    needs="optimal_gamma",
    title="the best number of drafts for per-position rates and measured costs",
    hint="each gamma from 0 to len(alphas) drafts uses the first gamma rates; compare the "
    "speedups of all of them (a cost that jumps can make the curve fall and rise again) "
    "and keep the smallest gamma among the best",
)
def check_optimal_gamma(fn) -> Iterator[Case]:
    for name, triples in _gamma_inputs():
        yield _first_failure(
            name,
            triples,
            lambda x, c, k: (
                f"optimal_gamma({_rates(x[:6])}{'...' if len(x) > 6 else ''} "
                f"({len(x)} rates), {c:g}, {k.label})",
                call(f"optimal_gamma(..., {c:g}, {k.label})", fn, list(x), c, k),
                float(
                    theory.optimal_gamma(x[0], c, len(x))
                    if k.label.startswith("free") and x and len(set(x)) == 1
                    else _reference_gamma(x, c, k)
                ),
                lambda got, x=x, c=c, k=k: _diagnose_gamma(x, c, k, got),
            ),
        )
