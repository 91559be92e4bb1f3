"""Draw the static figures the lessons show before their kernel runs.

    python tools/figures.py        # writes lessons/figures/*.png

Lesson 02's explorer is a live widget: a notebook opened without running it would show its
text repr, so the markdown cell above the widget shows this picture of it instead, drawn by
the explorer itself at the widget cell's starting values.
"""

from __future__ import annotations

from pathlib import Path

from specdec_course.widgets import SpeedupExplorer

FIGURES = Path(__file__).resolve().parent.parent / "lessons" / "figures"
# The widget cell's starting values in lessons/02_acceptance_rate.ipynb.
EXPLORER_START = {"alpha": 0.8, "gamma": 4, "c": 0.1}


def main() -> None:
    FIGURES.mkdir(exist_ok=True)
    path = SpeedupExplorer(**EXPLORER_START).save_preview(FIGURES / "02_explorer.png")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
