"""The grader fails closed and loses no row (issue 59).

- Without a working sandbox, ``specdec-grader`` refuses before any notebook runs: one
  message (what is missing, the install command, ``--sandbox off``) and exit status 3.
- ``--sandbox off`` grades, and its gradebook and JUnit XML say so on every row.
- A grader killed with SIGKILL halfway through a batch of real submissions leaves every
  finished row readable; the same command run again grades only the rest, with the same
  seed, and writes the gradebook an uninterrupted run writes.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import graded_class
import nbformat
import pytest
from graded_class import ex01_defs
from nbformat.v4 import new_code_cell

from specdec_grader import cli
from specdec_grader.judge import journal, sandbox, worker


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("mode", ["auto", "require", "weak"])
def test_without_bubblewrap_grade_refuses_before_any_notebook_runs(
    mode, tmp_path, monkeypatch, capsys
):
    nbformat.write(ex01_defs("solutions"), tmp_path / "ex01_a.ipynb")
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)  # no bwrap on PATH

    def no_judge(*a, **k):
        raise AssertionError("a judge was started")

    monkeypatch.setattr(worker.Judge, "spawn", classmethod(no_judge))
    out = tmp_path / "grades.csv"
    argv = [str(tmp_path / "ex01_a.ipynb"), "--out", str(out)]
    rc = cli.main(argv + ([] if mode == "auto" else ["--sandbox", mode]))
    err = capsys.readouterr().err
    assert rc == sandbox.NO_SANDBOX_EXIT == 3
    assert err.count("\n") == 1, err  # one message
    assert "bubblewrap (bwrap) is not installed" in err
    assert "apt-get install bubblewrap" in err and "--sandbox off" in err
    assert not out.exists() and not journal.journal_path(out).exists()


def test_sandbox_off_says_so_in_every_row_and_in_the_junit_properties(tmp_path, capsys):
    (tmp_path / "ex01_broken.ipynb").write_text('{"cells": [')  # graded without a kernel
    out, xml = tmp_path / "grades.csv", tmp_path / "grades.xml"
    argv = [str(tmp_path), "--out", str(out), "--junit", str(xml), "--sandbox", "off"]
    assert cli.main(argv) == 0
    assert "NO SANDBOX" in capsys.readouterr().out
    (row,) = _rows(out)  # csv.DictReader reads it: the warning is a column
    assert row["sandbox"].startswith("NONE: graded without a sandbox (--sandbox off)")
    suite = ET.parse(xml).getroot().find("testsuite")
    assert suite.find("properties/property[@name='sandbox']").get("value") == row["sandbox"]
    assert not journal.journal_path(out).exists()  # a complete run leaves no journal


# ----------------------------------------------------------------------- kill and resume

_MODE = graded_class.MODE if sandbox.plan("weak").mode == "bwrap" else "off"


def _class(folder: Path) -> None:
    """Three real ex01 submissions (its definitions only: the cheapest exercise)."""
    solved, untouched = ex01_defs("solutions"), ex01_defs("exercises")
    raising = ex01_defs("solutions")
    raising.cells.insert(3, new_code_cell("raise RuntimeError('half done')"))
    for name, nb in (("a_solved", solved), ("b_untouched", untouched), ("c_raises", raising)):
        nbformat.write(nb, folder / f"ex01_{name}.ipynb")


def _command(folder: Path, out: Path, *extra: str) -> list[str]:
    code = "import sys; from specdec_grader import cli; sys.exit(cli.main(sys.argv[1:]))"
    return [
        sys.executable, "-c", code, str(folder), "--out", str(out), "--workers", "1",
        "--sandbox", _MODE, "--cell-timeout", "30", "--notebook-timeout", "90",
        "--memory-mb", str(graded_class.MEMORY_MB), *extra,
    ]  # fmt: skip


def _journal_rows(out: Path) -> int:
    try:
        return len(journal.journal_path(out).read_text().splitlines()) - 1
    except FileNotFoundError:
        return 0


def test_a_killed_grader_keeps_its_rows_and_the_rerun_completes_the_same_gradebook(tmp_path):
    folder, out = tmp_path / "subs", tmp_path / "grades.csv"
    folder.mkdir()
    _class(folder)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(_command(folder, out), env=env, stderr=subprocess.PIPE)
    try:
        # (No deadline of our own: pytest-timeout ends a grader that never writes a row.)
        while _journal_rows(out) < 1 and proc.poll() is None:
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
    done = _journal_rows(out)
    assert 1 <= done < 3, err.decode(errors="replace")
    # Every finished row is on disk, readable, in both CSVs; the journal holds the seed.
    # (A row's CSV lines go first and its journal line last: a kill between them leaves one
    # row more in the CSVs, which the rerun grades again.)
    kept = _rows(out)
    assert done <= len(kept) <= done + 1 and {r["exercise"] for r in kept} == {"ex01"}
    assert 3 * done <= len(_rows(out.with_name("grades.checks.csv"))) <= 3 * len(kept)
    seed = json.loads(journal.journal_path(out).read_text().splitlines()[0])["seed"]
    assert all(r["seed"] == str(seed) for r in kept)

    again = subprocess.run(_command(folder, out), env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert f"{done} of 3 submissions graded already, seed {seed}" in again.stderr
    assert not journal.journal_path(out).exists()
    whole = tmp_path / "whole.csv"
    plain = subprocess.run(
        _command(folder, whole, "--seed", str(seed)), env=env, capture_output=True, text=True
    )
    assert plain.returncode == 0, plain.stderr
    assert out.read_text() == whole.read_text()
    assert (tmp_path / "grades.checks.csv").read_text() == (
        tmp_path / "whole.checks.csv"
    ).read_text()
    points = {Path(r["file"]).stem: r["points"] for r in _rows(out)}
    assert points == {"ex01_a_solved": "10", "ex01_b_untouched": "0", "ex01_c_raises": "10"}
