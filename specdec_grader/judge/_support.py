"""Helpers for writing checks: turn student output into tensors, print it short, seed RNGs,
build small random models."""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from specdec_course.model import CharGPT, GPTConfig

from ..student_side.results import Case
from . import context

# The package's own versions of the accept/resample rule and of its recovered-token race, in
# every public module that has one (batched in PyTorch, batch-1, block-wise, in Triton): the
# exercises that ask for the rule or the race withhold them from their sandbox
# (:mod:`.withheld`; each exercise module's ``PUBLIC_IMPLEMENTATIONS``).
RULE_IMPLEMENTATIONS = (
    "specdec_course.verifier.rejection_sample_prepared",
    "specdec_course.verifier.rejection_sample_row",
    "specdec_course.verifier._row_tensors",
    "specdec_course.verifier._row_host",
    "specdec_course.block_verifier.block_verify_prepared",
    "specdec_course.block_verifier.block_verify_row",
    "specdec_course.kernels.rejection.verify_kernel",
    "specdec_course.kernels.rejection.race_kernel",
    "specdec_course.kernels.rejection.race_combine_kernel",
)


def fmt(x: Any, digits: int = 4, limit: int = 8) -> str:
    """A short, rounded rendering of a number, vector or anything else (for expected/got)."""
    if isinstance(x, torch.Tensor):
        if x.dim() == 0:
            return fmt(x.item(), digits)
        flat = x.detach().flatten().tolist()
        body = ", ".join(fmt(v, digits) for v in flat[:limit])
        more = f", ... ({len(flat)} entries)" if len(flat) > limit else ""
        shape = f" shape {tuple(x.shape)}" if x.dim() > 1 else ""
        return f"[{body}{more}]{shape}"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    if isinstance(x, (list, tuple, np.ndarray)):
        with contextlib.suppress(Exception):
            return fmt(torch.as_tensor(np.asarray(x, dtype=np.float64)), digits, limit)
    text = repr(x)
    return text if len(text) <= 120 else text[:117] + "..."


def as_vector(x: Any) -> torch.Tensor | None:
    """Student output as a float64 CPU tensor, or None when it is not numbers."""
    try:
        if isinstance(x, torch.Tensor):
            return x.detach().to("cpu", torch.float64)
        return torch.as_tensor(np.asarray(x, dtype=np.float64))
    except Exception:  # noqa: BLE001 - anything that is not numeric
        return None


def as_number(x: Any) -> float | None:
    """Student output as a Python float (accepts 0-d tensors and numpy scalars), else None."""
    try:
        if isinstance(x, torch.Tensor):
            return float(x.item()) if x.numel() == 1 else None
        if isinstance(x, (bool, np.bool_)):
            return None
        return float(x)
    except Exception:  # noqa: BLE001
        return None


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[torch.Generator]:
    """Yield a seeded generator and seed the global RNGs too, restoring them afterwards.

    Students may ignore the generator and use torch's, numpy's or Python's global RNG; seeding
    all of them keeps a check repeatable, and restoring them leaves the notebook's state alone.
    Calls into a grading kernel inside the block get the same: the kernel seeds its RNGs once.
    """
    np_state, py_state = np.random.get_state(), random.getstate()
    with torch.random.fork_rng(devices=[]), context.seeded_block(seed):
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        try:
            yield torch.Generator().manual_seed(seed)
        finally:
            np.random.set_state(np_state)
            random.setstate(py_state)


def random_model(cfg: GPTConfig, seed: int, scale: float, *, frozen: bool = False) -> CharGPT:
    """A random ``CharGPT(cfg)`` in eval mode, built after ``torch.manual_seed(seed)``.

    Every weight is multiplied by ``scale``: larger weights than at initialisation give sharp
    attention and outputs far from uniform, so a wrong mask, scale or temperature shows.
    ``frozen`` turns gradients off (student code may call the models outside ``no_grad``).
    """
    torch.manual_seed(seed)
    m = CharGPT(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(scale)
    if frozen:
        m.requires_grad_(False)
    return m


# The statistical cases of one check, taken together (their chi-square statistics add up, as
# do their degrees of freedom), fit this improbably well only when the outcomes were emitted
# in the law's proportions (a function counting its calls), not drawn.
TOO_GOOD_RATE = 1e-8


class FitLog:
    """The chi-square results of one check's statistical cases, for :meth:`case`."""

    def __init__(self):
        self.results: list = []

    def add(self, r):
        self.results.append(r)
        return r

    def case(self) -> Case:
        """A case that fails when the check's results, together, fit better than honest
        sampling does with probability :data:`TOO_GOOD_RATE` (the lower tail of the summed
        statistic). Repeated calls of one function object can share state, so this is what
        tells a sampler from a counter; its false-failure rate is that rate."""
        from scipy import stats as sps

        rs = [r for r in self.results if r.df > 0 and math.isfinite(r.statistic)]
        df = sum(r.df for r in rs)
        stat = sum(r.statistic for r in rs)
        if df == 0:
            return Case("the samples, together, fit as samples do", True)
        floor = float(sps.chi2.ppf(TOO_GOOD_RATE, df))
        ok = stat >= floor
        return Case(
            "the samples, together, fit as samples do",
            ok,
            expected=f"chi-square summed over the cases >= {floor:.3g} ({df} df)",
            got=f"{stat:.3g}",
            message=""
            if ok
            else "the outcomes follow the law more closely than sampling ever does: each call "
            "must draw its outcome afresh, not keep count across calls",
            false_failure_rate=TOO_GOOD_RATE,
        )


def first_wrong(name: str, cases: Iterable[Case]) -> Case:
    """The first case of ``cases`` that failed, else one passed case named ``name``.

    ``cases`` is consumed lazily (pass a generator), so nothing after the first failure is
    called: one reported failure per group of inputs, and no time spent past it."""
    for case in cases:
        if not case.passed:
            return case
    return Case(name, True)
