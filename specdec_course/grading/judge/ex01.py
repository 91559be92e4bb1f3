"""Checks of exercise 01: the residual distribution and one speculative sampling step.

Students implement, in ``exercises/ex01_residual.ipynb``:

- ``residual_distribution(p, q)``: ``norm(max(p - q, 0))`` row by row over the last axis of
  ``[..., V]`` tensors (one position, or a batch of rows ``[B, V]``), and a row of ``p`` where
  that row of ``p`` equals ``q``. Lesson 01's cell works on one position and normalises by
  one sum: on a batch it mixes the rows, which the batch cases catch;
- ``speculative_sample(p, q, generator=None) -> (token, accepted)``: draft from ``q``, accept
  with probability ``min(1, p/q)``, otherwise resample from the residual;
- ``chi_square_p_value(counts, probs)``: Pearson's goodness-of-fit p-value over the outcomes
  with probability > 0 (df = their number - 1).

The sampling check runs four chi-square tests (16,000 calls in all) on the law of
(token, accepted); a correct sampler fails one of them by chance with probability about
5e-6 (each result reports its rate), while the naive "resample from p" rule misses the
threshold by more than six standard deviations. The other two checks are exact.

References: :func:`specdec_course.sampling.residual_distribution`,
:func:`specdec_course.theory.acceptance_rate`, :func:`specdec_course.stats.chi_square_test`,
and scipy's ``chisquare`` for the p-value.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from scipy import stats as sps

from specdec_course import sampling, theory
from specdec_course.stats import chi_square_test
from specdec_course.stats import counts as _counts

from ._support import RULE_IMPLEMENTATIONS, FitLog, as_number, as_vector, fmt, seeded
from .context import case_seed, fresh_cases
from .core import Case, call, call_inplace, call_repeat, register

# Not in the sandbox while ex01 is graded (grading.judge.withheld): the package's residual
# and its speculative step, in every module that has them (lesson 01's proof picture draws
# the residual; Medusa's chain walk and the batched loop's NumPy rule take the step). (The
# p-value is scipy's to use.)
PUBLIC_IMPLEMENTATIONS = (
    "specdec_course.sampling._residual",
    "specdec_course.sampling.residual_distribution",
    "specdec_course.sampling.speculative_sample",
    "specdec_course.plots.proof_picture",
    "specdec_course.medusa.candidates.sampled_chain_walk",
    "specdec_course.decoding.batched._token_verify",
    *RULE_IMPLEMENTATIONS,
)
# What the references use of the package that answers nothing the exercise asks for.
ALLOWED = {
    "specdec_course.sampling.speculative_output_distribution": "the law of a whole step, "
    "from the withheld residual (it raises in the sandbox)",
    "specdec_course.theory.acceptance_rate": "alpha, a number the lesson gives; the residual "
    "and the step are what is asked",
    "specdec_course.stats.chi_square_test": "the statistics tool the checks use",
    "specdec_course.stats.counts": "a histogram",
}

# The 5-token example of lesson 01.
P5 = [0.50, 0.25, 0.15, 0.07, 0.03]
Q5 = [0.30, 0.40, 0.10, 0.15, 0.05]


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


# --------------------------------------------------------------------------- residual


def _reference_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The package's residual, row by row over the last axis of ``[..., V]``."""
    flat_p, flat_q = p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1])
    rows = [sampling.residual_distribution(a, b) for a, b in zip(flat_p, flat_q)]
    return torch.stack(rows).reshape(p.shape)


def _random_pair(V: int, g: torch.Generator, same: bool) -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.rand(V, generator=g, dtype=torch.float64) ** 3
    q = torch.rand(V, generator=g, dtype=torch.float64) ** 3
    # Zeros where a wrong clamp or a 0/0 shows; some pairs share their support exactly.
    p[torch.rand(V, generator=g) < 0.2] = 0
    q[torch.rand(V, generator=g) < 0.2] = 0
    p[0] += 0.1
    q[-1] += 0.1
    p, q = p / p.sum(), q / q.sum()
    return p, p.clone() if same else q


def _residual_cases():
    cases = [
        ("5-token example", _t(P5), _t(Q5)),
        ("zeros in p and in q", _t([0.0, 0.4, 0.0, 0.6, 0.0]), _t([0.3, 0.0, 0.2, 0.2, 0.3])),
        ("one-hot q (a greedy draft)", _t(P5), _t([0.0, 1.0, 0.0, 0.0, 0.0])),
        (
            "disjoint supports (the residual is p)",
            _t([0.0, 0.0, 0.5, 0.5]),
            _t([0.7, 0.3, 0.0, 0.0]),
        ),
        ("p == q (no residual mass: return p)", _t(P5), _t(P5)),
        (
            "a batch of 3 rows [3, 5]: the example, a greedy draft, zeros",
            _t([P5, P5, [0.4, 0.0, 0.3, 0.3, 0.0]]),
            _t([Q5, [0.0, 1.0, 0.0, 0.0, 0.0], [0.1, 0.5, 0.1, 0.0, 0.3]]),
        ),
        (
            "a batch [2, 5] whose second row has p == q",
            _t([P5, Q5]),
            _t([Q5, Q5]),
        ),
        (
            "leading axes [2, 2, 5] (two sequences, two positions each)",
            _t([[P5, Q5], [P5, [0.2] * 5]]),
            _t([[Q5, P5], [P5, Q5]]),
        ),
    ]
    g = torch.Generator().manual_seed(case_seed(1))
    rand = []
    for i in range(40):
        V = int(torch.randint(2, 40, (), generator=g))
        B = int(torch.randint(1, 9, (), generator=g))
        pairs = [_random_pair(V, g, same=(i * 9 + b) % 10 == 0) for b in range(B)]
        rand.append((torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs])))
    return cases, rand


def _diagnose_row(p: torch.Tensor, q: torch.Tensor, got: torch.Tensor, exp: torch.Tensor):
    if not torch.isfinite(got).all():
        if torch.equal(p, q):
            return "NaN or inf when p == q: there is no residual mass to normalise (0 / 0)"
        return "NaN or inf in your output: something you divide by can be 0"
    if (got < -1e-12).any():
        return "negative entries: where q exceeds p the residual has no mass, and no negative mass"
    s = got.sum().item()
    if abs(s - 1) > 1e-6:
        if abs(s - (p - q).clamp_min(0).sum().item()) < 1e-9:
            return f"your output sums to {s:.4g}, not 1: you forgot to normalise"
        return f"your output sums to {s:.4g}, not 1: it is not a distribution"
    if torch.allclose(got, p, atol=1e-9) and not torch.allclose(exp, p, atol=1e-9):
        return "you returned p, which is the answer only when p == q"
    if torch.allclose(got, q, atol=1e-9):
        return "you returned q: the residual is built from both p and q"
    back = (q - p).clamp_min(0)
    if back.sum() > 0 and torch.allclose(got, back / back.sum(), atol=1e-9):
        return (
            "you normalised the draft's excess over the target; the residual is the target's "
            "excess over the draft, max(p - q, 0)"
        )
    return "wrong values, though they form a distribution of the right length"


def _diagnose_residual(p: torch.Tensor, q: torch.Tensor, got: torch.Tensor, exp: torch.Tensor):
    if p.dim() == 1:
        return _diagnose_row(p, q, got, exp)
    r = (p - q).clamp_min(0)
    if r.sum() > 0 and torch.allclose(got, r / r.sum(), atol=1e-9, equal_nan=True):
        return (
            "you normalised the whole batch by one sum: each row (the last axis) is a "
            "distribution of its own and sums to 1"
        )
    V = p.shape[-1]
    rows = zip(p.reshape(-1, V), q.reshape(-1, V), got.reshape(-1, V), exp.reshape(-1, V))
    for i, (pr, qr, gr, er) in enumerate(rows):
        if not (torch.isfinite(gr).all() and (gr - er).abs().max().item() <= 1e-9):
            where = f"row {i} of the batch" if p.dim() == 2 else f"row {i} (flattened)"
            return f"{where}: {_diagnose_row(pr, qr, gr, er)}"
    return "wrong values"


def _same(a, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)


def _compare_residual(name, fn, p, q) -> Case:
    exp = _reference_residual(p, q)
    raw, after = call_inplace(name, fn, p, q)
    if not all(_same(a, b) for a, b in zip(after, (p, q))):
        return Case(
            name,
            False,
            "p and q unchanged",
            "your function modified its inputs",
            "your function changed p or q in place; the caller still needs them",
        )
    got = as_vector(raw)
    if got is None:
        return Case(
            name,
            False,
            "a tensor of probabilities",
            fmt(raw),
            "return a tensor of the same shape as p",
        )
    if got.shape != exp.shape:
        return Case(
            name,
            False,
            f"shape {tuple(exp.shape)}",
            f"shape {tuple(got.shape)}",
            "return a tensor of the same shape as p: one residual per row of the last axis",
        )
    if torch.isfinite(got).all() and (got - exp).abs().max().item() <= 1e-9:
        return Case(name, True)
    return Case(name, False, fmt(exp), fmt(got), _diagnose_residual(p, q, got, exp))


@register(
    "ex01.residual_distribution",
    points=3,
    needs="residual_distribution",
    title="the residual norm(max(p - q, 0)), row by row over a batch",
    hint="the residual is the part of p that q does not cover, scaled to sum to 1 (lesson 01, "
    "section 2, draws it), and every row of a batch is scaled on its own. The edge cases "
    "decide most failures: zeros in p or q, and a row where p == q, where nothing is left to "
    "scale; a reduction over one axis can keep that axis, so that it lines up with the rows",
)
def check_residual_distribution(fn) -> Iterator[Case]:
    fixed, rand = _residual_cases()
    for name, p, q in fixed:
        yield _compare_residual(name, fn, p, q)
    for i, (p, q) in enumerate(rand):
        shape = "x".join(map(str, p.shape))
        case = _compare_residual(f"random batch {i} ({shape})", fn, p, q)
        if not case.passed:
            yield Case(
                f"40 random batches, zeros and p == q rows included: batch {i} ({shape})",
                False,
                case.expected,
                case.got,
                case.message,
            )
            return
    yield Case("40 random batches, zeros and p == q rows included", True)


# --------------------------------------------------------------------------- one step

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


# --------------------------------------------------------------------------- chi-square


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
