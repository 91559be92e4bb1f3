"""What the batch grader passes around: a submission, the job a worker runs, its result.

A :class:`Job` goes to a worker process and a :class:`SubmissionResult` comes back; across
the process boundary (a multiprocessing pipe) each travels as a plain dict, converted by its
own ``to_dict`` / ``from_dict`` and nowhere else. ``from_dict`` checks every field: a result
that does not hold together becomes an error result rather than a crash of the parent.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..student_side.results import STATUSES
from .context import wall_backstop
from .core import CheckResult, checks_for

__all__ = ["CELL_WALL_S", "CheckInfo", "Job", "NOTEBOOK_WALL_S", "Submission", "SubmissionResult"]

# The wall-clock limits (sleeping counts): each code cell, and all of a submission's grading
# (its cells, replays and checks, a re-run alone included). Past one, the exercise scores 0.
CELL_WALL_S = 120.0
NOTEBOOK_WALL_S = 600.0

# What a worker knows about one check: (id, title, points, hint).
CheckInfo = tuple[str, str, float, str]


@dataclass
class Submission:
    """A notebook found by :func:`.runner.collect`: its path, the name the reports show, its
    text (read once, before anything is graded) or why it cannot be graded."""

    path: Path
    exercise: str | None = None
    why_unknown: str = ""
    display: str = ""
    source: str | None = None
    problem: str = ""  # not read: a FIFO, a link, too large, not UTF-8...
    flags: list[str] = field(default_factory=list)  # for the instructor: a duplicate, say

    def __post_init__(self):
        if not self.display:
            self.display = str(self.path)


@dataclass(frozen=True)
class Job:
    """One submission for a worker: its notebook's text, which checks, limits and seed."""

    file: str  # the name the reports show (control characters already escaped)
    exercise: str
    checks: tuple[CheckInfo, ...]
    cell_timeout: float
    notebook_timeout: float
    memory_mb: int
    source: str  # the notebook, as read when the run began
    seed: int | None  # the run's seed (fresh cases); None: the visible ones
    deadline_s: float  # the judge's own limit for the whole submission
    cell_wall: float = CELL_WALL_S  # wall seconds per code cell
    notebook_wall: float = NOTEBOOK_WALL_S  # wall seconds for all of the submission
    wall_used: float = 0.0  # of it, already used (by the first run, for a re-run alone)

    @classmethod
    def for_submission(
        cls,
        sub: Submission,
        *,
        cell_timeout: float,
        notebook_timeout: float,
        memory_mb: int,
        seed: int | None,
        cell_wall: float = CELL_WALL_S,
        notebook_wall: float = NOTEBOOK_WALL_S,
    ) -> Job:
        """The job for ``sub`` (whose exercise is known and whose text was read)."""
        checks = tuple((s.id, s.title, s.points, s.hint) for s in checks_for(sub.exercise))
        return cls(
            file=sub.display,
            exercise=sub.exercise,
            checks=checks,
            cell_timeout=float(cell_timeout),
            notebook_timeout=float(notebook_timeout),
            memory_mb=int(memory_mb),
            source=sub.source or "",
            seed=seed,
            deadline_s=_deadline(float(notebook_wall), float(cell_timeout)),
            cell_wall=float(cell_wall),
            notebook_wall=float(notebook_wall),
        )

    def only(self, check_ids, wall_used: float = 0.0) -> Job:
        """The same submission with only the checks ``check_ids`` (a re-run of those), in what
        is left of its wall limit once ``wall_used`` seconds are spent."""
        keep = tuple(c for c in self.checks if c[0] in set(check_ids))
        used = min(max(0.0, float(wall_used)), self.notebook_wall)
        return replace(
            self,
            checks=keep,
            wall_used=used,
            deadline_s=_deadline(self.notebook_wall - used, self.cell_timeout),
        )

    def limit_names(self) -> dict[str, str]:
        """How the reports name each limit (its value and option)."""
        return {
            "cell_wall": f"the wall-clock limit of a code cell ({self.cell_wall:g} s, --cell-wall)",
            "notebook_wall": "the wall-clock limit of a submission "
            f"({self.notebook_wall:g} s, --notebook-wall)",
            "memory": f"the memory cap ({self.memory_mb} MiB, --memory-mb)",
            "judge_memory": f"its memory cap ({self.memory_mb} MiB, --memory-mb)",
        }

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
    flags: list[str] = field(default_factory=list)  # copy detection, for the instructor
    seed: int | None = None
    # Checks decided by a time limit, for the instructor: "id: what happened".
    time_limited: list[str] = field(default_factory=list)
    limit: str = ""  # the limit that stopped the submission (it then scores 0), if any

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

    def timed_out(self) -> list[str]:
        """The ids of the checks that ran out of time."""
        return [c.id for c in self.checks if c.status == "timeout"]

    def merge_rerun(self, again: SubmissionResult) -> None:
        """Take the checks of ``again`` (the timed-out checks, re-run alone) in place of
        this result's, and note each in :attr:`time_limited`."""
        new = {c.id: c for c in again.checks}
        for k, c in enumerate(self.checks):
            if c.id not in new:
                continue
            n = new[c.id]
            self.checks[k] = n
            verdict = "timed out again" if n.status == "timeout" else f"then {n.status}"
            self.time_limited.append(f"{c.id}: timed out, re-run alone: {verdict}")
        self.seconds += again.seconds
        self.flags += [f for f in again.flags if f not in self.flags]
        if again.limit:  # the re-run passed a limit: the exercise scores 0
            status = again.checks[0].status if again.checks else "timeout"
            self.stopped_by(again.limit, status)

    def stopped_by(self, limit: str, status: str) -> None:
        """The submission passed ``limit`` (its message, which names the limit): every check
        scores 0 with ``status`` and that message."""
        self.limit = limit
        self.checks = [
            replace(c, points=0.0, status=status, message=limit, cases=[]) for c in self.checks
        ]
        if limit not in self.notes:
            self.notes.append(limit)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SubmissionResult:
        """The result a worker sent, every field checked (``ValueError`` if malformed)."""
        if not isinstance(d, dict):
            raise ValueError("a result must be a dict")
        checks = [_check_from_dict(c) for c in _list(d.get("checks"))]
        seconds = d.get("seconds", 0.0)
        seed = d.get("seed")
        return cls(
            _text(d.get("file")),
            None if d.get("exercise") is None else _text(d.get("exercise")),
            checks,
            [_text(n) for n in _list(d.get("notes"))],
            float(seconds) if _finite(seconds) else 0.0,
            [_text(n) for n in _list(d.get("flags"))],
            seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
            [_text(n) for n in _list(d.get("time_limited"))],
            _text(d.get("limit", "")),
        )


def _deadline(notebook_wall: float, cell_timeout: float) -> float:
    # The judge's own limit: the notebook wall limit, the one check that may have begun just
    # before it (its CPU limit's wall backstop), kernel starts.
    return notebook_wall + wall_backstop(cell_timeout) + 60.0


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _text(x: Any) -> str:
    if not isinstance(x, str):
        raise ValueError(f"expected text, got {type(x).__name__}")
    return x


def _list(x: Any) -> list:
    if x is None:
        return []
    if not isinstance(x, list):
        raise ValueError(f"expected a list, got {type(x).__name__}")
    return x


def _check_from_dict(c: Any) -> CheckResult:
    res = CheckResult.from_dict(c)
    if res.status not in STATUSES:
        raise ValueError(f"unknown status {res.status!r}")
    if not (_finite(res.max_points) and res.max_points >= 0 and _finite(res.points)):
        raise ValueError("points must be finite numbers")
    res.points = min(max(float(res.points), 0.0), float(res.max_points))
    for name in ("id", "title", "message", "hint"):
        _text(getattr(res, name))
    return res
