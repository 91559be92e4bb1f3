"""Checks of exercise 08: dynamic draft length, the rules lesson 08 measures, written by hand.

Students implement, in ``exercises/ex08_dynamic_k.ipynb``, the three k rules of lesson 08
as plain functions of what the loop has seen (lesson 08 drives the package's objects,
:mod:`specdec_course.decoding.dynamic`; here the rules themselves are the work):

- ``next_k(k, drafted, accepted, k_max) -> int``: Hugging Face's heuristic schedule, the
  ``k`` to ask for after an iteration that drafted ``drafted`` tokens and accepted
  ``accepted`` of them (grow by 2 after a fully accepted proposal, shrink by 1 otherwise,
  within ``1 .. k_max``; an iteration that drafted nothing says nothing);
- ``alpha_estimate(outcomes, prior_alpha, prior_weight) -> float``: the acceptance rate
  estimated from ``(drafted, accepted)`` pairs, counting only the drafts the verifier
  looked at (it stops at the first rejection), pulled towards ``prior_alpha`` with the
  weight of ``prior_weight`` looked-at drafts;
- ``controller_k(outcomes, c, k_max) -> int``: the draft length lesson 02's Theorem 3.8
  prefers at the estimated rate (prior 0.5 with weight 2), never 0;
- ``confidence_stop(top_probs, p_min) -> int``: how many of the drafted tokens a proposal
  keeps when it stops at the first draft whose top probability is below ``p_min`` (that
  draft is kept, the ones after it are not drafted).

The references are the package's: ``HeuristicK`` and ``ControllerK`` driven through the same
outcomes (``ControllerK`` reads its ``k`` from a table of alpha rounded to 1/100; the exact
rule here is ``max(1, theory.optimal_gamma(alpha, c, k_max))``, graded only where both agree
for every alpha within 1e-6 of the estimate), and the confidence-stop rule of
``ModelProposer(p_min=...)``. Every check is exact (no sampling).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from specdec_course import theory
from specdec_course.decoding.dynamic import ControllerK, HeuristicK

from ._support import as_number, first_wrong, fmt
from .context import case_seed, fresh_cases
from .core import Case, call, register

# Not in the sandbox while ex08 is graded (judge.withheld): the package's schedule
# and controller, whose methods are the exercise's functions.
PUBLIC_IMPLEMENTATIONS = (
    "specdec_course.decoding.dynamic.HeuristicK.start",
    "specdec_course.decoding.dynamic.HeuristicK.next_k",
    "specdec_course.decoding.dynamic.HeuristicK.update",
    "specdec_course.decoding.dynamic.ControllerK.start",
    "specdec_course.decoding.dynamic.ControllerK.alpha",
    "specdec_course.decoding.dynamic.ControllerK.next_k",
    "specdec_course.decoding.dynamic.ControllerK.update",
)
ALLOWED = {
    "specdec_course.theory.optimal_gamma": "lesson 04's optimum, which controller_k is meant "
    "to call on its own estimate of alpha",
}

__all__ = ["reference_alpha", "reference_controller_k", "reference_next_k", "reference_stop"]


# --------------------------------------------------------------------------- references


def reference_next_k(k: int, drafted: int, accepted: int, k_max: int) -> int:
    """Hugging Face's schedule after one iteration, through the package's ``HeuristicK``."""
    h = HeuristicK(initial=k)
    h.start(k_max)
    h.update(drafted, accepted)
    return h.next_k()


def reference_alpha(
    outcomes: Sequence[tuple[int, int]], prior_alpha: float = 0.5, prior_weight: float = 2.0
) -> float:
    """``ControllerK``'s running estimate after these outcomes (no decay)."""
    ctl = ControllerK(0.0, prior_alpha=prior_alpha, prior_weight=prior_weight)
    ctl.start(1)
    for d, a in outcomes:
        ctl.update(d, a)
    return ctl.alpha


def reference_controller_k(outcomes: Sequence[tuple[int, int]], c: float, k_max: int) -> int:
    """``max(1, optimal_gamma(alpha_hat, c, k_max))`` at the exact estimate."""
    return max(1, theory.optimal_gamma(min(1.0, reference_alpha(outcomes)), c, k_max))


def reference_stop(top_probs: Sequence[float], p_min: float) -> int:
    """The drafts a confidence-stopped proposal keeps: up to and including the first unsure one."""
    for i, t in enumerate(top_probs):
        if t < p_min:
            return i + 1
    return len(top_probs)


def _int_case(name: str, raw, exp: int, diagnose) -> Case:
    got = as_number(raw)
    if got is None or not float(got).is_integer():
        return Case(name, False, str(exp), fmt(raw), "return a whole number (a Python int)")
    ok = int(got) == exp
    return Case(name, ok, str(exp), str(int(got)), "" if ok else diagnose(int(got)))


def _outcomes_text(outcomes) -> str:
    shown = ", ".join(f"({d}, {a})" for d, a in outcomes[:4])
    more = f", ... ({len(outcomes)} iterations)" if len(outcomes) > 4 else ""
    return f"[{shown}{more}]"


def _random_outcomes(seed: int, n: int, longest: int = 30) -> list[list[tuple[int, int]]]:
    """``n`` random outcome lists: drafts 0..8 per iteration, accepted 0..drafted."""
    g = torch.Generator().manual_seed(case_seed(seed))
    out = []
    for _ in range(n):
        m = int(torch.randint(0, longest + 1, (), generator=g))
        d = torch.randint(0, 9, (m,), generator=g).tolist()
        out.append([(x, int(torch.randint(0, x + 1, (), generator=g))) for x in d])
    return out


# --------------------------------------------------------------------------- next_k


def _diagnose_next_k(k, drafted, accepted, k_max, got) -> str:
    if drafted == 0 and got != k:
        return "an iteration that drafted nothing says nothing about the draft: keep k"
    if accepted == drafted and got == k - 1:
        return "every draft was accepted here (even if fewer than k were drafted): grow k"
    if accepted < drafted and got == k + 2:
        return "a draft was rejected here: shrink k"
    if got > k_max:
        return f"k may not grow past k_max = {k_max}"
    if got < 1:
        return "k may not shrink below 1: with no drafts there is nothing left to measure"
    return "not the heuristic's next k for this outcome"


@register(
    "ex08.next_k",
    points=2,
    needs="next_k",
    title="Hugging Face's heuristic: the next k after one iteration",
    hint="two outcomes matter: were all the drafted tokens accepted, or not? Then mind the "
    "two walls (lesson 08, section 1) and the iteration that drafted nothing",
)
def check_next_k(fn) -> Iterator[Case]:
    groups = [
        ("full acceptance grows k", [(3, 3, 3, 8), (1, 1, 1, 8), (5, 5, 5, 8)]),
        ("a rejection shrinks k", [(5, 5, 2, 8), (4, 4, 0, 8), (2, 2, 1, 8)]),
        ("k stays within 1 .. k_max", [(7, 7, 7, 8), (8, 8, 8, 8), (1, 1, 0, 8), (1, 1, 0, 1)]),
        ("fewer drafted than asked, all accepted", [(6, 3, 3, 8), (5, 1, 1, 6)]),
        ("nothing drafted: no change", [(4, 0, 0, 8), (1, 0, 0, 3)]),
    ]
    if fresh_cases():
        g = torch.Generator().manual_seed(case_seed(1))
        rand = []
        for _ in range(40):
            k_max = int(torch.randint(1, 17, (), generator=g))
            k = int(torch.randint(1, k_max + 1, (), generator=g))
            d = int(torch.randint(0, k + 1, (), generator=g))
            rand.append((k, d, int(torch.randint(0, d + 1, (), generator=g)), k_max))
        groups.append(("40 random iterations", rand))
    for name, args in groups:
        yield first_wrong(name, (_next_k_case(fn, name, *x) for x in args))


def _next_k_case(fn, name: str, k: int, d: int, a: int, km: int) -> Case:
    label = f"{name}: next_k({k}, {d}, {a}, {km})"
    got = call(label, fn, k, d, a, km)
    return _int_case(
        label, got, reference_next_k(k, d, a, km), lambda x: _diagnose_next_k(k, d, a, km, x)
    )


# --------------------------------------------------------------------------- alpha_estimate


def _close(got: float, exp: float) -> bool:
    return abs(got - exp) <= 1e-9 * max(1.0, abs(exp))


def _diagnose_alpha(outcomes, pa, pw, got: float) -> str:
    acc = sum(a for _, a in outcomes)
    drafted = sum(d for d, _ in outcomes)
    rej = sum(a < d for d, a in outcomes)
    if got != got:
        return "NaN: with no evidence yet the estimate is the prior, not 0/0"
    if _close(got, (acc + pw * pa) / (drafted + pw)):
        return (
            "you counted every drafted token as tested: the verifier stops at the first "
            "rejection, so the drafts after it were never looked at"
        )
    if _close(got, (acc + pw * pa) / (acc + pw)):
        return "the rejections are missing from the count of drafts looked at"
    if acc + rej and _close(got, acc / (acc + rej)):
        return "the prior is missing: it weighs as prior_weight drafts at rate prior_alpha"
    return "not the estimate for these outcomes"


@register(
    "ex08.alpha_estimate",
    points=4,
    needs="alpha_estimate",
    title="the acceptance rate estimated from the drafts the verifier looked at",
    hint="an iteration that accepted a of d drafts tested how many drafts, with how many "
    "successes? (If a < d, which draft was the last one looked at?) The prior behaves "
    "like prior_weight extra drafts accepted at rate prior_alpha",
)
def check_alpha_estimate(fn) -> Iterator[Case]:
    groups = [
        ("no evidence: the prior", [([], 0.5, 2.0), ([(0, 0)], 0.8, 1.0)]),
        ("full acceptances only", [([(4, 4)], 0.5, 2.0), ([(3, 3), (5, 5)], 0.2, 1.0)]),
        (
            "a rejection ends what was looked at",
            [([(8, 2)], 0.5, 2.0), ([(5, 0), (5, 5), (6, 3)], 0.5, 2.0)],
        ),
        ("a stronger or weaker prior", [([(6, 1), (6, 6)], 0.9, 20.0), ([(6, 1)], 0.5, 0.01)]),
        ("lesson 08's figures", [([(8, 5)] * 30 + [(8, 8)] * 10, 0.5, 2.0)]),
    ]
    if fresh_cases():
        groups.append(("30 random histories", [(o, 0.5, 2.0) for o in _random_outcomes(2, 30)]))
    for name, triples in groups:
        yield first_wrong(name, (_alpha_case(fn, name, *x) for x in triples))


def _alpha_case(fn, name: str, outcomes, pa: float, pw: float) -> Case:
    label = f"{name}: alpha_estimate({_outcomes_text(outcomes)}, {pa:g}, {pw:g})"
    exp = reference_alpha(outcomes, pa, pw)
    raw = call(label, fn, [tuple(o) for o in outcomes], pa, pw)
    got = as_number(raw)
    if got is None:
        return Case(label, False, f"{exp:.6g}", fmt(raw), "return a float")
    ok = _close(got, exp)
    msg = "" if ok else _diagnose_alpha(outcomes, pa, pw, got)
    return Case(label, ok, f"{exp:.6g}", f"{got:.6g}", msg)


# --------------------------------------------------------------------------- controller_k


def _stable(outcomes, c: float, k_max: int) -> bool:
    # Grade only estimates whose best k is the same for every alpha within 1e-6: a correct
    # estimate summed in another order cannot land on the other side of a boundary.
    a = min(1.0, reference_alpha(outcomes))
    ks = {
        max(1, theory.optimal_gamma(min(1.0, max(0.0, x)), c, k_max))
        for x in (a - 1e-6, a, a + 1e-6)
    }
    return len(ks) == 1


@register(
    "ex08.controller_k",
    points=2,
    needs="controller_k",
    title="the controller: Theorem 3.8's best k at the estimated rate, never 0",
    hint="your alpha_estimate (with lesson 08's prior: 0.5, weight 2) gives the rate; lesson "
    "02 says which k is best at that rate and cost. What happens to the estimate if the "
    "controller ever answers 0?",
)
def check_controller_k(fn) -> Iterator[Case]:
    groups = [
        ("a good draft, a cheap draft: long proposals", [([(8, 8)] * 20, 0.05, 8)]),
        ("lesson 04's pair", [([(4, 3), (4, 4), (4, 1)] * 10, 0.3, 8)]),
        ("a draft as slow as its rate: still 1, never 0", [([(4, 0)] * 10, 0.5, 8), ([], 0.9, 8)]),
        ("k_max caps the answer", [([(6, 6)] * 50, 0.01, 3)]),
    ]
    if fresh_cases():
        g = torch.Generator().manual_seed(case_seed(3))
        rand = []
        for o in _random_outcomes(4, 40):
            c = round(float(torch.rand((), generator=g)) * 0.5, 4)
            rand.append((o, c, int(torch.randint(1, 13, (), generator=g))))
        groups.append(("random histories and costs", rand))
    for name, triples in groups:
        stable = (t for t in triples if _stable(*t))
        yield first_wrong(name, (_controller_case(fn, name, *t) for t in stable))


def _controller_case(fn, name: str, outcomes, c: float, k_max: int) -> Case:
    label = f"{name}: controller_k({_outcomes_text(outcomes)}, {c:g}, {k_max})"
    got = call(label, fn, [tuple(o) for o in outcomes], c, k_max)

    def diagnose(x):
        free = theory.optimal_gamma(min(1.0, reference_alpha(outcomes)), c, k_max)
        if x == 0 and free == 0:
            return "0 switches speculation off for good: the rate could never be measured again"
        if x > k_max:
            return f"at most k_max = {k_max}"
        return "not the best k at the estimated rate (is your alpha_estimate check passing?)"

    return _int_case(label, got, reference_controller_k(outcomes, c, k_max), diagnose)


# --------------------------------------------------------------------------- confidence_stop


def _diagnose_stop(top, p_min, got) -> str:
    exp = reference_stop(top, p_min)
    if got == exp - 1 and exp <= len(top):
        return (
            "the unsure draft was already drafted (its q is known, so it can be verified "
            "exactly): keep it, and stop after it"
        )
    if got == len(top) and exp < len(top):
        return "a draft below p_min should end the proposal"
    return "not the number of drafts a confidence-stopped proposal keeps"


@register(
    "ex08.confidence_stop",
    points=2,
    needs="confidence_stop",
    title="the confidence stop: how many drafts a proposal keeps",
    hint="walk the drafts in order; the first one the draft itself is unsure of (top "
    "probability below p_min) has been sampled already. Is it kept? And the ones after it?",
)
def check_confidence_stop(fn) -> Iterator[Case]:
    groups = [
        ("every draft confident: all kept", [([0.9, 0.8, 0.95], 0.4), ([], 0.4)]),
        ("an unsure draft ends the proposal", [([0.9, 0.3, 0.95, 0.99], 0.4), ([0.1], 0.4)]),
        ("the first draft unsure", [([0.2, 0.9, 0.9], 0.4)]),
        ("exactly p_min is confident", [([0.4, 0.4, 0.39], 0.4)]),
    ]
    if fresh_cases():
        g = torch.Generator().manual_seed(case_seed(5))
        rand = []
        for _ in range(30):
            m = int(torch.randint(0, 9, (), generator=g))
            rand.append(([round(x, 4) for x in torch.rand(m, generator=g).tolist()], 0.4))
        groups.append(("30 random proposals", rand))
    for name, pairs in groups:
        yield first_wrong(name, (_stop_case(fn, name, *x) for x in pairs))


def _stop_case(fn, name: str, top, p_min: float) -> Case:
    label = f"{name}: confidence_stop({list(top)}, {p_min:g})"
    got = call(label, fn, list(top), p_min)
    return _int_case(
        label, got, reference_stop(top, p_min), lambda x: _diagnose_stop(top, p_min, x)
    )
