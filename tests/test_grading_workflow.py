"""The grading workflow (.github/workflows/grade.yml), for instructors without Linux: valid,
sandboxed, and it hands back every file of the gradebook.

actionlint checks it as it checks the course's CI workflow (tests/test_workflow.py); the
second test pins what the job does: it installs bubblewrap, grades with the package's own
command and never with ``--sandbox off``, and uploads the files that command writes,
including the rows of a run cut short (the journal a rerun resumes from).
"""

from __future__ import annotations

import yaml
from test_workflow import ROOT, _actionlint, needs_actionlint

from specdec_grader.judge import journal, reports

GRADE = ROOT / ".github" / "workflows" / "grade.yml"


@needs_actionlint
def test_the_grading_workflow_passes_actionlint():
    res = _actionlint(GRADE)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_grading_workflow_grades_in_the_sandbox_and_uploads_the_gradebook():
    flow = yaml.safe_load(GRADE.read_text())
    (job,) = flow["jobs"].values()
    runs = "\n".join(s["run"] for s in job["steps"] if "run" in s)
    assert "apt-get install -y -qq bubblewrap" in runs
    (grade,) = [s for s in job["steps"] if "specdec-grader " in s.get("run", "")]
    assert "--sandbox off" not in grade["run"] and "--out grades.csv" in grade["run"]
    (upload,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload")]
    assert upload["if"] == "always()"  # the rows graded before a failure or a cut-off too
    paths = set(upload["with"]["path"].split())
    out = "grades.csv"
    want = {out, reports.checks_csv_path(out).name, journal.journal_path(out).name}
    assert want | {"grades.xml"} == paths
