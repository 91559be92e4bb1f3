"""ipywidgets explorers for the lessons.

Each explorer keeps its computation in an ``update`` method that returns the numbers it shows
and refreshes its matplotlib figure, so it can be tested without a browser: set a slider's
``value`` and read ``explorer.widget.result`` (or call ``update`` directly).
"""

from __future__ import annotations

import io
from pathlib import Path

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from . import theory

__all__ = ["SpeedupExplorer", "CacheStepper", "TreeBuilder"]


class _Panels:
    """The explorer's two panels on ``fig``: expected tokens and speedup against gamma."""

    def __init__(self, fig, max_gamma: int):
        self.fig = fig
        self.gammas = np.arange(0, max_gamma + 1)
        self.ax_tokens, self.ax_speed = fig.subplots(1, 2)
        (self.tokens_line,) = self.ax_tokens.plot(self.gammas, self.gammas * 0.0, marker=".")
        (self.tokens_point,) = self.ax_tokens.plot([0], [0], "o", color="C3")
        (self.speed_line,) = self.ax_speed.plot(self.gammas, self.gammas * 0.0, marker=".")
        (self.speed_point,) = self.ax_speed.plot([0], [0], "o", color="C3", label="chosen gamma")
        (self.best_point,) = self.ax_speed.plot(
            [0], [0], "*", ms=14, color="C2", label="best gamma"
        )
        even = self.ax_speed.axhline(1.0, color="gray", lw=0.8, ls="--", label="break-even")
        for ax in (self.ax_tokens, self.ax_speed):
            ax.set_xlabel("gamma (drafts per target call)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # gamma is a whole number
            ax.set_xlim(-0.5, max_gamma + 0.5)
        self.ax_tokens.set_ylabel("expected tokens per target call")
        self.ax_speed.set_ylabel("speedup (Theorem 3.8)")
        # Below both panels, outside them: no curve can run under the legend, whatever c is.
        fig.legend(
            handles=[self.speed_point, self.best_point, even],
            loc="outside lower center",
            ncols=3,
            fontsize=8,
            frameon=False,
        )

    def draw(self, alpha: float, gamma: int, c: float) -> dict:
        tokens = np.array([theory.expected_tokens(alpha, int(g)) for g in self.gammas])
        speed = tokens / (self.gammas * c + 1.0)
        best = theory.optimal_gamma(alpha, c, max_gamma=int(self.gammas[-1]))
        self.tokens_line.set_ydata(tokens)
        self.tokens_point.set_data([gamma], [tokens[gamma]])
        self.speed_line.set_ydata(speed)
        self.speed_point.set_data([gamma], [speed[gamma]])
        self.best_point.set_data([best], [speed[best]])
        # Each axis follows its curve: at alpha = 0.7 the tokens stay below 3.4 of 17.
        self.ax_tokens.set_ylim(0, max(2.0, tokens.max() * 1.1))
        self.ax_speed.set_ylim(0, max(1.5, speed.max() * 1.1))
        self.ax_tokens.set_title(f"alpha = {alpha:.2f}", fontsize=10)
        self.ax_speed.set_title(f"c = {c:.2f}: best gamma {best}", fontsize=10)
        return {
            "expected_tokens": float(tokens[gamma]),
            "speedup": float(speed[gamma]),
            "best_gamma": best,
            "best_speedup": float(speed[best]),
        }


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


class SpeedupExplorer:
    """Sliders for alpha, gamma and c; curves of expected tokens and speedup against gamma.

    ``update(alpha, gamma, c)`` returns ``{"expected_tokens", "speedup", "best_gamma",
    "best_speedup"}`` for the chosen point, moves the figure's lines and markers and writes
    the same numbers in the readout line (``explorer.readout.value``).
    """

    def __init__(self, alpha: float = 0.8, gamma: int = 4, c: float = 0.1, max_gamma: int = 16):
        self.max_gamma = max_gamma
        self.alpha = widgets.FloatSlider(
            value=alpha, min=0.0, max=0.99, step=0.01, description="alpha"
        )
        self.gamma = widgets.IntSlider(value=gamma, min=0, max=max_gamma, description="gamma")
        self.c = widgets.FloatSlider(value=c, min=0.0, max=1.0, step=0.01, description="c")
        # Constrained layout is recomputed at every draw: titles and labels of any length fit.
        # A figure outside pyplot, on its own Agg canvas: shown through self.image, never by
        # the inline backend, and drawable (and measurable) anywhere.
        self.fig = Figure(figsize=(9, 3.6), layout="constrained")
        FigureCanvasAgg(self.fig)
        self.panels = p = _Panels(self.fig, max_gamma)
        self.ax_tokens, self.ax_speed = p.ax_tokens, p.ax_speed
        self.gammas, self.tokens_line, self.speed_line = p.gammas, p.tokens_line, p.speed_line
        self.speed_point, self.best_point = p.speed_point, p.best_point
        self.readout = widgets.HTML()
        self.image = widgets.Image(format="png")
        self.widget = widgets.interactive(self.update, alpha=self.alpha, gamma=self.gamma, c=self.c)

    def update(self, alpha: float, gamma: int, c: float) -> dict:
        result = self.panels.draw(alpha, gamma, c)
        self.readout.value = (
            f"gamma = {gamma}: {result['expected_tokens']:.2f} tokens per target call, "
            f"speedup {result['speedup']:.2f}x &nbsp;|&nbsp; best gamma = "
            f"{result['best_gamma']}: {result['best_speedup']:.2f}x"
        )
        # The figure travels as PNG bytes in an Image widget: no display messages, so the
        # explorer behaves the same in JupyterLab, under nbclient and under nbval.
        self.image.value = _png(self.fig)
        return result

    def _ipython_display_(self):
        box = widgets.VBox([self.widget, self.readout, self.image])
        bundle = box._repr_mimebundle_()
        # What a view without the live widget shows (a saved notebook, a text console):
        # a sentence, not a truncated repr of the widget tree.
        bundle["text/plain"] = (
            f"SpeedupExplorer(alpha={self.alpha.value:.2f}, gamma={self.gamma.value}, "
            f"c={self.c.value:.2f}): run the notebook to move its sliders"
        )
        display(bundle, raw=True)

    def save_preview(self, path: str | Path) -> Path:
        """Write a PNG of the explorer as it stands (sliders, readout and panels) to ``path``:
        the picture a notebook shows before its kernel runs. Returns the path."""
        values = {"alpha": self.alpha.value, "gamma": self.gamma.value, "c": self.c.value}
        fig = plt.figure(figsize=(9, 4.6), layout="constrained")
        try:
            top, bottom = fig.subfigures(2, 1, height_ratios=[1.0, 3.6])
            _draw_sliders(top, values, {"alpha": 0.99, "gamma": self.max_gamma, "c": 1.0})
            result = _Panels(bottom, self.max_gamma).draw(**values)
            top.text(
                0.5,
                0.02,
                f"gamma = {values['gamma']}: {result['expected_tokens']:.2f} tokens per target "
                f"call, speedup {result['speedup']:.2f}x  |  best gamma = "
                f"{result['best_gamma']}: {result['best_speedup']:.2f}x",
                ha="center",
                fontsize=9,
            )
            path = Path(path)
            path.write_bytes(_png(fig))
        finally:
            plt.close(fig)
        return path


def _draw_sliders(fig, values: dict, maxima: dict) -> None:
    # What ipywidgets' sliders look like: a label, a track, a handle and the value.
    ax = fig.add_axes((0, 0.25, 1, 0.75))
    ax.set_axis_off()
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.5, len(values) - 0.5)
    for row, (name, value) in enumerate(values.items()):
        y = len(values) - 1 - row
        x = 0.12 + 0.3 * value / maxima[name]
        ax.text(0.1, y, name, ha="right", va="center", fontsize=9)
        ax.plot([0.12, 0.42], [y, y], color="#bbbbbb", lw=4, solid_capstyle="round")
        ax.plot([0.12, x], [y, y], color="#2196f3", lw=4, solid_capstyle="round")
        ax.plot([x], [y], "o", ms=9, mfc="white", mec="#888888")
        ax.text(0.44, y, f"{value:.2f}" if isinstance(value, float) else str(value), va="center")


class CacheStepper:
    """Step through a speculative generation's iterations: lesson 04's cache picture, drawn up
    to the chosen iteration.

    ``events``: ``(n, accepted, target_cache_length, draft_cache_length)`` per iteration, as
    ``speculative_generate(..., on_iteration=...)`` reports them; ``prompt_len``, ``k`` and
    ``end`` (prompt + new tokens) as in ``plots.cache_timeline``. ``update(iteration)``
    returns the state after that iteration (1-based): ``{"iteration", "committed",
    "accepted", "target_cache", "draft_cache"}``.
    """

    def __init__(self, events, prompt_len: int, k: int, end: int):
        from . import plots

        if not events:
            raise ValueError("events is empty: record at least one iteration")
        self.events, self.prompt_len, self.k, self.end = list(events), prompt_len, k, end
        self._plots = plots
        self.step = widgets.IntSlider(value=1, min=1, max=len(self.events), description="iteration")
        self.image = widgets.Image(format="png")
        self.widget = widgets.interactive(self.update, iteration=self.step)

    def update(self, iteration: int) -> dict:
        n, a, tlen, dlen = self.events[iteration - 1]
        fig, ax = plt.subplots(figsize=(10, 0.35 * len(self.events) + 0.8))
        self._plots.cache_timeline(
            self.events, self.prompt_len, self.k, self.end, upto=iteration, ax=ax
        )
        self.image.value = _png(fig)
        plt.close(fig)
        return {
            "iteration": iteration,
            "committed": n,
            "accepted": a,
            "target_cache": tlen,
            "draft_cache": dlen,
        }

    def _ipython_display_(self):
        display(widgets.VBox([self.widget, self.image]))


class TreeBuilder:
    """Grow a Medusa tree node by node (lesson 06): the paths with the largest products of the
    heads' per-rank accuracies, their attention mask, and the expected accepted length.

    ``accuracy [K, R]``: how often head ``k + 1``'s rank-``r`` guess is right
    (``medusa.head_accuracy(...)["rank"]``). ``update(nodes)`` returns ``{"nodes", "paths",
    "expected_accepted"}``, the last being the sum of the paths' products (the expected
    number of guesses a tree pass accepts, under Medusa's independence approximation).
    """

    def __init__(self, accuracy, max_nodes: int = 16, nodes: int = 5):
        import torch

        from . import medusa

        self.accuracy = torch.as_tensor(accuracy, dtype=torch.float64)
        self._medusa = medusa
        self.nodes = widgets.IntSlider(value=nodes, min=1, max=max_nodes, description="nodes")
        self.image = widgets.Image(format="png")
        self.widget = widgets.interactive(self.update, nodes=self.nodes)

    def expected_accepted(self, paths) -> float:
        total = 0.0
        for path in paths:
            prod = 1.0
            for depth, rank in enumerate(path):
                prod *= float(self.accuracy[depth, rank])
            total += prod
        return total

    def update(self, nodes: int) -> dict:
        from . import plots

        paths = self._medusa.greedy_tree(self.accuracy, nodes)
        tree = self._medusa.build_tree(paths)
        labels = ["root"] + ["/".join(str(r) for r in p) for p in tree.paths]
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        plots.tree_picture(tree, labels, axes=axes)
        expected = self.expected_accepted(tree.paths)
        axes[0].set_title(f"{nodes} guesses: {expected:.2f} accepted per pass, expected")
        fig.tight_layout()
        self.image.value = _png(fig)
        plt.close(fig)
        return {"nodes": nodes, "paths": list(tree.paths), "expected_accepted": expected}

    def _ipython_display_(self):
        display(widgets.VBox([self.widget, self.image]))
