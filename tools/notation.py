"""The course's notation table has one source, the README's; lesson 02 shows a copy.

    python tools/notation.py            # write the README's table into lesson 02's cell
    python tools/notation.py --check    # exit 1 if the two differ (tests/test_notation.py)

The table is the block of ``|`` lines after the README's "**Notation.**" paragraph; lesson
02's copy is the block of ``|`` lines in its markdown cell headed "### Notation". Only that
cell's table changes; the notebook's outputs are left as they are.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LESSON = ROOT / "lessons" / "02_acceptance_rate.ipynb"


def _table(lines: list[str], after: int) -> tuple[int, int]:
    """[start, end) of the first run of table lines at or after line ``after``."""
    start = next(i for i in range(after, len(lines)) if lines[i].startswith("|"))
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return start, end


def readme_table() -> list[str]:
    lines = README.read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("**Notation.**"))
    start, end = _table(lines, head)
    return lines[start:end]


def _lesson_cell(nb) -> nbformat.NotebookNode:
    cells = [c for c in nb.cells if c.cell_type == "markdown" and "### Notation" in c.source]
    if len(cells) != 1:
        raise SystemExit(f"{LESSON.name}: expected one markdown cell with '### Notation'")
    return cells[0]


def lesson_table() -> list[str]:
    lines = _lesson_cell(nbformat.read(LESSON, as_version=4)).source.splitlines()
    start, end = _table(lines, 0)
    return lines[start:end]


def write() -> None:
    nb = nbformat.read(LESSON, as_version=4)
    cell = _lesson_cell(nb)
    lines = cell.source.splitlines()
    start, end = _table(lines, 0)
    cell.source = "\n".join(lines[:start] + readme_table() + lines[end:])
    nbformat.write(nb, LESSON)


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        same = readme_table() == lesson_table()
        if not same:
            print(
                f"{LESSON.name}'s notation table differs from the README's: run "
                "python tools/notation.py"
            )
        return 0 if same else 1
    if argv:
        raise SystemExit(__doc__)
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
