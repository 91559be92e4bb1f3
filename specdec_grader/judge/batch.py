"""Grade a class: each notebook in a sandboxed kernel, every check judged outside it.

    specdec-grader submissions/ --out grades.csv [--junit grades.xml] [--workers 4]

``grades.csv`` has one row per submission and exercise (the gradebook); ``grades.checks.csv``
beside it has one row per check, with the reason for every lost point.

How it works (:mod:`.runner`, :mod:`.worker`, :mod:`.judge`):

- every submission is read once, at the start (:mod:`.discovery`): regular files only, up
  to a size limit, names escaped;
- a pool of judge processes grades them, several at a time. A judge starts the notebook's
  kernel in a sandbox (:mod:`.sandbox`: bubblewrap, a cgroup, limits), runs its code cells
  one by one with a time limit each, then runs every check of the exercise *in the judge*:
  the check computes the expected values, calls the student's functions (found by name)
  through a narrow channel (:mod:`.session`, :mod:`.wire`: plain data in and out), and
  decides. Nothing the kernel prints or sends is taken as a result;
- the cases are drawn fresh from the run's seed (recorded in the gradebook; ``--seed``
  reproduces a run), while a notebook's own ``check(...)`` cells use the visible ones;
- a cell that raises or runs past its limit costs only itself; a cell that kills its kernel
  or will not stop is skipped and the notebook replayed without it; a notebook that is not
  valid JSON is "unreadable", a missing function "missing"; each gets 0 for what it lacks,
  with the reason; the run goes on;
- functions that only forward to the course package's reference are flagged
  (:mod:`.copying`, best effort) and score 0 for that check.

No working sandbox, no grading: :class:`NoSandbox` before any notebook runs, unless the
instructor passes ``--sandbox off`` (the gradebook then says so). :mod:`.reports` writes the
CSVs, JUnit XML and the summary, escaping whatever a submission could put there, each file
atomically; :mod:`.journal` puts each row on disk as soon as it is graded, and resumes an
interrupted run. :mod:`.jobs` holds the records passed between
processes.
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
from .runner import GradeRun, collect, exercise_of, grade
from .sandbox import NO_SANDBOX_EXIT, NoSandbox

__all__ = [
    "GradeRun",
    "NO_SANDBOX_EXIT",
    "NoSandbox",
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
