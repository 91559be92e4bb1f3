"""The code is formatted and linted with ruff (settings in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATHS = ["specdec_course", "specdec_grader", "tests", "tools", "data/prepare.py"]


def _ruff(*args):
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).exists():
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    return subprocess.run([exe, *args, *PATHS], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_is_clean():
    r = _ruff("check")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_is_applied():
    r = _ruff("format", "--check")
    assert r.returncode == 0, (
        "run `ruff format specdec_course specdec_grader tests tools`:\n" + r.stdout
    )
