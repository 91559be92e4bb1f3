"""The gradebook and the files it grades (issue 43): formula escaping after any leading
whitespace a spreadsheet trims, hard links into a solutions folder, near-copies, and a dead
``if False:`` forwarder that costs an honest notebook nothing."""

from __future__ import annotations

import csv
import os

import nbformat
import pytest
from graded_class import MODE, ex01_defs
from nbformat.v4 import new_code_cell

from specdec_grader.judge import batch, copying, discovery, reports
from specdec_grader.judge.jobs import SubmissionResult

TRIMMED = [" ", "\u00a0", "\u3000", "\u2003", "\u202f", "\u2007", " \u00a0\u3000"]
FORMULAS = ["=", "+", "-", "@", "\uff1d", "\uff0b", "\uff0d", "\uff20", "\ufe66", "\u2212"]


@pytest.mark.parametrize("lead", ["", *TRIMMED])
@pytest.mark.parametrize("sign", FORMULAS)
def test_every_formula_after_trimmed_whitespace_is_neutralised(tmp_path, lead, sign):
    text = f"{lead}{sign}HYPERLINK(1)"
    res = SubmissionResult(text, "ex01", notes=[text], flags=[text], seed=5)
    reports.write_csv([res], tmp_path / "g.csv")
    (row,) = csv.DictReader(open(tmp_path / "g.csv", encoding="utf-8"))
    assert row["file"] == "'" + text and row["flags"] == "'" + text


def test_plain_text_and_numbers_are_left_alone(tmp_path):
    assert reports._cell(" ok") == " ok" and reports._cell("ex01") == "ex01"


def test_code_shape_ignores_whitespace_and_names_but_not_code():
    a = '{"cells": [{"cell_type": "code", "source": "def f(p, q):\\n    return p - q\\n"}]}'
    b = '{"cells": [{"cell_type": "code", "source": "def g(a,b):\\n        return a-b"}]}'
    c = '{"cells": [{"cell_type": "code", "source": "def f(p, q):\\n    return p + q\\n"}]}'
    assert discovery.code_shape(a) == discovery.code_shape(b) != discovery.code_shape(c)


def test_a_dead_forwarder_is_no_forwarder():
    honest = (
        "import specdec_course.sampling as sampling\n"
        "def residual_distribution(p, q):\n"
        "    r = (p - q).clamp(min=0)\n"
        "    return r / r.sum()\n"
        "if False:  # what the lesson showed\n"
        "    residual_distribution = sampling.residual_distribution\n"
    )
    found = copying.scan([honest], {"residual_distribution"})
    assert found.forwarders == {} and found.flags == []
    live = honest.replace("if False:", "if True:")
    assert copying.scan([live], {"residual_distribution"}).forwarders


@pytest.mark.skipif(MODE != "auto", reason="needs the sandbox with a cgroup")
def test_hard_links_near_copies_and_formula_names_through_the_grader(tmp_path, monkeypatch):
    sols, subs = tmp_path / "solutions", tmp_path / "subs"
    sols.mkdir()
    subs.mkdir()
    nbformat.write(ex01_defs("solutions"), sols / "ex01_residual.ipynb")
    os.link(sols / "ex01_residual.ipynb", subs / "ex01_linked.ipynb")
    stub = ex01_defs("exercises")
    nbformat.write(stub, subs / "\u3000=cmd ex01_a.ipynb")
    near = ex01_defs("exercises")
    near.cells[-1].source = near.cells[-1].source.replace("\n", "\n\n", 1) + "  "
    near.metadata["edited"] = True
    nbformat.write(near, subs / "ex01_b.ipynb")
    honest = ex01_defs("solutions")
    honest.cells.append(
        new_code_cell(
            "import specdec_course.sampling as sampling\n"
            "if False:\n    residual_distribution = sampling.residual_distribution\n"
        )
    )
    nbformat.write(honest, subs / "ex01_dead_forwarder.ipynb")
    monkeypatch.chdir(subs)  # the names as the gradebook shows them: "\u3000=cmd ex01_a..."
    run = batch.grade(
        ["."], workers=2, seed=7, memory_mb=3000, cell_timeout=30,
        notebook_timeout=120, sandbox_mode=MODE, progress=False, solutions=[sols],
    )  # fmt: skip
    by = {r.file.rsplit("/", 1)[-1]: r for r in run}
    linked = by["ex01_linked.ipynb"]
    assert linked.points == 0 and {c.status for c in linked.checks} == {"unreadable"}
    assert "hard link" in linked.checks[0].message and "hard link" in "; ".join(linked.flags)
    a, b = by["\u3000=cmd ex01_a.ipynb"], by["ex01_b.ipynb"]
    assert "near-copy of" in "; ".join(a.flags) and "near-copy of" in "; ".join(b.flags)
    dead = by["ex01_dead_forwarder.ipynb"]
    assert (dead.points, dead.max_points) == (10, 10)
    # No forwarder flag for the dead branch; the solution's functions are near-copies.
    assert dead.flags and all(f.startswith("a near-copy of ") for f in dead.flags)
    reports.write_csv(run, tmp_path / "g.csv")
    files = [r["file"] for r in csv.DictReader(open(tmp_path / "g.csv", encoding="utf-8"))]
    assert all(not f.lstrip(" \u00a0\u3000").startswith("=") for f in files)
    assert any(f.startswith("'") and "=cmd" in f for f in files)
