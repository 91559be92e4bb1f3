"""Check ``ex01.speculative_sample``: the law of (token, accepted) of one step, by four
chi-square tests."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from specdec_course import sampling, theory
from specdec_course.stats import chi_square_test
from specdec_course.stats import counts as _counts

from .._support import FitLog, as_number, fmt, seeded
from ..context import case_seed, fresh_cases
from ..core import Case, call, call_repeat, register
from ._common import P5, Q5, _t

# (name, p, q, samples). The sizes keep the check near a second for a plain Python sampler
# while a wrong rule fails by orders of magnitude: the naive rule puts 0.425 on token 0 of the
# 5-token example instead of 0.5, a 14-sigma gap at 8,000 samples.
_SAMPLE_CASES = [
    ("5-token example", P5, Q5, 8000),
    ("zeros in p and in q", [0.4, 0.0, 0.3, 0.3, 0.0], [0.1, 0.5, 0.1, 0.0, 0.3], 4000),
    ("one-hot q (a greedy draft)", P5, [0.0, 1.0, 0.0, 0.0, 0.0], 3000),
    ("p == q (every draft is accepted)", P5, P5, 1000),
]


def _sample_cases() -> list[tuple[str, list[float], list[float], int]]:
    """The visible cases, and under the batch grader one more on a fresh random pair (so
    that a sampler keyed to the visible distributions earns nothing)."""
    if not fresh_cases():
        return _SAMPLE_CASES
    g = torch.Generator().manual_seed(case_seed(99))
    V = int(torch.randint(3, 7, (), generator=g))
    p = torch.rand(V, generator=g, dtype=torch.float64) + 0.05
    q = torch.rand(V, generator=g, dtype=torch.float64) + 0.05
    p[int(torch.randint(0, V, (), generator=g))] = 0.0  # a zero in p, where a 0/0 shows
    pl, ql = (p / p.sum()).tolist(), (q / q.sum()).tolist()
    return [*_SAMPLE_CASES, (f"a random pair (V = {V})", pl, ql, 4000)]


def _joint_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Exact law of (token, accepted) as 2V bins: [accepted token 0..V-1, rejected 0..V-1]."""
    alpha = theory.acceptance_rate(p, q)
    return torch.cat([torch.minimum(p, q), (1 - alpha) * sampling.residual_distribution(p, q)])


def _diagnose_sampler(p, q, tokens, accepted) -> str:
    V = len(p)
    n = len(tokens)
    alpha = theory.acceptance_rate(p, q)
    acc_rate = accepted.float().mean().item()
    sd = math.sqrt(max(alpha * (1 - alpha), 1e-12) / n)
    if accepted.all() and alpha < 1:
        return (
            "every draft was reported accepted, but a draft x is accepted only with "
            "probability min(1, p(x)/q(x)): the flag must say whether this one was"
        )
    overlap = int((torch.minimum(p, q) > 0).sum())
    if accepted.any() and overlap > 1 and tokens[accepted].unique().numel() == 1:
        return (
            "every accepted draft is the same token: the draft is q's argmax, not a sample from q"
        )
    if abs(acc_rate - alpha) > 6 * sd + 1e-9:
        return (
            f"drafts were accepted {acc_rate:.4f} of the time, expected "
            f"sum(min(p, q)) = {alpha:.4f}: the accept test does not pass with probability "
            "min(1, p(x)/q(x))"
        )
    if accepted.any():
        law = torch.minimum(p, q) / max(alpha, 1e-300)
        r = chi_square_test(_counts(tokens[accepted], V), law)
        if not r.passed:
            return (
                "the accepted tokens do not follow min(p, q): the draft token is not a sample "
                "from q (an argmax?)"
            )
    if (~accepted).any():
        r = chi_square_test(_counts(tokens[~accepted], V), sampling.residual_distribution(p, q))
        if not r.passed:
            return (
                "after a rejection the token must be drawn from the residual "
                "norm(max(p - q, 0)), not from p, and sampled, not argmax"
            )
    return "the (token, accepted) pairs do not follow the speculative rule"


@register(
    "ex01.speculative_sample",
    points=4,
    needs="speculative_sample",
    title="one speculative step: draft, accept or reject, resample",
    hint="three random draws, in this order: the draft from q, a uniform for the accept test, "
    "and after a rejection a token from your residual; lesson 01, section 1, gives the accept "
    "rule. Pass the generator to every draw",
)
def check_speculative_sample(fn) -> Iterator[Case]:
    p, q = _t(P5), _t(Q5)
    with seeded(case_seed(0)) as g:
        out = call("returns (token, accepted)", fn, p, q, generator=g)
    if not _valid_pair(out):
        yield Case(
            "returns (token, accepted)",
            False,
            "(int, bool), e.g. (2, True)",
            fmt(out),
            "return a pair: the token as an int and whether the draft was accepted",
        )
        return
    yield Case("returns (token, accepted)", True)

    fits = FitLog()
    for k, (name, pl, ql, n) in enumerate(_sample_cases()):
        p, q = _t(pl), _t(ql)
        V = len(p)
        toks = torch.empty(n, dtype=torch.int64)
        accs = torch.empty(n, dtype=torch.bool)
        with seeded(case_seed(100 + k)) as g:
            # One round trip for all n calls when the function runs in a grading kernel.
            pairs = call_repeat(name, n, fn, p, q, generator=g)
        for i, out in enumerate(pairs):
            if not _valid_pair(out):
                yield Case(
                    name,
                    False,
                    "(int, bool), e.g. (2, True)",
                    fmt(out),
                    "return a pair: the token as an int and whether the draft was accepted",
                )
                return
            toks[i], accs[i] = int(as_number(out[0])), bool(out[1])
        if toks.min() < 0 or toks.max() >= V:
            yield Case(
                name,
                False,
                f"tokens in 0..{V - 1}",
                f"token {int(toks.max())}",
                "return a token id between 0 and len(p) - 1",
            )
            return
        law = _joint_law(p, q)
        r = chi_square_test(_counts(toks + V * (~accs).long(), 2 * V), law)
        freq = _counts(toks, V) / n
        fits.add(r)
        yield Case(
            f"{name}: {n} samples, chi-square on (token, accepted)",
            r.passed,
            expected=f"token frequencies {fmt(p)}, accepted {theory.acceptance_rate(p, q):.4f}",
            got=f"token frequencies {fmt(torch.as_tensor(freq))}, accepted "
            f"{accs.double().mean().item():.4f} ({r})",
            message="" if r.passed else _diagnose_sampler(p, q, toks, accs),
            false_failure_rate=r.false_failure_rate,
        )
    yield fits.case()


def _valid_pair(out) -> bool:
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        return False
    tok = as_number(out[0])
    if tok is None or not tok.is_integer():
        return False
    a = out[1]
    if isinstance(a, torch.Tensor):
        return a.numel() == 1
    return isinstance(a, (bool, np.bool_)) or (isinstance(a, int) and a in (0, 1))
