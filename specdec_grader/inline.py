"""Inline feedback in a notebook: ``check()`` and ``when_implemented()``.

``check()`` grades in the notebook's own process, with the judge side's checks
(:mod:`specdec_grader.judge`), on the visible cases. Under the batch grader the
notebook runs in a sandbox that holds no judge code at all (no reference, no exact law, no
case generator, not even as files), so there ``check()`` finds nothing to import and says
in one line that the grader grades at the end; it never ships a reference into the sandbox.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from .student_side import BATCH_ENV

__all__ = ["INLINE_NOTE", "check", "when_implemented"]

# What inline feedback says about its cases (the batch grader's are drawn fresh each run).
INLINE_NOTE = "(inline check, on the visible cases; the batch grader draws fresh ones)"
BATCH_NOTE = "graded by the batch grader at the end of the notebook"


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 300 else text[:297] + "..."


def _judge_core():
    """The judge side's registry and runner, or ``None`` where it is absent (the sandbox)."""
    if os.environ.get(BATCH_ENV):
        return None
    try:
        return importlib.import_module("specdec_grader.judge.core")
    except ImportError:
        return None


def check(check_id: str, *objs: Any, hint: bool = False, time_limit: float | None = 60.0) -> None:
    """Inline feedback in a notebook: grade and print a short report.

    ``check("ex01.residual_distribution", residual_distribution)`` runs one check on your
    function; ``check("ex01", globals())`` runs every check of the exercise on the functions
    your notebook defines and prints the score table. A failure shows what went wrong (the
    first failing case, expected against got, and what the difference probably means);
    ``hint=True`` adds the fuller hint, which points at the idea and never at the code.
    Never raises: a stub that raises ``NotImplementedError`` is reported as "not attempted"
    with 0 points, and any other problem is printed. Returns ``None`` (so that a notebook
    shows the report once); use :func:`run_check` or :func:`grade_namespace` for the result
    objects.
    """
    try:
        core = _judge_core()
        if core is None:
            print(f"{check_id}: {BATCH_NOTE}")
            return None
        if isinstance(check_id, str) and core._EX_RE.match(check_id):
            if len(objs) != 1 or not isinstance(objs[0], Mapping):
                raise ValueError(
                    f"check({check_id!r}, ...) grades a whole exercise and needs your "
                    "namespace: call check('%s', globals())" % check_id
                )
            report: Any = core.grade_namespace(
                check_id, objs[0], time_limit=time_limit, quiet=False
            )
        else:
            report = core.run_check(check_id, *objs, time_limit=time_limit)
        print(report.report(hint=bool(hint)))
        print(INLINE_NOTE)
    except Exception as e:  # noqa: BLE001 - inline feedback must never stop a notebook
        print(f"check could not run: {_short(e)}")


@contextlib.contextmanager
def when_implemented(what: str = "this cell") -> Iterator[None]:
    """Run a cell's body only as far as your functions are implemented.

    ``with when_implemented("the plot"): ...`` stops the body quietly at the first
    ``NotImplementedError`` (a stub not yet replaced) and prints that it was skipped, so an
    untouched exercise notebook runs end to end. Every other exception passes through.
    """
    try:
        yield
    except NotImplementedError as e:
        print(f"skipped {what}: {e or 'a function is not implemented yet'}")
