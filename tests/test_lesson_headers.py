"""Every lesson is framed the same way (DESIGN: "every lesson opens with prerequisites, time,
what you build and its exercise, and ends with common mistakes and further reading").

Checked on the notebooks' markdown: the opening cell carries the four labels, the exercise
it names exists, and the last markdown cell (after the last code cell) carries both closing
paragraphs, each with text after its label.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("*.ipynb"))


def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _text(cell) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_a_lesson_opens_with_prerequisites_time_what_you_build_and_its_exercise(path):
    first = _cells(path)[0]
    assert first["cell_type"] == "markdown", f"{path.name}: the first cell is not its header"
    head = _text(first)
    assert re.match(r"# (Lesson \d+b? |Appendix [A-Z] )— \S", head), f"{path.name}: title"
    assert re.search(r"\*\*Prerequisites:\*\* \S", head), f"{path.name}: no prerequisites"
    assert re.search(r"\*\*Time:\*\* about \d+\s+minutes", head), f"{path.name}: no time"
    exercise = re.search(r"\*\*Exercises?:\*\*\s+(\S.*?)(?:\n\n|$)", head, re.S)
    assert exercise, f"{path.name}: no exercise line (say 'none' when there is none)"
    named = re.findall(r"`(?:\.\./)?(exercises/[\w.]+\.ipynb)`", exercise.group(1))
    assert named or re.match(r"none\b", exercise.group(1)), f"{path.name}: {exercise.group(1)}"
    for nb in named:
        assert (ROOT / nb).exists(), f"{path.name} names {nb}, which does not exist"
    # What you build: a numbered list of at least three steps after "You will" (or "In this
    # lesson you will", or a "What you build:" paragraph).
    build = re.search(r"(?:[Yy]ou will\b|\*\*What you build:\*\*)(.*)", head, re.S)
    assert build, f"{path.name}: no 'You will' list or 'What you build' paragraph"
    steps = re.findall(r"^\s*\d\. \S", build.group(1), re.M)
    assert len(steps) >= 3 or "**What you build:**" in head, f"{path.name}: {len(steps)} steps"


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_a_lesson_ends_with_common_mistakes_and_further_reading(path):
    cells = _cells(path)
    last_code = max(i for i, c in enumerate(cells) if c["cell_type"] == "code")
    closing = [c for c in cells[last_code + 1 :] if c["cell_type"] == "markdown"]
    assert closing, f"{path.name}: nothing after its last code cell"
    tail = _text(closing[-1])
    for label in ("Common mistakes", "Further reading"):
        m = re.search(rf"(?:\*\*{label}\.\*\*|## {label}\n)\s*(\S[^\n]*)", tail)
        assert m, f"{path.name}: its last cell has no '{label}'"
        assert len(m.group(1)) > 10, f"{path.name}: '{label}' has no text after it"


def test_lessons_keep_code_cells_short_and_lesson_04_under_2500_words():
    # The teaching pass's bars: no code cell over 40 lines outside appendix A (a longer one
    # is split where its steps split), and lesson 04, the core, under 2,500 words of
    # markdown (whitespace-separated, formulas included).
    for path in LESSONS:
        if path.name.startswith("appendix"):
            continue
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            lines = "".join(cell["source"]).splitlines()
            assert cell["cell_type"] != "code" or len(lines) <= 40, f"{path.name} cell {i}"
    cells = json.loads((ROOT / "lessons" / "04_speculative_decoding.ipynb").read_text())["cells"]
    words = sum(
        len(re.findall(r"\S+", "".join(c["source"]))) for c in cells if c["cell_type"] == "markdown"
    )
    assert words < 2500, words
