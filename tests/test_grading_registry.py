"""Each exercise grades each of its functions once: one check per function, so that a
function is worth its points once and a learner reads one report for it.

A check may need a helper besides the function it grades (``needs`` a tuple of names); the
function a check grades is the last of its needs.
"""

from __future__ import annotations

from collections import Counter

import pytest

import specdec_grader as grading


@pytest.mark.parametrize("exercise", grading.exercises())
def test_every_function_is_graded_by_one_check(exercise):
    graded = Counter(spec.needs[-1] for spec in grading.checks_for(exercise))
    twice = {name: n for name, n in graded.items() if n > 1}
    assert not twice, f"{exercise} grades these functions in more than one check: {twice}"


@pytest.mark.parametrize("exercise", grading.exercises())
def test_every_exercise_is_worth_ten_points(exercise):
    assert sum(s.points for s in grading.checks_for(exercise)) == 10
