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
