"""The copy check (issue 54): a graded function is compared on a normalised form, after the
edits that keep a copy a copy, with winnowed k-gram fingerprints (specdec_grader.judge.fingerprint).

Calibration: three honest versions of every graded function of exercises 01-11
(``tests/data/honest/``, written independently, each differently) are flagged neither
against the course's solutions nor against each other, and every obfuscation of the
solutions in ``tests/obfuscate.py`` (renamed locals, deleted docstrings, dead code added,
independent statements reordered, all four at once) is flagged. The scores are printed by
``python tests/test_grading_fingerprint.py``.
"""

from __future__ import annotations

import itertools
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest
from obfuscate import OBFUSCATIONS

from specdec_course.paths import REPO_ROOT
from specdec_grader.judge import fingerprint as fp
from specdec_grader.judge import reports
from specdec_grader.judge.core import checks_for
from specdec_grader.judge.discovery import collect
from specdec_grader.judge.jobs import SubmissionResult

HONEST = Path(__file__).resolve().parent / "data" / "honest"
EXERCISES = [f"ex{n:02d}" for n in range(1, 12)]
SOLUTIONS = {ex: next((REPO_ROOT / "solutions").glob(f"{ex}_*.ipynb")) for ex in EXERCISES}
NAMES = fp.graded_names()
BASE = fp._starter(NAMES)


def _nb(source: str) -> str:
    return json.dumps({"cells": [{"cell_type": "code", "source": source}]})


def _graded(ex: str) -> list[str]:
    return sorted({n for spec in checks_for(ex) for n in spec.needs})


def _obfuscated(ex: str, how) -> str:
    """The solution notebook of ``ex`` with ``how`` applied to every cell that defines a
    graded function (the other cells as they are)."""
    nb = json.loads(SOLUTIONS[ex].read_text())
    changed = 0
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
        if any(f"def {n}(" in src or f"class {n}(" in src for n in _graded(ex)):
            out = how(src)
            if out and out != src:
                cell["source"] = out
                changed += 1
    return json.dumps(nb) if changed else ""


def scores() -> dict:
    """Every score the calibration looks at: ``{(kind, exercise, function, which): score}``."""
    out = {}
    for ex in EXERCISES:
        ref = fp.notebook_prints(SOLUTIONS[ex].read_text(), NAMES, BASE)
        mine = {
            p.stem[-1]: fp.notebook_prints(_nb(p.read_text()), NAMES, BASE)
            for p in sorted(HONEST.glob(f"{ex}_*.txt"))
        }
        for who, found in mine.items():
            for name in found.keys() & ref.keys():
                out["honest", ex, name, f"{who} ~ solution"] = fp.compare(found[name], ref[name])[0]
        for (a, fa), (b, fb) in itertools.combinations(mine.items(), 2):
            for name in fa.keys() & fb.keys():
                out["honest", ex, name, f"{a} ~ {b}"] = fp.compare(fa[name], fb[name])[0]
        for what, how in OBFUSCATIONS.items():
            text = _obfuscated(ex, how)
            found = fp.notebook_prints(text, NAMES, BASE) if text else {}
            for name in found.keys() & ref.keys():
                out["copy", ex, name, what] = fp.compare(found[name], ref[name])[0]
    return out


@pytest.fixture(scope="module")
def calibration():
    return scores()


def test_three_honest_versions_of_every_graded_function(calibration):
    for ex in EXERCISES:
        files = sorted(HONEST.glob(f"{ex}_*.txt"))
        assert len(files) >= 3, ex
        for path in files:
            defined = fp.notebook_prints(_nb(path.read_text()), NAMES, BASE)
            assert set(_graded(ex)) <= set(defined), (path.name, set(_graded(ex)) - set(defined))
        # ...and each is compared: with the solution, and with the two others
        for name in _graded(ex):
            pairs = [k for k in calibration if k[0] == "honest" and k[2] == name]
            assert len(pairs) >= 6, (ex, name, pairs)


def test_no_honest_solution_is_flagged(calibration):
    honest = {k: v for k, v in calibration.items() if k[0] == "honest"}
    flagged = {k: round(v, 2) for k, v in honest.items() if v >= fp.THRESHOLD}
    assert flagged == {}, flagged


@pytest.mark.parametrize("what", list(OBFUSCATIONS))
def test_every_obfuscation_of_the_solutions_is_flagged(calibration, what):
    copies = {k: v for k, v in calibration.items() if k[0] == "copy" and k[3] == what}
    assert len({k[1] for k in copies}) >= 8, sorted(copies)  # (reordering needs two statements)
    missed = {k: round(v, 2) for k, v in copies.items() if v < fp.THRESHOLD}
    assert missed == {}, missed


def test_the_normal_form_sets_aside_names_docstrings_dead_code_and_constants():
    plain = "def f(p, q):\n    r = (p - q).clamp(min=0)\n    s = r.sum(-1) * 6\n    return r / s\n"
    edited = (
        "def f(p, q):\n"
        '    """A docstring."""\n'
        "    unused = p.sum()  # nothing reads it\n"
        "    if False:\n        raise ValueError('never')\n"
        "    resid = (p - q).clamp(min=0)\n"
        "    total = resid.sum(-1) * (2 * 3)\n"
        "    while 0:\n        pass\n"
        "    return resid / total\n"
    )
    a = fp.notebook_prints(_nb(plain), ["f"])["f"]
    b = fp.notebook_prints(_nb(edited), ["f"])["f"]
    assert a.where.keys() == b.where.keys() and len(a.where) >= fp.MIN_PRINTS
    other = "def f(p, q):\n    r = (q - p).clamp(min=0)\n    s = r.sum(-1) * 6\n    return r / s\n"
    assert fp.notebook_prints(_nb(other), ["f"])["f"].where.keys() != a.where.keys()


def test_the_starter_code_and_tiny_functions_are_never_flagged():
    stub = (REPO_ROOT / "exercises" / "ex01_residual.ipynb").read_text()
    found = fp.notebook_prints(stub, NAMES, BASE)
    assert found and all(len(p.where) < fp.MIN_PRINTS for p in found.values())
    assert all(fp.compare(p, p)[0] == 0.0 for p in found.values())


def test_a_notebook_built_to_break_the_check_is_skipped_not_fatal():
    deep = "def residual_distribution(p, q):\n    return " + "(" * 190 + "p" + ")" * 190 + "\n"
    wide = "def rollback(a, b, c):\n" + "".join(f"    x{i} = a + {i}\n" for i in range(300))
    found = fp.notebook_prints(_nb(deep + wide + "x = (" * 3), NAMES)  # the last cell is broken
    assert found == {}  # (a syntax error: nothing read, nothing raised)
    found = fp.notebook_prints(_nb(deep + wide), NAMES)
    assert set(found) <= {"residual_distribution", "rollback"}


def _notebook_with(ex: str, source: str) -> nbformat.NotebookNode:
    nb = nbformat.read(SOLUTIONS[ex], as_version=4)
    setup = [c for c in nb.cells if c.cell_type == "code"][:2]
    out = nbformat.v4.new_notebook(cells=[*setup, nbformat.v4.new_code_cell(source)])
    out.metadata = nb.metadata
    return out


def test_the_batch_grader_flags_a_disguised_copy_with_the_lines_that_match(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    renamed = nbformat.reads(_obfuscated("ex01", OBFUSCATIONS["all four"]), as_version=4)
    nbformat.write(renamed, subs / "mallory_ex01.ipynb")
    honest = (HONEST / "ex01_a.txt").read_text()
    nbformat.write(_notebook_with("ex01", honest), subs / "alice_ex01.ipynb")
    nbformat.write(
        _notebook_with("ex01", (HONEST / "ex01_b.txt").read_text()), subs / "bob_ex01.ipynb"
    )
    # Eve copies Alice's residual_distribution with its names changed.
    eve = honest.replace("diff", "d").replace("mass", "m").replace("safe", "den")
    nbformat.write(_notebook_with("ex01", eve), subs / "eve_ex01.ipynb")
    got = {Path(s.path).name: s.flags for s in collect([subs], [REPO_ROOT / "solutions"])}
    mallory = "; ".join(got["mallory_ex01.ipynb"])
    for name in _graded("ex01"):
        assert f"ex01_residual.ipynb's {name} (" in mallory, mallory
    assert "here code cell " in mallory and "there code cell " in mallory
    assert got["bob_ex01.ipynb"] == []
    assert any("eve_ex01.ipynb's residual_distribution" in f for f in got["alice_ex01.ipynb"])
    assert any("alice_ex01.ipynb's residual_distribution" in f for f in got["eve_ex01.ipynb"])
    assert not any("ex01_residual.ipynb" in f for f in got["alice_ex01.ipynb"])


def test_flags_reach_the_gradebook_and_the_junit_report(tmp_path):
    flag = "a near-copy of solutions/ex01_residual.ipynb's residual_distribution (100% ...)"
    res = SubmissionResult("s_ex01.ipynb", "ex01", flags=[flag], seed=1)
    reports.write_csv([res], tmp_path / "g.csv")
    assert flag in (tmp_path / "g.csv").read_text()
    reports.write_junit([res], tmp_path / "g.xml")
    props = ET.parse(tmp_path / "g.xml").getroot().find("testsuite/properties")
    assert [p.get("value") for p in props if p.get("name") == "flag"] == [flag]


if __name__ == "__main__":
    for key, value in sorted(scores().items()):
        print(f"{value:5.2f}  {' / '.join(key)}")
