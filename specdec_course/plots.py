"""Matplotlib figures the lessons share (kept here so every lesson draws them the same way)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

from . import theory


def compare_distributions(
    target: Sequence[float],
    others: Mapping[str, Sequence[float]],
    *,
    labels: Sequence[str] | None = None,
    title: str = "",
    ax=None,
):
    """Grouped bars: the exact ``target`` distribution beside empirical or exact ``others``."""
    target = np.asarray(target, dtype=float)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    n = 1 + len(others)
    width = 0.8 / n
    x = np.arange(target.size)
    ax.bar(x - 0.4 + width / 2, target, width, label="target p", color="black")
    for i, (name, dist) in enumerate(others.items(), start=1):
        ax.bar(x - 0.4 + width / 2 + i * width, np.asarray(dist, dtype=float), width, label=name)
    ax.set_xticks(x, labels if labels is not None else [str(i) for i in x])
    ax.set_ylabel("probability")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return ax


def speedup_curves(alpha: float, costs: Sequence[float], *, max_gamma: int = 16, ax=None):
    """Speedup (Theorem 3.8) against gamma for several draft costs ``c``; optimum marked."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    gammas = np.arange(0, max_gamma + 1)
    for c in costs:
        s = [theory.speedup(alpha, int(g), c) for g in gammas]
        best = theory.optimal_gamma(alpha, c, max_gamma=max_gamma)
        (line,) = ax.plot(gammas, s, marker=".", label=f"c = {c:g} (best gamma = {best})")
        ax.plot(
            [best], [theory.speedup(alpha, best, c)], "o", ms=10, mfc="none", color=line.get_color()
        )
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xlabel("gamma (tokens drafted per iteration)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(f"alpha = {alpha:g}")
    ax.legend(fontsize=8)
    return ax
