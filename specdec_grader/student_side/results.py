"""What a check yields and returns: ``Case``, ``CheckResult``, ``ExerciseReport``, statuses.

Plain data with their printed reports; nothing here runs student code.

Feedback is progressive. A report names what is wrong (the first failing case, expected
against got, and its diagnosis); the fuller hint, a nudge towards the idea and never a line
of the solution, is printed only when asked for (``report(hint=True)``: the student's
``check(..., hint=True)``, and the instructor's JUnit XML).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["HINT_OFFER", "STATUSES", "Case", "CheckResult", "ExerciseReport"]

# Every status a check result can have, in the CSV and the reports.
STATUSES = (
    "passed",  # every case passed: full points
    "failed",  # a case gave a wrong answer
    "error",  # the student's code raised (not NotImplementedError)
    "not attempted",  # the student's code raised NotImplementedError (the untouched stub)
    "missing",  # the name the check needs is not defined
    "timeout",  # the check or the notebook ran out of time
    "crashed",  # the kernel died (memory, os._exit, segfault) before the check ran
    "unreadable",  # the submission is not a notebook that can be read
)


@dataclass
class Case:
    """One verified input: its name, whether it passed and, if not, what was expected and got.

    ``message`` is the diagnosis: what the difference probably means ("your output sums to
    0.4, not 1"), said without the fix's code; ``hint`` is the fuller, case-specific hint shown
    only on request (empty: the check's own hint serves); ``false_failure_rate`` is set by
    statistical cases (the chance that a correct function fails this case by bad luck).
    """

    name: str
    passed: bool
    expected: str = ""
    got: str = ""
    message: str = ""
    false_failure_rate: float = 0.0
    hint: str = ""


# What a failed report says when its hint was not asked for.
HINT_OFFER = "(for a hint, run this check again with hint=True)"


@dataclass
class CheckResult:
    """The outcome of one check on one student object; ``str()`` gives the printed report."""

    id: str
    title: str
    status: str
    points: float
    max_points: float
    message: str = ""
    hint: str = ""
    cases: list[Case] = field(default_factory=list)
    false_failure_rate: float = 0.0
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CheckResult:
        d = dict(d)
        d["cases"] = [Case(**c) for c in d.get("cases", [])]
        return cls(**d)

    @property
    def full_hint(self) -> str:
        """The hint for the first failing case: its own, else the check's ("" if passed)."""
        if self.status not in ("failed", "error", "timeout"):
            return ""
        first = next((c for c in self.cases if not c.passed), None)
        return (first.hint if first is not None and first.hint else "") or self.hint

    def report(self, hint: bool = False) -> str:
        """The printed report: cases, points, the first failure and its diagnosis; the fuller
        hint only with ``hint=True`` (else one line that says how to ask for it)."""
        mark = {"passed": "PASSED", "not attempted": "NOT ATTEMPTED"}.get(
            self.status, self.status.upper()
        )
        lines = [f"{self.id}: {_pts(self.points)}/{_pts(self.max_points)} points, {mark}"]
        if self.title:
            lines[0] += f"  ({self.title})"
        for c in self.cases:
            lines.append(f"  [{'ok' if c.passed else 'XX'}] {c.name}")
        first = next((c for c in self.cases if not c.passed), None)
        if first is not None:
            if first.expected or first.got:
                lines.append(f"  first failure: {first.name}")
                lines.append(f"    expected: {first.expected}")
                lines.append(f"    got:      {first.got}")
        if self.status != "passed" and self.message:
            lines.append(_wrap(self.message, "  "))
        more = self.full_hint
        if more:
            lines.append(_wrap(f"hint: {more}", "  ") if hint else f"  {HINT_OFFER}")
        if self.status == "passed" and self.false_failure_rate > 0:
            # (imported here: the grader's command answers --help without torch or SciPy)
            from specdec_course.stats import format_rate

            lines.append(
                f"  (statistical cases: a correct function fails them by chance with "
                f"probability {format_rate(self.false_failure_rate)})"
            )
        return "\n".join(lines)

    __str__ = report

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython shows the report, not a repr
        printer.text(self.report())


@dataclass
class ExerciseReport:
    """All checks of one exercise run on one namespace; ``str()`` gives a score table."""

    exercise: str
    results: list[CheckResult]

    @property
    def points(self) -> float:
        return sum(r.points for r in self.results)

    @property
    def max_points(self) -> float:
        return sum(r.max_points for r in self.results)

    def report(self, hint: bool = False) -> str:
        """The score table; with ``hint=True`` each check that lost points adds its
        diagnosis and hint below the table."""
        width = max([len(r.id) for r in self.results] + [5])
        lines = [f"{self.exercise}: {_pts(self.points)}/{_pts(self.max_points)} points"]
        for r in self.results:
            lines.append(
                f"  {r.id:<{width}}  {_pts(r.points):>4}/{_pts(r.max_points):<4} {r.status}"
            )
        hinted = [r for r in self.results if r.full_hint]
        if hinted and not hint:
            lines.append(HINT_OFFER)
        for r in hinted if hint else ():
            lines.append(_wrap(f"{r.id}: {r.message}", "") if r.message else f"{r.id}:")
            lines.append(_wrap(f"hint: {r.full_hint}", "  "))
        return "\n".join(lines)

    __str__ = report

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(self.report())


# Reports are read in a notebook's output (JupyterLab wraps long lines mid-word) and in a
# terminal: long sentences are wrapped at this width, continuation lines indented.
WIDTH = 88


def _wrap(text: str, indent: str) -> str:
    """``text`` wrapped at ``WIDTH``, first line at ``indent``, the rest two spaces further;
    its own line breaks kept."""
    return "\n".join(
        textwrap.fill(
            para,
            WIDTH,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        for para in text.split("\n")
    )


def _pts(x: float) -> str:
    return f"{x:g}"
