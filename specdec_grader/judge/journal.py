"""The grading run's journal: every graded row on disk at once, and a rerun that resumes.

Beside the gradebook ``grades.csv``, ``grades.csv.journal`` holds a first line that names
the run (its seed and options) and then one JSON line per graded submission: its name, a
digest of its text and its whole result. As soon as a submission is graded, its line is
appended to the journal and its rows to ``grades.csv`` and ``grades.checks.csv``, each file
flushed to disk (``fsync``), so a grader killed at any point leaves every finished row
readable. The same command run again reads the journal, keeps the rows of the submissions
it graded already (same name, same text), and grades only the others, with the same seed;
the gradebook it writes at the end, in the order the submissions were found, is the one an
uninterrupted run writes. A finished run removes the journal (:meth:`Journal.remove`).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .jobs import Submission, SubmissionResult
from .reports import check_rows, checks_csv_path, gradebook_row, write_checks_csv, write_csv

__all__ = ["Journal", "journal_path", "submission_key"]

_KIND = "specdec-course grade journal 1"


def journal_path(out: str | os.PathLike) -> Path:
    """Where the journal of the gradebook ``out`` goes: ``grades.csv`` -> ``grades.csv.journal``."""
    p = Path(out)
    return p.with_name(p.name + ".journal")


def submission_key(sub: Submission) -> str:
    """What names a submission across runs: its name and a digest of its text (or of why it
    could not be read)."""
    text = sub.source if sub.source is not None else f"problem: {sub.problem}"
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{sub.display}\0{digest}"


def _append(path: Path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8", newline="") as f:
        f.write("".join(lines))
        f.flush()
        os.fsync(f.fileno())


def _csv_lines(rows: list[list[str]]) -> list[str]:
    import io

    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return [buf.getvalue()]


class Journal:
    """The journal of one gradebook (``out``), for a run with ``options`` (plain data)."""

    def __init__(self, out: str | os.PathLike, options: dict[str, Any], seed: int | None):
        self.out = Path(out)
        self.path = journal_path(out)
        self.options = json.loads(json.dumps(options))
        self.seed = seed
        self.done: dict[str, SubmissionResult] = {}  # key -> result, read from the journal
        self.sandbox = ""
        self._begun = False
        if self.path.exists():
            self._read()

    def _read(self) -> None:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            head = json.loads(lines[0]) if lines else {}
        except ValueError:
            head = {}
        if head.get("kind") != _KIND:
            raise ValueError(
                f"{self.path} is not a grading journal this version can read: move it away "
                "or delete it to grade afresh"
            )
        if head.get("options") != self.options:
            raise ValueError(
                f"{self.path} holds an interrupted run with other options or submissions "
                f"({head.get('options')}): run the same command again to resume it, or delete "
                "the journal to grade afresh"
            )
        if self.seed is not None and head.get("seed") != self.seed:
            raise ValueError(
                f"{self.path} holds an interrupted run with --seed {head.get('seed')}, not "
                f"{self.seed}: resume it with that seed, or delete the journal to grade afresh"
            )
        self.seed = head.get("seed")
        for line in lines[1:]:
            try:  # a line cut short by a kill is the one submission graded again
                entry = json.loads(line)
                self.done[str(entry["key"])] = SubmissionResult.from_dict(entry["result"])
            except (ValueError, KeyError, TypeError):
                continue

    def begin(self, sandbox: str, earlier: list[SubmissionResult]) -> None:
        """Start the files: the journal's first line (kept when resuming) and the two CSVs
        with their headers and the rows of ``earlier`` (the results the journal holds)."""
        self.sandbox = sandbox
        if not self.path.exists():
            head = {"kind": _KIND, "seed": self.seed, "options": self.options}
            _append(self.path, [json.dumps(head) + "\n"])
            self.done = {}
        write_csv(earlier, self.out, sandbox)
        write_checks_csv(earlier, checks_csv_path(self.out))
        self._begun = True

    def record(self, key: str, res: SubmissionResult) -> None:
        """``res`` is graded: on disk now, in the journal and in both CSVs."""
        if not self._begun:
            raise RuntimeError("Journal.begin first")
        # The journal last: its line is what a rerun keeps (the CSVs are rebuilt from it).
        _append(self.out, _csv_lines([gradebook_row(res, self.sandbox)]))
        _append(checks_csv_path(self.out), _csv_lines(check_rows(res)))
        entry = {"key": key, "result": res.to_dict()}
        _append(self.path, [json.dumps(entry) + "\n"])

    def remove(self) -> None:
        """The run is complete and its files written: the journal goes."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
