"""Check ``ex01.residual_distribution``: ``norm(max(p - q, 0))`` row by row, exactly."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from specdec_course import sampling

from .._support import as_vector, fmt
from ..context import case_seed
from ..core import Case, call_inplace, register
from ._common import P5, Q5, _t


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
