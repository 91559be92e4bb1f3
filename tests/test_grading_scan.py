"""The copy scan is bounded and says what it cannot read (issue 43).

A cell the scan cannot parse is flagged, never skipped in silence: a syntax error is only
flagged (Python cannot run it either), a cell nested too deeply for the scan (which a kernel
whose recursion limit was raised still runs) scores 0 as tampering. The scan runs in a child
process with its own CPU and memory limits, and a notebook with more code than the grader
reads is refused with the reason.
"""

from __future__ import annotations

import nbformat
import pytest
from graded_class import MODE, ex01_defs
from nbformat.v4 import new_code_cell

from specdec_grader.judge import batch, scan_bounds
from specdec_grader.judge.core import public_implementations

# The red team's blinding cell: the kernel's recursion limit raised, then an expression
# 4000 deep that the judge's parser cannot read, then what it hid.
BLIND = (
    "import sys\nsys.setrecursionlimit(100000)\n"
    "_x = 0" + " + 1" * 4000 + "\n"
    "import gc\nobjs = gc.get_objects()\n"
)


def test_a_syntax_error_is_flagged_and_a_cell_too_deep_to_read_is_tampering():
    found = scan_bounds.bounded_scan(["def f(:\n    pass", BLIND], {"f"})
    assert "code cell 1 does not parse (a syntax error): the copy scan skipped it" in found.flags
    assert found.tampering == ["code cell 2 is nested too deeply for the copy scan to read"]


def test_the_scan_runs_within_its_own_cpu_limit():
    # An attribute chain long enough to take the scan's CPU (or crash its parser): the child
    # is stopped, the judge goes on, and the notebook is said to be unreadable by the scan.
    chain = "x = a" + ".b" * 300_000
    found = scan_bounds.bounded_scan([chain], set(), cpu_s=1)
    assert found.tampering and "could not read within its limits" in found.tampering[0]


def test_an_honest_notebook_is_read_whole():
    nb = ex01_defs("solutions")
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    found = scan_bounds.bounded_scan(
        cells, {"residual_distribution"}, public_implementations("ex01")
    )
    assert (found.flags, found.tampering, found.forwarders) == ([], [], {})


@pytest.mark.skipif(MODE != "auto", reason="needs the sandbox with a cgroup")
def test_blinding_the_scan_and_an_oversized_notebook_earn_nothing(tmp_path):
    blind = ex01_defs("solutions")
    blind.cells.insert(2, new_code_cell(BLIND))
    nbformat.write(blind, tmp_path / "ex01_blind.ipynb")
    big = ex01_defs("solutions")
    big.cells.append(new_code_cell("DATA = " + repr("x" * (scan_bounds.MAX_CODE_CHARS + 10))))
    nbformat.write(big, tmp_path / "ex01_big.ipynb")
    run = batch.grade(
        [tmp_path], workers=1, seed=7, memory_mb=3000, cell_timeout=30,
        notebook_timeout=120, sandbox_mode=MODE, progress=False,
    )  # fmt: skip
    by = {r.file.rsplit("/", 1)[-1]: r for r in run}
    b = by["ex01_blind.ipynb"]
    assert b.points == 0 and "nested too deeply" in "; ".join(b.flags)
    g = by["ex01_big.ipynb"]
    assert g.points == 0 and {c.status for c in g.checks} == {"unreadable"}
    assert "over the grader's limit" in g.checks[0].message
