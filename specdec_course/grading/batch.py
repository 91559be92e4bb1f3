"""Grade a class: run each submitted notebook in a fresh kernel, then its checks, by name.

    specdec-course grade submissions/ --out grades.csv [--junit grades.xml] [--workers 4]

``grades.csv`` has one row per submission and exercise (the gradebook); ``grades.checks.csv``
beside it has one row per check, with the reason for every lost point.

Each submission is graded in its own worker process, several at a time. The worker copies
the notebook to a temporary folder (the submission is never modified), starts a kernel with
a memory cap, runs every code cell with nbclient (errors do not stop the run; a cell that
runs past ``cell_timeout`` is interrupted), then runs one extra cell that looks the exercise's
functions up in the kernel's globals and checks them (:mod:`._inkernel`). So the grade does not
depend on which cells the student kept, deleted, moved or duplicated, only on the functions
that exist at the end.

Whatever a submission does, the batch goes on: invalid JSON ("unreadable"), a cell that
raises, an endless loop (interrupted; the notebook as a whole is stopped at
``notebook_timeout``), a kernel that dies or runs out of memory ("crashed"), a notebook that
defines nothing ("missing"). Each gets 0 for what it lacks, with the reason in the message.
The parent process also keeps a hard deadline per submission and kills the worker and its
kernel when it passes.

Not a security sandbox: the submission runs as the grading user, like nbgrader and otter.
Grade untrusted work in a container or a throw-away account.

This module gathers the public names; the work is done by :mod:`.runner` (discovery and the
pool of workers), :mod:`.worker` (one submission in one kernel), :mod:`.jobs` (the job and
result records passed between them) and :mod:`.reports` (CSV, JUnit XML, the summary).
"""

from .jobs import Submission, SubmissionResult
from .reports import (  # noqa: F401 - the CSV columns were module constants here
    CHECK_CSV_FIELDS,
    CSV_FIELDS,
    checks_csv_path,
    format_summary,
    write_checks_csv,
    write_csv,
    write_junit,
)
from .runner import collect, exercise_of, grade

__all__ = [
    "Submission",
    "SubmissionResult",
    "collect",
    "exercise_of",
    "format_summary",
    "grade",
    "write_csv",
    "write_checks_csv",
    "checks_csv_path",
    "write_junit",
]
