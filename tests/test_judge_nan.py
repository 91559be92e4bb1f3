"""Every check fails a function whose numbers are NaN (and none passes on infinity).

Each exercise's solution (its setup, imports and answer cells, from ``solutions/``) is graded
inline with every float it returns replaced by NaN, then by infinity: a comparison written
``diff > tol`` would let NaN through (NaN > tol is False), one written ``not (diff <= tol)``
does not. Checks whose answers hold no float (token ids, counts, booleans) cannot be fed a
NaN this way; they are listed, so that none drops out unnoticed. No randomness beyond the
checks' fixed seeds: no false failures.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
from torch import nn

from specdec_course.model import KVCache
from specdec_grader import checks_for, exercises, run_check

ROOT = Path(__file__).resolve().parent.parent

# Their answers are integers or booleans (token ids, lengths, a draft length, a stop): nothing to
# make NaN. ex05's answer is a Triton kernel's token ids (and its source must be a file).
NO_FLOAT_ANSWER = {
    "ex01.speculative_sample",
    "ex02.optimal_gamma",
    "ex04.rollback",
    "ex04.commit_tokens",
    "ex07.tree_walk",
    "ex08.next_k",
    "ex08.controller_k",
    "ex08.confidence_stop",
    "ex11.lookup_copy",
}
SKIPPED = {"ex05.race_kernel"}


def _namespace(exercise: str) -> dict:
    (path,) = sorted((ROOT / "solutions").glob(f"{exercise}_*.ipynb"))
    nb = nbformat.read(path, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    keep = code[:2] + [
        c for c in code if c.lstrip().startswith(("def ", "class ", "@triton.jit", "@torch"))
    ]
    ns: dict = {"__name__": "student"}
    old = os.environ.get("TRITON_INTERPRET")
    try:
        for source in keep:
            exec(compile(source, str(path), "exec"), ns)
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
    return ns


class _Poison:
    """Replaces every float in what a function returns by ``value``; counts what it hit."""

    def __init__(self, value: float):
        self.value = value
        self.hits = 0

    def __call__(self, x):
        if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
            self.hits += 1
            return torch.full_like(x, self.value)
        if isinstance(x, np.ndarray) and x.dtype.kind == "f":
            self.hits += 1
            return np.full_like(x, self.value)
        if isinstance(x, float):
            self.hits += 1
            return self.value
        if isinstance(x, tuple) and not hasattr(x, "_fields"):
            return tuple(self(v) for v in x)
        if isinstance(x, list):
            return [self(v) for v in x]
        return x

    def wrap(self, obj):
        poison = self
        if isinstance(obj, type) and issubclass(obj, nn.Module):

            class Poisoned(obj):
                def forward(self, *args, **kwargs):
                    return poison(super().forward(*args, **kwargs))

            Poisoned.__module__ = "student"
            return Poisoned
        if not callable(obj) or hasattr(obj, "__getitem__"):
            return obj  # (a Triton kernel: launched, its tokens are ids)

        def poisoned(*args, **kwargs):
            out = poison(obj(*args, **kwargs))
            for a in (*args, *kwargs.values()):
                if isinstance(a, KVCache):  # its answer is written there (ex04, ex07)
                    poison.hits += 1
                    a.k.fill_(poison.value)
                    a.v.fill_(poison.value)
            return out

        poisoned.__module__ = "student"
        return poisoned


ALL = [(ex, spec.id) for ex in exercises() for spec in checks_for(ex)]
_NS: dict[str, dict] = {}


@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize(("exercise", "check_id"), ALL, ids=[c for _, c in ALL])
def test_a_check_fails_an_answer_of_nan_or_inf(exercise, check_id, value):
    if check_id in NO_FLOAT_ANSWER and value == math.inf:
        pytest.skip("no float in its answers (the NaN case shows it)")
    if check_id in SKIPPED:
        pytest.skip("a Triton kernel's answer is token ids; tests/test_grading_ex05.py")
    if exercise not in _NS:
        _NS[exercise] = _namespace(exercise)
    ns = _NS[exercise]
    (spec,) = [s for s in checks_for(exercise) if s.id == check_id]
    # (the solution itself gets full points: tests/test_grading_exNN.py)
    poison = _Poison(value)
    res = run_check(check_id, *(poison.wrap(ns[n]) for n in spec.needs), quiet=True)
    if check_id in NO_FLOAT_ANSWER:
        assert poison.hits == 0 and res.status == "passed"
        return
    assert poison.hits > 0, f"{check_id}: no float in its answers; list it in NO_FLOAT_ANSWER"
    assert res.status != "passed" and res.points == 0, f"{check_id} passed on {value}"
