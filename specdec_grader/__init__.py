"""Graded exercises: a registry of checks, inline feedback, and a batch grader.

Students call :func:`check` in their notebook::

    from specdec_grader import check
    check("ex01.residual_distribution", residual_distribution)   # one check, one function
    check("ex01", globals())                                      # the whole exercise

It prints which cases passed, the points, and the first failure with expected against got
and what the difference probably means, and never raises: an untouched stub (``raise
NotImplementedError``) is "not attempted". Hints are progressive: a failure names what is
wrong; ``check(..., hint=True)`` adds the fuller hint, which points at the idea and never
prints a line of the solution. It runs in the notebook's own process, on the visible cases.

Instructors grade a class with ``specdec-grader SUBMISSIONS... --out grades.csv``
(:mod:`specdec_grader.judge.batch`): each notebook runs in its own sandboxed kernel,
and every check runs in the grader (the judge), on cases drawn fresh from the run's seed,
calling the functions the notebook defined, found by name, through a narrow channel.

Two rooms, by trust
-------------------
- :mod:`.student_side`: what runs beside student code and what the sandbox may import (the agent
  that runs cells and calls the student's functions, the wire format, the shared result
  types, the probes that launch a student's object where it lives). Trusted by nobody.
- :mod:`.judge`: the registry, the checks with their references and exact laws, case
  generation, scoring, the sandbox, the sessions and the batch runner. The sandbox never
  mounts it (it is an empty read-only folder there), so no reference can be imported in a
  graded notebook by any route.
- :mod:`.inline` (``check``, ``when_implemented``) sits above both: it imports the judge side
  when it is there (a student's own JupyterLab) and says "graded at the end" where it is not.

The judge side's names (``Case``, ``call``, ``register``, ``run_check``, ...) are importable
from here, lazily, wherever the judge side exists.

Adding an exercise
------------------
Write ``specdec_grader/judge/exNN.py`` (the module name is the exercise id; it is
found and imported on first use) and register its checks::

    from specdec_grader.judge.core import Case, call, register

    @register("ex03.kv_cache_append", points=3, needs="append_kv",
              title="appending keys and values to the cache",
              hint="which axis of the buffers is time? lesson 03, section 4")
    def _append(append_kv):
        for T in (1, 5):
            got = call(f"T={T}", append_kv, ...)        # student code, called through `call`
            yield Case(f"T={T}", passed=..., expected="...", got="...",
                       message="what the difference probably means",
                       hint="the fuller hint for this mistake, shown on request")

- ``needs`` names what the check takes from the student's namespace (a tuple for several;
  the check function receives them in that order). The batch grader looks them up by name;
  a needed name bound to a function imported from ``specdec_course`` scores 0 ("imported
  rather than written"), so list only what the student writes.
- Compare against the package's reference implementation, never a copy of its logic, and
  compute the expected value from the judge's own copy of the inputs, drawn (all of them)
  before the first call: what the student's code does to its arguments never comes back.
- Under the batch grader the student's objects live in a kernel: call them only through
  :func:`call` / :func:`call_repeat` (or directly), with plain data, models, caches or
  callables as arguments, and expect plain data back. To use a student's object that cannot
  travel (a class, a Triton kernel), add a *probe* to :mod:`.student_side.probes` (plain data in
  and out, no reference, no verdict) and ``call(case, probe, obj, ...)``.
- List in the module's ``PUBLIC_IMPLEMENTATIONS`` (dotted paths of top-level functions) the
  package's own versions of what the exercise asks for, in every module that has one: its
  sandbox mounts those modules with them replaced by stubs (:mod:`.judge.withheld`), so no
  route inside the kernel reaches them; the judge keeps the real ones for its references.
- Every comparison fails on NaN and infinity: ``not (diff <= tol)``, never ``diff > tol``.
- Draw random inputs from seeds passed through ``context.case_seed(n)`` (``n`` inline, fresh
  per run under the batch grader); add random cases when ``context.fresh_cases()``.
- Statistical cases use :func:`specdec_course.stats.chi_square_test` against the exact
  distribution and pass ``false_failure_rate=result.false_failure_rate``; keep each check's
  total under 1e-4 and each check under about 2 seconds.
- A check earns its points when every case passes; list the edge cases that a wrong
  implementation gets wrong, each with a ``message`` that names the likely mistake. Neither
  a message nor a hint may hand out the answer: a message says what is wrong (the symptom,
  the rule it breaks), a hint says where to look; neither quotes the solution's code or its
  formula (``tests/test_grading_hints.py`` holds every exercise to that).
- Name the notebooks ``exercises/exNN_topic.ipynb`` and ``solutions/exNN_topic.ipynb`` and
  add ``tests/test_grading_exNN.py`` with the mutation tests (see ``test_grading_checks.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

from .inline import check, when_implemented
from .student_side import BATCH_ENV
from .student_side.errors import StudentError
from .student_side.results import STATUSES, Case, CheckResult, ExerciseReport

# Judge-side names, imported on first use (absent in the sandbox).
_JUDGE = {
    "CheckSpec",
    "call",
    "call_repeat",
    "checks_for",
    "exercises",
    "grade_namespace",
    "register",
    "run_check",
}

__all__ = [
    "BATCH_ENV",
    "STATUSES",
    "Case",
    "CheckResult",
    "CheckSpec",
    "ExerciseReport",
    "StudentError",
    "call",
    "call_repeat",
    "check",
    "checks_for",
    "exercises",
    "grade_namespace",
    "register",
    "run_check",
    "when_implemented",
]


def __getattr__(name: str) -> Any:
    if name in _JUDGE:
        return getattr(importlib.import_module(f"{__name__}.judge.core"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
