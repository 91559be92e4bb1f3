"""Every lesson states a time within 20% of the README's estimate (tools/lesson_time.py:
130 words of markdown a minute plus 4 non-blank code lines a minute)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("lesson_time", ROOT / "tools" / "lesson_time.py")
lesson_time = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lesson_time)

# Lessons edited elsewhere in this round, not yet re-timed: their stated time is read and
# compared all the same, and an xfail says which lesson still needs its time adjusted.
_NOT_YET_RETIMED = ("06", "08", "09", "10")


def _lessons():
    for path in sorted((ROOT / "lessons").glob("*.ipynb")):
        marks = []
        if path.name[:2] in _NOT_YET_RETIMED:
            reason = f"lesson {path.name[:2]} ({path.name}): stated time not yet re-timed"
            marks.append(pytest.mark.xfail(reason=reason, strict=False))
        yield pytest.param(path, id=path.stem, marks=marks)


@pytest.mark.parametrize("path", list(_lessons()))
def test_stated_time_is_within_20_percent_of_the_estimate(path):
    stated, estimate = lesson_time.stated_minutes(path), lesson_time.estimate_minutes(path)
    assert lesson_time.within_tolerance(stated, estimate), (
        f"{path.name} states about {stated} minutes; the estimate is {estimate:.0f} "
        f"(within 20%: {0.8 * estimate:.0f} to {1.2 * estimate:.0f})"
    )


def test_the_estimate_counts_prose_words_and_code_lines(tmp_path):
    import json

    nb = {
        "cells": [
            {"cell_type": "markdown", "source": "**Time:** about 2 minutes.\n" + "word " * 126},
            {"cell_type": "code", "source": ["x = 1\n", "\n", "print(x)\n", "y = 2\n", "z = 3"]},
        ]
    }
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    assert lesson_time.counts(path) == (130, 4)
    assert lesson_time.estimate_minutes(path) == pytest.approx(2.0)
    assert lesson_time.stated_minutes(path) == 2
    assert lesson_time.within_tolerance(2.4, 2.0) and not lesson_time.within_tolerance(2.5, 2.0)
    (tmp_path / "bad.ipynb").write_text(
        json.dumps({"cells": [{"cell_type": "markdown", "source": "hi"}]})
    )
    with pytest.raises(ValueError, match="states no"):
        lesson_time.stated_minutes(tmp_path / "bad.ipynb")
