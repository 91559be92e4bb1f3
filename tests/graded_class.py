"""One graded class for the grading tests, graded once per test session.

``tests/test_grading_batch.py``, ``tests/test_grading_attacks.py`` and
``tests/test_judge_sandbox.py`` each check one real ``specdec-grader`` run (sandboxed
kernels, two workers, a 3000 MiB cap, a fixed ``--seed``). Each graded a class of its own,
three runs of a minute and a half to three minutes on two cores; their submissions are now
merged into one class (the file names never collide) and graded by one run, whose results
every one of those files reads. Each file keeps its own assertions on its own submissions;
the checks that a run covers every submission cover the whole class.

Each part (a test module in :data:`PARTS`) has ``submissions(folder, out)``, which writes its
notebooks into the class's folder and returns what its tests need to know (JSON data), and
may have ``after_grading(out)``, called as soon as the grader returns, in the order of
:data:`PARTS`.

Under pytest-xdist, ``tests/conftest.py`` schedules the files of :data:`PARTS` as one work
unit, so one worker grades the class while the other runs the rest of the suite. The workers
share the parent of their base temporary folders, and the class is graded there under an
``fcntl`` lock, by whichever worker asks first (should two ever ask, the second waits on the
lock and reads the results from disk).
"""

from __future__ import annotations

import contextlib
import copy
import csv
import fcntl
import hashlib
import importlib
import io
import json
import os
import time
from pathlib import Path

from nbformat.v4 import new_notebook

from specdec_grader.judge import sandbox

# The attacks first: its hook looks for processes that outlive the grader at once.
PARTS = ("test_grading_attacks", "test_grading_batch", "test_judge_sandbox")
SEED = 7
WORKERS = 2
# A limit that a slow machine cannot turn into a false failure: the longest honest cell or
# check of the class (an ex05 check through the Triton interpreter, an ex06 training cell)
# takes a few seconds on two loaded cores (a whole honest notebook at most 10 s of the
# class's grading alone), four times under these. The endless cells of the class cost this
# much, so the limits are no higher than that margin needs: 30 and 70 s cost CI 40 s more.
CELL_TIMEOUT = 20
NOTEBOOK_TIMEOUT = 120
CELL_WALL = 40  # the class's cells that wait (sleep past it) cost this much
MEMORY_MB = 3000
# Without a cgroup, ``auto`` refuses to grade; ``weak`` grades with per-process caps.
MODE = "auto" if sandbox.CGroup.available() is not None else "weak"


def defs_only(nb, extra_after_first_def=None):
    """The setup and import cells and the answer cells (``def ...``) of a notebook, nothing
    else: its functions, without the demonstrations and inline checks between them."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    keep = [copy.deepcopy(code[0]), copy.deepcopy(code[1])]  # setup, imports
    defs = [copy.deepcopy(c) for c in code if c.source.lstrip().startswith("def ")]
    out = new_notebook(cells=keep + defs[:1] + (extra_after_first_def or []) + defs[1:])
    out.metadata = copy.deepcopy(nb.metadata)
    return out


def ex01_defs(folder: str = "solutions"):
    """ex01's notebook from ``folder`` ("solutions" or "exercises"), definitions only."""
    import nbformat

    root = Path(__file__).resolve().parent.parent
    return defs_only(nbformat.read(root / folder / "ex01_residual.ipynb", as_version=4))


def digest_folder(folder: Path) -> dict[str, str]:
    """sha256 of every regular file under ``folder``, by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def shared_dir(tmp_path_factory) -> Path:
    """A folder that every xdist worker of this session sees; this session's own otherwise."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID", "run")
        return base.parent / f"graded-class-{run}"
    return base / "graded-class"


def load(root: Path) -> dict:
    """The graded class under ``root``: graded here unless another worker has done it."""
    root.mkdir(parents=True, exist_ok=True)
    done = root / "result.json"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            result = _grade(root)
            tmp = root / "result.json.tmp"
            tmp.write_text(json.dumps(result))
            os.replace(tmp, done)
    return json.loads(done.read_text())


def _grade(root: Path) -> dict:
    from specdec_grader import cli

    folder, out = root / "submissions", root / "out"
    folder.mkdir()
    out.mkdir()
    modules = {name: importlib.import_module(name) for name in PARTS}
    parts = {name: m.submissions(folder, out) for name, m in modules.items()}
    before = digest_folder(folder)
    stdout = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(stdout):
        rc = cli.main([
            str(folder), "--out", str(out / "grades.csv"),
            "--junit", str(out / "grades.xml"), "--workers", str(WORKERS),
            "--cell-timeout", str(CELL_TIMEOUT), "--notebook-timeout", str(NOTEBOOK_TIMEOUT),
            "--cell-wall", str(CELL_WALL),
            "--memory-mb", str(MEMORY_MB), "--seed", str(SEED), "--sandbox", MODE,
        ])  # fmt: skip
    seconds = time.monotonic() - t0
    after = {
        name: m.after_grading(out) for name, m in modules.items() if hasattr(m, "after_grading")
    }
    return {
        "rc": rc, "stdout": stdout.getvalue(), "seconds": seconds, "folder": str(folder),
        "out": str(out), "before": before, "after": digest_folder(folder), "parts": parts,
        "hooks": after,
    }  # fmt: skip


def book(result: dict) -> list[dict]:
    """The gradebook's rows (``grades.csv``), in its order."""
    with open(Path(result["out"]) / "grades.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def check_rows(result: dict) -> list[dict]:
    """The per-check rows (``grades.checks.csv``)."""
    with open(Path(result["out"]) / "grades.checks.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def expected_files(result: dict) -> int:
    """How many submissions the parts wrote: the rows a run over the whole class must have."""
    return sum(part["files"] for part in result["parts"].values())
