"""The one-way house: layered imports (import-linter contract in pyproject.toml), small rooms."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specdec_course"
GRADER = ROOT / "specdec_grader"  # the grader, a package of its own that imports the course
PACKAGES = (PACKAGE, GRADER)
HARD_LIMIT = 600  # lines; the house rule is "about 500: split a module along its own sections"


def _lint_imports(cwd: Path, pythonpath: Path):
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.fail("import-linter is not installed: pip install -e '.[test]'")
    env = {"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )


def test_imports_follow_the_layers():
    r = _lint_imports(ROOT, ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def _lint_with(tmp_path, module: str, line: str):
    """The linter's verdict on a copy of the packages with ``line`` added to ``module``."""
    for package in PACKAGES:
        shutil.copytree(package, tmp_path / package.name, ignore=shutil.ignore_patterns("*.pyc"))
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    return _lint_imports(tmp_path, tmp_path)


def test_an_upward_import_breaks_the_contract(tmp_path):
    # The contract has teeth: the same package with one arrow upward (model -> cli) fails.
    r = _lint_with(tmp_path, "specdec_course/model/gpt.py", "from ..cli import main")
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout + r.stderr
    assert "specdec_course.model.gpt -> specdec_course.cli" in r.stdout


def test_the_course_importing_the_grader_breaks_the_contract(tmp_path):
    # The grader imports the course, never the reverse: the course's `grade` command importing
    # the grader (the tempting shortcut) fails the linter.
    r = _lint_with(tmp_path, "specdec_course/cli/grade.py", "import specdec_grader.cli")
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout + r.stderr
    assert "The course never imports the grader" in r.stdout
    assert "specdec_course.cli.grade -> specdec_grader.cli" in r.stdout


def test_no_module_outgrows_the_house_rule():
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for package in PACKAGES
        for p in package.rglob("*.py")
    }
    big = {p: n for p, n in sizes.items() if n > HARD_LIMIT}
    assert not big, f"split these along their own sections (limit ~500, hard {HARD_LIMIT}): {big}"


def test_only_cli_parses_arguments():
    # The course's commands are in specdec_course/cli/, the grader's in specdec_grader/cli.py.
    offenders = [
        str(p.relative_to(ROOT))
        for package in PACKAGES
        for p in package.rglob("*.py")
        if "cli" not in p.relative_to(package).with_suffix("").parts
        and ("import argparse" in p.read_text() or "sys.argv" in p.read_text())
    ]
    assert not offenders, f"argument parsing belongs in specdec_course/cli/: {offenders}"
    assert "import argparse" in (GRADER / "cli.py").read_text()  # the rule looks where it should
