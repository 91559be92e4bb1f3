"""Every lesson states a time within 20% of the README's estimate (tools/lesson_time.py:
130 words of markdown a minute, 4 non-blank code lines a minute and 10 non-blank printed
lines a minute, plus the notebook's run time as tools/nb.py execute recorded it)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("lesson_time", ROOT / "tools" / "lesson_time.py")
lesson_time = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lesson_time)

LESSONS = sorted((ROOT / "lessons").glob("*.ipynb"))


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
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
    assert lesson_time.reading_minutes(path) == pytest.approx(2.0)
    assert lesson_time.stated_minutes(path) == 2
    assert lesson_time.within_tolerance(2.4, 2.0) and not lesson_time.within_tolerance(2.5, 2.0)
    (tmp_path / "bad.ipynb").write_text(
        json.dumps({"cells": [{"cell_type": "markdown", "source": "hi"}]})
    )
    with pytest.raises(ValueError, match="states no"):
        lesson_time.stated_minutes(tmp_path / "bad.ipynb")


def test_the_estimate_counts_printed_lines_but_not_figures(tmp_path):
    import json

    table = "k | alpha\n1 | 0.84\n\n2 | 0.85\n"  # three non-blank lines
    nb = {
        "cells": [
            {"cell_type": "markdown", "source": "**Time:** about 1 minutes."},
            {
                "cell_type": "code",
                "source": "",
                "outputs": [
                    {"output_type": "stream", "name": "stdout", "text": [table]},
                    {"output_type": "display_data", "data": {"text/markdown": "A verdict."}},
                    {"output_type": "execute_result", "data": {"text/plain": "0.5"}},
                    {
                        "output_type": "display_data",
                        "data": {"image/png": "...", "text/plain": "<Figure size 500x300>"},
                    },
                    {
                        "output_type": "display_data",
                        "data": {
                            "application/vnd.jupyter.widget-view+json": {},
                            "text/plain": "IntSlider(value=1)",
                        },
                    },
                ],
            },
        ]
    }
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    assert lesson_time.output_lines(path) == 5
    assert lesson_time.reading_minutes(path) == pytest.approx(4 / 130 + 5 / 10)  # 4 words


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_the_estimate_includes_the_lessons_recorded_run_time(path):
    run = lesson_time.run_minutes(path)  # KeyError (names the command) if never recorded
    assert run > 0
    assert lesson_time.estimate_minutes(path) == pytest.approx(
        lesson_time.reading_minutes(path) + run
    )


def test_a_lesson_without_a_run_time_is_named(tmp_path):
    with pytest.raises(KeyError, match="tools/nb.py execute"):
        lesson_time.run_minutes(tmp_path / "99_unrun.ipynb")
