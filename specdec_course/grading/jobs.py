"""What the batch grader passes around: a submission, the job a worker runs, its result.

A :class:`Job` goes to a worker process and a :class:`SubmissionResult` comes back; across
the process boundary (a multiprocessing pipe) each travels as a plain dict, converted by its
own ``to_dict`` / ``from_dict`` and nowhere else.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .core import CheckResult, checks_for

__all__ = ["CheckInfo", "Job", "Submission", "SubmissionResult"]

# What a worker knows about one check: (id, title, points, hint).
CheckInfo = tuple[str, str, float, str]


@dataclass
class Submission:
    path: Path
    exercise: str | None
    why_unknown: str = ""


@dataclass(frozen=True)
class Job:
    """One submission for a worker: which notebook, which checks, and its limits."""

    file: str  # the path as given (what the reports show)
    path: str  # the absolute path (what the worker copies)
    exercise: str
    # What a worker needs to know about the checks, without importing the exercise module
    # (and torch) in every worker process.
    checks: tuple[CheckInfo, ...]
    cell_timeout: float
    notebook_timeout: float
    memory_mb: int
    nonce: str  # marks the grading cell's result lines (nothing the student prints has it)

    @classmethod
    def for_submission(
        cls,
        sub: Submission,
        *,
        cell_timeout: float,
        notebook_timeout: float,
        memory_mb: int,
        nonce: str,
    ) -> Job:
        """The job for ``sub`` (whose exercise is known), with ``nonce`` for its result lines."""
        return cls(
            file=str(sub.path),
            path=str(sub.path.resolve()),
            exercise=sub.exercise,
            checks=tuple((s.id, s.title, s.points, s.hint) for s in checks_for(sub.exercise)),
            cell_timeout=float(cell_timeout),
            notebook_timeout=float(notebook_timeout),
            memory_mb=int(memory_mb),
            nonce=nonce,
        )

    def failed_checks(self, status: str, message: str) -> list[CheckResult]:
        """Every check of the job with 0 points, ``status`` and ``message``."""
        return [
            CheckResult(cid, title, status, 0.0, points, message=message, hint=hint)
            for cid, title, points, hint in self.checks
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Job:
        d = dict(d)
        d["checks"] = tuple(tuple(c) for c in d["checks"])
        return cls(**d)


@dataclass
class SubmissionResult:
    """The grade of one submission: one :class:`CheckResult` per check of its exercise."""

    file: str
    exercise: str | None
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def points(self) -> float:
        return sum(c.points for c in self.checks)

    @property
    def max_points(self) -> float:
        return sum(c.max_points for c in self.checks)

    @property
    def status(self) -> str:
        """ "passed" when every check passed, else the first non-passing check's status."""
        if not self.checks:
            return "unknown exercise"
        bad = [c.status for c in self.checks if c.status != "passed"]
        return bad[0] if bad else "passed"

    @property
    def first_problem(self) -> str:
        """The first non-passing check as ``"id: message"`` ("" when all passed); the notes
        when no check ran (an unknown exercise)."""
        if not self.checks:
            return "; ".join(self.notes)
        first = next((c for c in self.checks if c.status != "passed"), None)
        return f"{first.id}: {first.message}" if first else ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SubmissionResult:
        return cls(
            d["file"],
            d["exercise"],
            [CheckResult.from_dict(c) for c in d.get("checks", [])],
            list(d.get("notes", [])),
            float(d.get("seconds", 0.0)),
        )
