"""Estimate how long each lesson takes to work through, and compare it with the time the
lesson states.

    python tools/lesson_time.py [NB.ipynb ...]     # default: every lessons/*.ipynb

The estimate is the README's rule: reading the markdown at 130 words a minute, working
through the code at 4 non-blank lines a minute (reading and running it), and reading what the
committed outputs print at 10 non-blank lines a minute (a row of a table, a verdict; figures
and widgets are not counted), plus the run time: what executing the whole notebook took here
(``tools/lesson_run_seconds.json``, written by ``tools/nb.py execute``). The stated time is the
first cell's "**Time:** about N minutes". A lesson passes when its stated time is within 20%
of the estimate (tests/test_lesson_time.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

WORDS_PER_MINUTE = 130
CODE_LINES_PER_MINUTE = 4
OUTPUT_LINES_PER_MINUTE = 10
TOLERANCE = 0.20
LESSONS = Path(__file__).resolve().parent.parent / "lessons"
RUN_RECORD = Path(__file__).resolve().parent / "lesson_run_seconds.json"
_STATED = re.compile(r"\*\*Time:\*\*\s+about\s+(\d+)\s+minutes")


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def counts(path: str | Path) -> tuple[int, int]:
    """(words of markdown, non-blank lines of code) in the notebook at ``path``."""
    cells = json.loads(Path(path).read_text())["cells"]
    words = sum(len(_source(c).split()) for c in cells if c["cell_type"] == "markdown")
    lines = sum(
        1 for c in cells if c["cell_type"] == "code" for l in _source(c).splitlines() if l.strip()
    )
    return words, lines


def _printed(output: dict) -> str:
    """The text a reader reads in one output: a stream, or a result shown as markdown or text
    (not a figure's or a widget's placeholder text)."""
    if output.get("output_type") == "stream":
        return _source({"source": output.get("text", "")})
    data = output.get("data", {})
    if any(k.startswith("image/") or "widget" in k for k in data):
        return ""
    return _source({"source": data.get("text/markdown") or data.get("text/plain", "")})


def output_lines(path: str | Path) -> int:
    """Non-blank lines the committed code cells of the notebook at ``path`` print."""
    cells = json.loads(Path(path).read_text())["cells"]
    return sum(
        1
        for c in cells
        if c["cell_type"] == "code"
        for o in c.get("outputs", [])
        for l in _printed(o).splitlines()
        if l.strip()
    )


def reading_minutes(path: str | Path) -> float:
    """Minutes to read the markdown, work through the code and read what it prints, for the
    notebook at ``path``."""
    words, lines = counts(path)
    return (
        words / WORDS_PER_MINUTE
        + lines / CODE_LINES_PER_MINUTE
        + output_lines(path) / OUTPUT_LINES_PER_MINUTE
    )


def run_minutes(path: str | Path) -> float:
    """Minutes that running the whole notebook took when ``tools/nb.py execute`` last ran it
    (``tools/lesson_run_seconds.json``); KeyError for a lesson never executed that way."""
    record = json.loads(RUN_RECORD.read_text())["seconds"]
    name = Path(path).name
    if name not in record:
        raise KeyError(f"{name} has no run time: run `python tools/nb.py execute {path}`")
    return record[name] / 60


def estimate_minutes(path: str | Path) -> float:
    """The reading estimate plus the run time, for the notebook at ``path``."""
    return reading_minutes(path) + run_minutes(path)


def stated_minutes(path: str | Path) -> int:
    """The "**Time:** about N minutes" of the notebook's first cell; ValueError without one."""
    first = _source(json.loads(Path(path).read_text())["cells"][0])
    m = _STATED.search(" ".join(first.split()))
    if m is None:
        raise ValueError(f"{path}: the first cell states no '**Time:** about N minutes'")
    return int(m.group(1))


def within_tolerance(stated: float, estimate: float, tolerance: float = TOLERANCE) -> bool:
    """Whether the stated time is within ``tolerance`` (a fraction) of the estimate."""
    return abs(stated - estimate) <= tolerance * estimate


def main(paths: list[str]) -> int:
    paths = paths or sorted(str(p) for p in LESSONS.glob("*.ipynb"))
    bad = 0
    print(f"{'lesson':40s} words  code  printed  reading  run  estimate  stated  within 20%")
    for p in paths:
        words, lines = counts(p)
        est, stated = estimate_minutes(p), stated_minutes(p)
        ok = within_tolerance(stated, est)
        bad += not ok
        verdict = "yes" if ok else "NO"
        print(
            f"{Path(p).name:40s} {words:5d} {lines:5d} {output_lines(p):8d} "
            f"{reading_minutes(p):6.0f} {run_minutes(p):5.1f} {est:7.0f} min "
            f"{stated:4d} min  {verdict}"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
