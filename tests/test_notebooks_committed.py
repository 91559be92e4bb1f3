"""Committed notebooks must be executed top to bottom, so strict nbval compares every cell."""

import json
import re
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


# A number in scientific notation below 1e-6 (3.3e-16, 2.4e-07) is rounding noise: its digits
# depend on the CPU's SIMD width and summation order, and strict nbval on another machine
# fails on it. Outside ignored cells, such a number may only be printed as a bound
# ("< 1e-12", "below 5.0e-11"), which every machine reproduces.
_SCI = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[eE]([-+]?\d+)\b")
_BOUND = re.compile(r"(<|≤|<=|below|under)\s*$")


def _noise_numbers(text: str) -> list[str]:
    found = []
    for m in _SCI.finditer(text):
        value = float(m.group(1)) * 10.0 ** int(m.group(2))
        if 0 < value < 1e-6 and not _BOUND.search(text[max(0, m.start() - 8) : m.start()]):
            found.append(m.group(0))
    return found


def _output_text(cell) -> str:
    parts = []
    for o in cell.get("outputs", []):
        for t in (o.get("text", ""), o.get("data", {}).get("text/plain", "")):
            parts.append("".join(t) if isinstance(t, list) else t)
    return "".join(parts)


def test_noise_rule_flags_noise_and_allows_bounds():
    assert _noise_numbers("largest difference 3.3e-16, then 2.4e-07") == ["3.3e-16", "2.4e-07"]
    assert _noise_numbers("rate < 5.0e-11; error below 1e-12; 1.7e-06; c = 0.31; x1e-9") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_prints_no_rounding_noise(path):
    nb = json.loads(path.read_text())
    bad = []
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        if "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
            continue
        bad += [f"code cell {i}: {n}" for n in _noise_numbers(_output_text(cell))]
    assert not bad, (
        f"{path.name} prints values below 1e-6 that no other CPU reproduces ({bad}); print the "
        "bound they meet instead (f'< 1e-12'), or stats.format_rate for a probability"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_nbval_is_told_in_cell_tags_not_in_the_code_a_learner_reads(path):
    nb = json.loads(path.read_text())
    marked = [
        i
        for i, c in enumerate(x for x in nb["cells"] if x["cell_type"] == "code")
        if "NBVAL" in "".join(c["source"])
    ]
    assert not marked, (
        f"{path.name}: code cells {marked} carry an nbval comment; give the cell the metadata tag "
        "nbval-ignore-output instead (tools/nb.py: '# %% tags=[\"nbval-ignore-output\"]')"
    )
