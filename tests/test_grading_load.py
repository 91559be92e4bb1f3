"""Grading does not depend on how busy the machine is (issues 41 and 43).

Each kernel's cgroup caps it at one core and counts its CPU time; its time limits count
that CPU time, not wall time (with a wall backstop for code that waits); processes a
submission detaches with ``setsid()`` stay in its cgroup; a check that runs out of time is
re-run alone before it is scored, and the gradebook says so.

Each test starts real sandboxed kernels (a few seconds each on two cores): only ex01, and
the definitions of its notebook only (:func:`graded_class.ex01_defs`).
"""

from __future__ import annotations

import contextlib
import csv
import subprocess
import sys
import time

import nbformat
import pytest
from graded_class import MODE, ex01_defs
from nbformat.v4 import new_code_cell

from specdec_grader.judge import batch, reports, sandbox
from specdec_grader.judge.cgroup import CGroup
from specdec_grader.judge.session import Session

pytestmark = pytest.mark.skipif(
    CGroup.available() is None, reason="no cgroup can be created here (needs root, cgroups)"
)


@contextlib.contextmanager
def cpu_hog(n: int = 2):
    """``n`` busy Python loops beside the grader (one per core of a 2-core machine)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _session(tmp_path) -> Session:
    return Session(
        sandbox.plan(MODE),
        tag=f"specdec-loadtest-{time.monotonic_ns()}",
        memory_mb=3000,
        limits={"as": 3000 * 2**20, "cpu": 600, "nproc": 256, "fsize": 2**24, "nofile": 256},
        notebook_name="load.ipynb",
        notebook_text="",
    )


def test_the_kernel_is_held_to_one_core_with_its_setsid_children(tmp_path):
    s = _session(tmp_path)
    s.start()
    try:
        assert s.proc.cgroup is not None and s.proc.cgroup.cpu_capped
        # (The kernel kills what a cell left running once it ends: they spin during it.)
        spawn = (
            "import os, time\n"
            "for _ in range(6):\n"
            "    if os.fork() == 0:\n"
            "        os.setsid()\n"
            "        while True: pass\n"
            "time.sleep(3)\n"
        )
        cpu0, t0 = s.cpu_seconds(), time.monotonic()
        assert s.run_cell(spawn, 10.0)["ok"]
        cpu, wall = s.cpu_seconds() - cpu0, time.monotonic() - t0
        # Six detached spinners on a 2-core machine: one core's worth at most, not two.
        assert cpu > 0, (cpu, wall)  # they ran
        assert cpu < 1.1 * wall, (cpu, wall)  # load-independent: a cap bounds CPU by wall time
    finally:
        s.close()


def test_cells_are_limited_in_cpu_seconds_with_a_wall_backstop(tmp_path):
    s = _session(tmp_path)
    s.start()
    try:
        spin = s.run_cell("while True: pass", 2.0)
        assert spin["timeout"]
        # Waiting uses no CPU: a sleep within the wall limit finishes; only the wall backstop
        # stops one past it.
        t0 = time.monotonic()
        slept = s.run_cell("import time; time.sleep(3); x = 1", 1.0, wall=8.0)
        assert slept["ok"] and time.monotonic() - t0 >= 3.0  # load-independent: a sleep's floor
        stuck = s.run_cell("import time; time.sleep(60)", 1.0, wall=2.0)
        assert stuck["timeout"]  # stopped by the wall backstop: it uses no CPU
    finally:
        s.close()


def test_solved_notebooks_keep_full_marks_beside_a_cpu_hog(tmp_path):
    # A limit of 20 s of CPU per check: ex01's slowest check takes about 5 s of CPU, which
    # two busy loops on two cores (and whatever else runs here) stretch past 20 s of wall
    # time; its wall backstop is 50 s.
    nbformat.write(ex01_defs("solutions"), tmp_path / "ex01_solved.ipynb")
    nbformat.write(ex01_defs("exercises"), tmp_path / "ex01_stub.ipynb")
    with cpu_hog(2):
        run = batch.grade(
            [tmp_path],
            workers=2,
            seed=7,
            memory_mb=3000,
            cell_timeout=20,
            notebook_timeout=120,
            sandbox_mode=MODE,
            progress=False,
        )
    by = {r.file.rsplit("/", 1)[-1]: r for r in run}
    solved, stub = by["ex01_solved.ipynb"], by["ex01_stub.ipynb"]
    assert (solved.points, solved.status) == (solved.max_points, "passed"), solved.checks
    assert not solved.time_limited
    assert all(f.startswith("a near-copy of ") for f in solved.flags)  # it is the solution
    assert stub.points == 0 and {c.status for c in stub.checks} == {"not attempted"}


def test_a_check_that_runs_out_of_time_is_rerun_alone_and_marked(tmp_path):
    nb = ex01_defs("exercises")  # the other checks: not attempted, at once
    endless = "def residual_distribution(p, q):\n    while True:\n        pass\n"
    nb.cells.append(new_code_cell(endless))
    nbformat.write(nb, tmp_path / "ex01_endless.ipynb")
    run = batch.grade(
        [tmp_path],
        workers=1,
        seed=7,
        memory_mb=3000,
        cell_timeout=3,
        notebook_timeout=60,
        sandbox_mode=MODE,
        progress=False,
    )
    (r,) = run
    check = next(c for c in r.checks if c.id == "ex01.residual_distribution")
    assert check.status == "timeout" and "CPU time" in check.message
    assert r.time_limited == [
        "ex01.residual_distribution: timed out, re-run alone: timed out again"
    ]
    assert {c.status for c in r.checks if c is not check} == {"not attempted"}
    reports.write_csv(run, tmp_path / "grades.csv")
    reports.write_junit(run, tmp_path / "grades.xml")
    (row,) = csv.DictReader(open(tmp_path / "grades.csv", encoding="utf-8"))
    assert row["time_limited"] == r.time_limited[0]
    assert 'name="time_limited"' in (tmp_path / "grades.xml").read_text()
