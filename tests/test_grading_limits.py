"""Limits the kernel enforces (issue 54): a sleep bomb and a memory bomb among honest notebooks.

One small batch, graded once: ex01's definitions solved and untouched (the honest ones), a
notebook whose cell sleeps for an hour, one whose cells each sleep under the cell's limit
but together past the submission's, and one whose cell allocates past the memory cap. Each
bomb scores 0 with a message that names the limit it passed, stops at once (its worker
grades the next submission), and the honest notebooks get what they get alone.
"""

from __future__ import annotations

from pathlib import Path

import graded_class
import nbformat
import pytest
from graded_class import ex01_defs
from nbformat.v4 import new_code_cell

from specdec_grader.judge import batch, sandbox

pytestmark = pytest.mark.skipif(
    sandbox.plan("weak").mode != "bwrap",
    reason="bubblewrap cannot run here (apt-get install bubblewrap)",
)

# The honest notebooks take 3 to 5 s alone; the slow sleeps pass the notebook's limit in
# their sixth cell, and the sleep bomb its cell's after 10 s.
CELL_WALL, NOTEBOOK_WALL, MEMORY_MB = 10, 30, 2048


def _with(cells: list[str]):
    nb = ex01_defs("solutions")
    nb.cells[3:3] = [new_code_cell(c) for c in cells]  # after setup, imports, first answer
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("limits")
    subs = {
        "honest_solved": ex01_defs("solutions"),
        "honest_untouched": ex01_defs("exercises"),
        "sleep_bomb": _with(["import time\ntime.sleep(3600)"]),
        "slow_sleeps": _with(["import time\ntime.sleep(6)"] * 16),  # 96 s, 6 s a cell
        "memory_bomb": _with(["hog = [bytearray(50 * 2**20) for _ in range(100)]  # 5 GB"]),
    }
    for name, nb in subs.items():
        nb.metadata["submission"] = name  # (no two are byte-identical)
        nbformat.write(nb, folder / f"ex01_{name}.ipynb")
    res = batch.grade(
        [folder], workers=2, cell_timeout=30, notebook_timeout=120, cell_wall=CELL_WALL,
        notebook_wall=NOTEBOOK_WALL, memory_mb=MEMORY_MB, seed=5, sandbox_mode=graded_class.MODE,
        progress=False,
    )  # fmt: skip
    return {Path(r.file).stem.removeprefix("ex01_"): r for r in res}


def test_honest_notebooks_beside_the_bombs_are_graded_as_alone(graded):
    solved, untouched = graded["honest_solved"], graded["honest_untouched"]
    assert (solved.points, solved.status, solved.limit) == (10, "passed", "")
    assert untouched.points == 0 and untouched.limit == ""
    assert {c.status for c in untouched.checks} == {"not attempted"}


@pytest.mark.parametrize(
    "name, status, named",
    [
        ("sleep_bomb", "timeout", f"code cell 4 passed the wall-clock limit of a code cell "
         f"({CELL_WALL} s, --cell-wall)"),
        ("slow_sleeps", "timeout", f"the wall-clock limit of a submission ({NOTEBOOK_WALL} s, "
         "--notebook-wall)"),
        ("memory_bomb", "error", f"code cell 4 passed the memory cap ({MEMORY_MB} MiB, "
         "--memory-mb)"),
    ],
)  # fmt: skip
def test_a_bomb_scores_zero_and_names_the_limit_it_passed(graded, name, status, named):
    r = graded[name]
    assert r.points == 0 and named in r.limit and "the exercise scores 0" in r.limit
    assert all(c.status == status and c.message == r.limit for c in r.checks)
    assert r.time_limited == []  # stopped by a limit: no check re-run alone


def test_a_bomb_frees_its_worker_at_the_limit(graded):
    # Hang guards, well below what the bombs ask for (an hour; 96 s of sleeps).
    sleep, slow = graded["sleep_bomb"].seconds, graded["slow_sleeps"].seconds
    assert sleep < CELL_WALL + 60  # load-independent: hang guard, unbounded it sleeps 3600 s
    assert slow < NOTEBOOK_WALL + 40  # load-independent: hang guard, unbounded 96 s of sleep
