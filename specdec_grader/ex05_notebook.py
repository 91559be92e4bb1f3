"""What the exercise 05 notebook imports: ``launch_race``, ``make_race_inputs`` and, for the
visible example only, ``reference_race``.

The launcher and the input maker are kernel-side code (they are in the sandbox too). The
reference is the judge's: inline it comes from :mod:`specdec_grader.judge.ex05`;
under the batch grader, whose sandbox holds no judge code, calling it raises a clear error
(the cells that print the visible example are noted, and cost nothing).
"""

from __future__ import annotations

import importlib

from .student_side.helpers import make_race_inputs
from .student_side.probes import launch_race

__all__ = ["launch_race", "make_race_inputs", "reference_race"]


def reference_race(pos, p, q, e):
    """The recovered tokens of the visible example (see ``specdec_grader.judge.ex05``): ``[B]``."""
    try:
        judge = importlib.import_module("specdec_grader.judge.ex05")
    except ImportError:
        raise RuntimeError(
            "reference_race is the grader's reference: it is not available while the batch "
            "grader runs the notebook (the check itself computes the expected tokens)"
        ) from None
    return judge.reference_race(pos, p, q, e)
