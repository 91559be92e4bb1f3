"""Graded exercises: a registry of checks, inline feedback, and a batch grader.

Students call :func:`check` in their notebook::

    from specdec_course.grading import check
    check("ex01.residual_distribution", residual_distribution)   # one check, one function
    check("ex01", globals())                                      # the whole exercise

It prints which cases passed, the points, and the first failure with expected against got
and what the difference probably means, and never raises: an untouched stub (``raise
NotImplementedError``) is "not attempted". Hints are progressive: a failure names what is
wrong; ``check(..., hint=True)`` adds the fuller hint, which points at the idea and never
prints a line of the solution. It runs in the notebook's own process, on the visible cases.

Instructors grade a class with ``specdec-course grade SUBMISSIONS... --out grades.csv``
(:mod:`specdec_course.grading.batch`): each notebook runs in its own sandboxed kernel, and
every check runs in the grader (the judge), on cases drawn fresh from the run's seed,
calling the functions the notebook defined, found by name, through a narrow channel.

Adding an exercise
------------------
Write ``specdec_course/grading/exNN.py`` (the module name is the exercise id; it is found and
imported on first use) and register its checks::

    from specdec_course.grading import Case, call, register

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
- Compare against the package's reference implementation, never a copy of its logic.
- Under the batch grader the student's objects live in a kernel: call them only through
  :func:`call` / :func:`call_repeat` (or directly), with plain data, models, caches or
  callables as arguments, and expect plain data back. To inspect a student's object itself
  (a class, a Triton kernel), write a module-level *probe* ``probe(obj, ...)`` returning
  plain data and ``call(case, probe, obj, ...)``: it runs where the object is.
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

from .core import (
    BATCH_ENV,
    STATUSES,
    Case,
    CheckResult,
    CheckSpec,
    ExerciseReport,
    StudentError,
    call,
    call_repeat,
    check,
    checks_for,
    exercises,
    grade_namespace,
    register,
    run_check,
    when_implemented,
)

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
