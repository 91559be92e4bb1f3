"""Committed notebooks must be executed top to bottom, so strict nbval compares every cell."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(
    p for d in ("lessons", "exercises", "solutions") for p in (ROOT / d).glob("*.ipynb")
)


def test_there_are_notebooks():
    assert any(p.parent.name == "lessons" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_executed_in_order_without_errors(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c.get("execution_count") for c in code]
    never = [i for i, c in enumerate(counts) if c is None]
    assert not never, f"{path.name}: code cells {never} were never executed; run it top to bottom"
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: execution counts {counts} are not 1, 2, 3, ...; restart the kernel and "
        "run all cells (python tools/nb.py execute ...)"
    )
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: committed with error output {errors[0].get('ename')}"
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3"
