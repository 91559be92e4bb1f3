"""ipywidgets explorers for the lessons.

Each explorer keeps its computation in an ``update`` method that returns the numbers it shows
and refreshes its matplotlib figure, so it can be tested without a browser: set a slider's
``value`` and read ``explorer.widget.result`` (or call ``update`` directly).
"""

from __future__ import annotations

import io

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

from . import theory

__all__ = ["SpeedupExplorer", "CacheStepper", "TreeBuilder"]


class SpeedupExplorer:
    """Sliders for alpha, gamma and c; curves of expected tokens and speedup against gamma.

    ``update(alpha, gamma, c)`` returns ``{"expected_tokens", "speedup", "best_gamma",
    "best_speedup"}`` for the chosen point and moves the figure's lines and markers.
    """

    def __init__(self, alpha: float = 0.8, gamma: int = 4, c: float = 0.1, max_gamma: int = 16):
        self.max_gamma = max_gamma
        self.gammas = np.arange(0, max_gamma + 1)
        self.alpha = widgets.FloatSlider(
            value=alpha, min=0.0, max=0.99, step=0.01, description="alpha"
        )
        self.gamma = widgets.IntSlider(value=gamma, min=0, max=max_gamma, description="gamma")
        self.c = widgets.FloatSlider(value=c, min=0.0, max=1.0, step=0.01, description="c")
        self.fig, (self.ax_tokens, self.ax_speed) = plt.subplots(1, 2, figsize=(9, 3.2))
        plt.close(self.fig)  # shown through self.image, not by the inline backend
        (self.tokens_line,) = self.ax_tokens.plot(self.gammas, self.gammas * 0.0, marker=".")
        (self.tokens_point,) = self.ax_tokens.plot([0], [0], "o", color="C3")
        (self.speed_line,) = self.ax_speed.plot(self.gammas, self.gammas * 0.0, marker=".")
        (self.speed_point,) = self.ax_speed.plot([0], [0], "o", color="C3", label="chosen gamma")
        (self.best_point,) = self.ax_speed.plot(
            [0], [0], "*", ms=14, color="C2", label="best gamma"
        )
        self.ax_speed.axhline(1.0, color="gray", lw=0.8, ls="--")
        self.ax_tokens.set_xlabel("gamma")
        self.ax_tokens.set_ylabel("expected tokens per target call")
        self.ax_speed.set_xlabel("gamma")
        self.ax_speed.set_ylabel("speedup (Theorem 3.8)")
        self.ax_speed.legend(fontsize=8, loc="lower right")
        self.fig.tight_layout()
        self.image = widgets.Image(format="png")
        self.widget = widgets.interactive(self.update, alpha=self.alpha, gamma=self.gamma, c=self.c)

    def update(self, alpha: float, gamma: int, c: float) -> dict:
        tokens = np.array([theory.expected_tokens(alpha, int(g)) for g in self.gammas])
        speed = tokens / (self.gammas * c + 1.0)
        best = theory.optimal_gamma(alpha, c, max_gamma=self.max_gamma)
        self.tokens_line.set_ydata(tokens)
        self.tokens_point.set_data([gamma], [tokens[gamma]])
        self.speed_line.set_ydata(speed)
        self.speed_point.set_data([gamma], [speed[gamma]])
        self.best_point.set_data([best], [speed[best]])
        self.ax_tokens.set_ylim(0, self.max_gamma + 1.5)
        self.ax_speed.set_ylim(0, max(1.5, speed.max() * 1.1))
        self.ax_speed.set_title(f"alpha={alpha:.2f}, c={c:.2f}: best gamma {best}")
        # The figure travels as PNG bytes in an Image widget: no display messages, so the
        # explorer behaves the same in JupyterLab, under nbclient and under nbval.
        buf = io.BytesIO()
        self.fig.savefig(buf, format="png", dpi=80)
        self.image.value = buf.getvalue()
        return {
            "expected_tokens": float(tokens[gamma]),
            "speedup": float(speed[gamma]),
            "best_gamma": best,
            "best_speedup": float(speed[best]),
        }

    def _ipython_display_(self):
        display(widgets.VBox([self.widget, self.image]))


def _png(fig) -> bytes:
    # Figures travel as PNG bytes in an Image widget (see SpeedupExplorer.update).
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


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
