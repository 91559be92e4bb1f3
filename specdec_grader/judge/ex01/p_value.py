"""Check ``ex01.chi_square_p_value``: Pearson's p-value against scipy's, exactly."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from scipy import stats as sps

from specdec_course import sampling
from specdec_course.stats import counts as _counts

from .._support import as_number, fmt, seeded
from ..context import case_seed
from ..core import Case, call, register
from ._common import P5, Q5, _t


def _reference_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    keep = probs > 0
    obs = counts[keep].double().numpy()
    exp = (probs[keep] * counts.sum()).double().numpy()
    return float(sps.chisquare(obs, exp).pvalue)


def _p_value_cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    p5 = _t(P5)
    with seeded(case_seed(7)) as g:
        exact = torch.multinomial(p5, 50_000, replacement=True, generator=g)
        naive_law = sampling.speculative_output_distribution(p5, _t(Q5), resample="target")
        naive = torch.multinomial(naive_law, 50_000, replacement=True, generator=g)
    # The two 50,000-sample cases come first: they are what a chi-square check is for
    # (pass exact samples, reject the naive rule's), and their messages say so.
    return [
        (
            "50,000 samples of the naive rule (should fail, p-value tiny)",
            torch.from_numpy(_counts(naive, 5)),
            p5,
        ),
        (
            "50,000 exact samples of p (should pass, p-value > 0.05)",
            torch.from_numpy(_counts(exact, 5)),
            p5,
        ),
        (
            "hand-made counts [52, 23, 16, 6, 3] against the 5-token p",
            torch.tensor([52, 23, 16, 6, 3]),
            p5,
        ),
        ("counts far from p", torch.tensor([30, 40, 10, 15, 5]), p5),
        ("two outcomes", torch.tensor([480, 520]), _t([0.5, 0.5])),
        (
            "an outcome with probability 0, never observed",
            torch.tensor([480, 0, 520]),
            _t([0.5, 0.0, 0.5]),
        ),
    ]


def _diagnose_p_value(counts, probs, got: float, exp: float) -> str:
    keep = probs > 0
    n = counts.sum()
    stat = float((((counts[keep] - n * probs[keep]) ** 2) / (n * probs[keep])).sum())
    df = int(keep.sum()) - 1
    if math.isnan(got):
        return "NaN: an outcome whose probability is 0 adds 0/0 to the statistic"
    if abs(got - stat) <= 1e-6 * max(1.0, stat):
        return "you returned the statistic itself, not its p-value"
    if got >= 0.99 and exp < 0.05:
        return (
            "your function accepts samples that are clearly not from p; a check that "
            "always passes tests nothing"
        )
    if got <= 0.05 < exp:
        return "your function rejects samples that do follow p (a p-value that is too small)"
    for wrong_df, what in ((df + 1, "the number of outcomes"), (df - 1, "outcomes - 2")):
        if wrong_df > 0 and abs(got - float(sps.chi2.sf(stat, wrong_df))) <= 1e-9 + 1e-6 * exp:
            return f"degrees of freedom off by one: you used {what}"
    if abs(got - (1 - exp)) <= 1e-6:
        return "you returned 1 - p-value: the p-value is the upper tail of the chi-square law"
    return (
        "wrong p-value, and not by a known slip (the statistic itself, 1 - p-value, or "
        "degrees of freedom off by one)"
    )


@register(
    "ex01.chi_square_p_value",
    points=3,
    needs="chi_square_p_value",
    title="Pearson's chi-square p-value",
    hint="work the case [480, 520] against [0.5, 0.5] by hand: its statistic is 1.6 on one "
    "degree of freedom. Only outcomes with probability > 0 count, in the statistic and in the "
    "degrees of freedom; the p-value is the chance of a statistic at least this large",
)
def check_chi_square_p_value(fn) -> Iterator[Case]:
    for name, c, pr in _p_value_cases():
        exp = _reference_p_value(c, pr)
        raw = call(name, fn, c.clone(), pr.clone())
        got = as_number(raw)
        if got is None:
            yield Case(
                name, False, f"a float, {exp:.4g}", fmt(raw), "return the p-value as a float"
            )
            continue
        ok = math.isfinite(got) and abs(got - exp) <= 1e-9 + 1e-6 * exp
        yield Case(
            name,
            ok,
            f"{exp:.6g}",
            f"{got:.6g}",
            "" if ok else _diagnose_p_value(c.double(), pr, got, exp),
        )
