"""The notation table has one source, the README's; lesson 02's copy is written from it by
``tools/notation.py`` and must not drift."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("notation", ROOT / "tools" / "notation.py")
notation = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notation)


def test_lesson_02_shows_the_readme_notation_table():
    readme, lesson = notation.readme_table(), notation.lesson_table()
    assert len(readme) >= 10 and readme[0].startswith("| symbol")
    assert lesson == readme, "lesson 02's notation table differs: run python tools/notation.py"


def test_the_check_fails_when_the_copy_drifts(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    readme.write_text(text.replace("| $B$, $V$, $T$ |", "| $B$, $V$, $\\tau$ |"))
    monkeypatch.setattr(notation, "README", readme)
    assert notation.main(["--check"]) == 1
    monkeypatch.setattr(notation, "README", ROOT / "README.md")
    assert notation.main(["--check"]) == 0
