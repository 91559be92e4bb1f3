"""Every reference to a lesson resolves: "lesson 09b", "lessons 08 and 09", "appendix A" and
every `lessons/NAME.ipynb` path written in the lessons, the exercises, their solutions and
the README names a notebook that exists. Lessons are numbered by their file names' prefixes
(``09_``, ``09b_``, ``appendix_a_``), so a split or a renumbering that leaves a stale number
behind fails here."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("*.ipynb"))
NUMBERS = {p.name.split("_")[0] for p in LESSONS if p.name[0].isdigit()}
APPENDICES = {p.name.split("_")[1].upper() for p in LESSONS if p.name.startswith("appendix_")}
SOURCES = sorted(
    p for d in ("lessons", "exercises", "solutions") for p in (ROOT / d).glob("*.ipynb")
) + [ROOT / "README.md"]

# "lesson 09b", "Lesson 04's", "lessons 01-03", "lessons 08 and 09", "lessons 06, 08 and 09b"
_LESSON = re.compile(r"\b[Ll]essons?\s+((?:\d\d[a-z]?(?:\s*(?:,|and|to|–|-)\s*)?)+)")
_NUMBER = re.compile(r"\d\d[a-z]?")
_APPENDIX = re.compile(r"\b[Aa]ppendix\s+([A-Z])\b")
_PATH = re.compile(r"lessons/([\w.-]+\.ipynb)")


def _text(path: Path) -> str:
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    return "\n".join(
        "".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells
    )


def _unresolved(text: str) -> list[str]:
    bad = []
    for m in _LESSON.finditer(text):
        bad += [f"lesson {n}" for n in _NUMBER.findall(m.group(1)) if n not in NUMBERS]
    bad += [f"appendix {a}" for a in _APPENDIX.findall(text) if a not in APPENDICES]
    bad += [f"lessons/{n}" for n in _PATH.findall(text) if not (ROOT / "lessons" / n).is_file()]
    return bad


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_lesson_reference_names_a_lesson_that_exists(path):
    assert _unresolved(_text(path)) == []


def test_the_scan_catches_a_stale_number_an_appendix_and_a_path():
    text = "see lesson 09c, lessons 08 and 12, appendix Z and `lessons/09_old.ipynb`; lesson 09b"
    assert _unresolved(text) == ["lesson 09c", "lesson 12", "appendix Z", "lessons/09_old.ipynb"]
