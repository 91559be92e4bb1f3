"""The one-way house: layered imports (import-linter contract in pyproject.toml), small rooms."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specdec_course"
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


def test_an_upward_import_breaks_the_contract(tmp_path):
    # The contract has teeth: the same package with one arrow upward (model -> cli) fails.
    shutil.copytree(PACKAGE, tmp_path / "specdec_course", ignore=shutil.ignore_patterns("*.pyc"))
    model = tmp_path / "specdec_course" / "model" / "gpt.py"
    model.write_text(model.read_text() + "\nfrom ..cli import main  # noqa\n")
    r = _lint_imports(tmp_path, tmp_path)
    assert r.returncode != 0 and "BROKEN" in r.stdout, r.stdout + r.stderr
    assert "specdec_course.model.gpt -> specdec_course.cli" in r.stdout


def test_no_module_outgrows_the_house_rule():
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")
    }
    big = {p: n for p, n in sizes.items() if n > HARD_LIMIT}
    assert not big, f"split these along their own sections (limit ~500, hard {HARD_LIMIT}): {big}"


def test_only_cli_parses_arguments():
    offenders = [
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*.py")
        if "cli" not in p.relative_to(PACKAGE).parts
        and ("import argparse" in p.read_text() or "sys.argv" in p.read_text())
    ]
    assert not offenders, f"argument parsing belongs in specdec_course/cli/: {offenders}"
