from pathlib import Path

import nbformat
import pytest

from specdec_course import theory
from specdec_course.widgets import SpeedupExplorer


def test_explorer_callback_updates_figure_when_a_slider_moves():
    ex = SpeedupExplorer(alpha=0.8, gamma=4, c=0.1)
    before = ex.speed_line.get_ydata().copy()
    ex.alpha.value = 0.9
    after = ex.speed_line.get_ydata()
    assert (after != before).any()
    assert after[5] == pytest.approx(theory.speedup(0.9, 5, 0.1))
    assert ex.widget.result["speedup"] == pytest.approx(theory.speedup(0.9, 4, 0.1))


def test_explorer_marks_the_best_gamma():
    ex = SpeedupExplorer(alpha=0.8, gamma=2, c=0.1)
    ex.c.value = 0.3
    best = theory.optimal_gamma(0.8, 0.3, max_gamma=16)
    assert ex.widget.result["best_gamma"] == best
    assert list(ex.best_point.get_xdata()) == [best]
    ex.gamma.value = 7
    assert ex.widget.result["expected_tokens"] == pytest.approx(theory.expected_tokens(0.8, 7))
    assert list(ex.speed_point.get_xdata()) == [7]


def test_explorer_renders_its_figure_into_the_image_widget():
    ex = SpeedupExplorer()
    first = ex.image.value
    ex.gamma.value = 9
    assert first[:4] == b"\x89PNG" and ex.image.value != first


def _visible_ticks(ax, axis="x"):
    lo, hi = getattr(ax, f"get_{axis}lim")()
    ticks = getattr(ax, f"get_{axis}ticks")()
    return [t for t in ticks if lo <= t <= hi]


def test_explorer_gamma_axes_have_whole_number_ticks():
    ex = SpeedupExplorer()
    ex.fig.canvas.draw()
    for ax in (ex.ax_tokens, ex.ax_speed):
        ticks = _visible_ticks(ax)
        assert ticks and all(float(t).is_integer() for t in ticks)


def test_explorer_tokens_axis_follows_the_curve():
    ex = SpeedupExplorer(alpha=0.7, gamma=4, c=0.1)
    top = ex.ax_tokens.get_ylim()[1]
    peak = max(ex.tokens_line.get_ydata())
    assert peak < top <= 1.2 * peak  # not 0..17.5 for a curve that stays below 3.4
    ex.alpha.value = 0.99
    assert ex.ax_tokens.get_ylim()[1] >= max(ex.tokens_line.get_ydata())


def test_explorer_titles_and_legend_stay_inside_the_figure_and_off_the_curves():
    ex = SpeedupExplorer()
    for alpha, c in ((0.8, 0.1), (0.7, 0.95), (0.99, 0.0)):
        ex.alpha.value, ex.c.value = alpha, c
        ex.fig.canvas.draw()
        renderer = ex.fig.canvas.get_renderer()
        fig_box = ex.fig.bbox
        for ax in (ex.ax_tokens, ex.ax_speed):
            title = ax.title.get_window_extent(renderer)
            assert fig_box.y0 <= title.y0 and title.y1 <= fig_box.y1, f"title cut at {alpha, c}"
        legend = ex.fig.legends[0].get_window_extent(renderer)
        for ax in (ex.ax_tokens, ex.ax_speed):
            assert not legend.overlaps(ax.get_window_extent(renderer))


def test_explorer_readout_says_the_chosen_and_best_gamma():
    ex = SpeedupExplorer(alpha=0.8, gamma=4, c=0.1)
    before = ex.readout.value
    assert f"speedup {theory.speedup(0.8, 4, 0.1):.2f}x" in before
    assert f"best gamma = {theory.optimal_gamma(0.8, 0.1)}" in before
    ex.gamma.value = 2
    assert ex.readout.value != before and "gamma = 2:" in ex.readout.value


def test_explorer_preview_png_is_written_and_the_lesson_shows_the_committed_one(tmp_path):
    path = SpeedupExplorer().save_preview(tmp_path / "x.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    root = Path(__file__).resolve().parent.parent
    committed = root / "lessons" / "figures" / "02_explorer.png"
    assert committed.read_bytes()[:4] == b"\x89PNG"
    lesson = nbformat.read(root / "lessons" / "02_acceptance_rate.ipynb", as_version=4)
    cells = lesson.cells
    at = next(i for i, c in enumerate(cells) if "SpeedupExplorer(" in c.source)
    assert cells[at - 1].cell_type == "markdown"
    assert "](figures/02_explorer.png)" in cells[at - 1].source
    # A saved notebook's text view of the widget is a sentence, not the widget tree's repr.
    text = "".join(cells[at].outputs[0]["data"]["text/plain"])
    assert text.startswith("SpeedupExplorer(alpha=0.80, gamma=4, c=0.10)")
