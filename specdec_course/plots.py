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
    # Beside the axes, not on them: at the cheap costs the curves fill the upper left.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return ax


def proof_picture(p: Sequence[float], q: Sequence[float], *, ax=None):
    """The proof of lesson 01 as bars: the accepted mass ``min(p, q)``, the rejected mass
    ``(1 - beta) * residual`` stacked on it, and ``p``'s outline, which the two fill exactly.

    Returns ``(ax, accepted, refill)`` with the two stacked arrays (``accepted + refill == p``
    up to rounding), so a lesson can assert what the picture shows.
    """
    p, q = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    accepted = np.minimum(p, q)
    beta = accepted.sum()
    over = np.maximum(p - q, 0.0)
    refill = (1 - beta) * over / over.sum() if over.sum() > 0 else np.zeros_like(p)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.2))
    x = np.arange(p.size)
    ax.bar(x, accepted, 0.6, color="tab:green", alpha=0.7, label="accepted: min(p, q)")
    ax.bar(
        x,
        refill,
        0.6,
        bottom=accepted,
        color="tab:orange",
        alpha=0.7,
        label=f"rejected, resampled: (1 - beta) r, 1 - beta = {1 - beta:.2f}",
    )
    ax.bar(x, p, 0.6, fill=False, edgecolor="black", lw=1.5, label="target p")
    ax.plot(x, q, "_", color="tab:blue", markersize=28, mew=2, label="draft q")
    ax.set_xticks(x, [str(i) for i in x])
    ax.set(xlabel="token", ylabel="probability", title="the two paths fill p exactly")
    ax.legend(fontsize=7)
    return ax, accepted, refill


def cache_timeline(events, prompt_len: int, k: int, end: int, *, upto=None, ax=None):
    """Lesson 04's picture of the caches, one row per speculative iteration.

    ``events``: per iteration ``(n, accepted, target_cache_length, draft_cache_length)``
    after it, as ``speculative_generate(..., on_iteration=...)`` reports them; the prompt had
    ``prompt_len`` tokens, ``k`` drafts per iteration, ``end`` = prompt + new tokens. Grey:
    committed tokens the target cache holds; black: the pending token; green: drafts
    accepted; blue: the recovered or bonus token; red outline: drafts scored and dropped.
    ``upto`` draws only the first iterations. Returns the axes.
    """
    upto = len(events) if upto is None else upto
    rows = len(events)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.35 * rows + 0.8))
    start = prompt_len - 4
    prev_n = prompt_len
    for row, (n, a, tlen, dlen) in enumerate(events[:upto]):
        y = rows - row
        for pos in range(start, n + 4):
            if pos < prev_n - 1:
                color = "lightgray"
            elif pos == prev_n - 1:
                color = "black"
            elif pos < prev_n + a:
                color = "tab:green"
            elif pos == prev_n + a:
                color = "tab:blue"
            else:
                color = None
            if color:
                ax.add_patch(plt.Rectangle((pos, y), 0.9, 0.8, color=color))
        drafted = min(k, end - prev_n - 1)
        for pos in range(prev_n + a, prev_n + drafted):  # scored drafts that were dropped
            ax.add_patch(
                plt.Rectangle((pos + 0.15, y + 0.15), 0.6, 0.5, fill=False, ec="tab:red", lw=1.5)
            )
        ax.text(
            n + 4.5, y + 0.3, f"accepted {a}, target cache {tlen}, draft cache {dlen}", fontsize=7
        )
        prev_n = n
    ax.set_xlim(start, end + 22)
    ax.set_ylim(0.8, rows + 1)
    ax.set_yticks([])
    ax.set_xlabel("position")
    ax.set_title(
        "committed (grey), pending (black), accepted (green), new token (blue), dropped (red)"
    )
    return ax


def tree_picture(tree, tokens: Sequence[str], accepted: Sequence[int] = (), *, axes=None):
    """Lesson 06's picture of a tree of guesses (left) and its attention mask (right).

    ``tree``: ``medusa.TreeBuffers``; ``tokens``: the text of each node, root first;
    ``accepted``: the accepted nodes (drawn green). Returns the two axes.
    """
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1, ax2 = axes
    depth = tree.depth.tolist()
    on_path = set(accepted) | {0}
    ypos = {}
    for d in range(tree.max_depth + 1):
        at_d = [i for i in range(tree.size) if depth[i] == d]
        for j, i in enumerate(at_d):
            ypos[i] = -(j - (len(at_d) - 1) / 2)
    for i in range(1, tree.size):
        par = tree.parents[i]
        on = i in on_path and par in on_path
        ax1.plot(
            [depth[par], depth[i]],
            [ypos[par], ypos[i]],
            color="C2" if on else "0.7",
            lw=2.5 if on else 1,
            zorder=1,
        )
    for i in range(tree.size):
        ch = tokens[i].replace(" ", "␣").replace("\n", "⏎")
        # The node is the label's own box, so a long label ("root", "0/1/2") stays inside it.
        shape = "circle,pad=0.3" if len(ch) <= 2 else "round,pad=0.35"
        ax1.text(
            depth[i],
            ypos[i],
            ch,
            ha="center",
            va="center",
            fontsize=12 if len(ch) <= 2 else 10,
            zorder=3,
            bbox=dict(boxstyle=shape, fc="C2" if i in on_path else "w", ec="k"),
        )
    # Room for the boxes at the ends: the axes' own margins are for points, not boxes.
    ys = list(ypos.values())
    ax1.set_xlim(-0.6, tree.max_depth + 0.6)
    ax1.set_ylim(min(ys) - 0.8, max(ys) + 0.8)
    ax1.set_xticks(
        range(tree.max_depth + 1), ["root"] + [f"head {d}" for d in range(1, tree.max_depth + 1)]
    )
    ax1.set_yticks([])
    names = ["root"] + [str(p) for p in tree.paths]
    ax2.imshow(tree.mask.int().numpy(), cmap="Greys", vmin=0, vmax=1.4)
    ax2.set_xticks(range(tree.size), names, rotation=90)
    ax2.set_yticks(range(tree.size), names)
    ax2.set(xlabel="key (attended to)", ylabel="query node", title="tree attention mask")
    return ax1, ax2


def verifier_layout(token_ids, num_accepted, draft_ids, *, ax=None):
    """The batched verifier's output ``[B, K + 1]`` as a grid: accepted drafts (green), the one
    new token, recovered after a rejection (blue) or a bonus after full acceptance (purple),
    and the ``-1`` placeholders (grey), each cell labelled with its id. Returns the axes."""
    tok = np.asarray(token_ids)
    m = np.asarray(num_accepted)
    drafts = np.asarray(draft_ids)
    B, K1 = tok.shape
    if ax is None:
        _, ax = plt.subplots(figsize=(1.0 + 0.9 * K1, 0.5 + 0.45 * B))
    for b in range(B):
        n_drafts = int((drafts[b] >= 0).sum())
        for j in range(K1):
            if j < m[b]:
                color = "tab:green"
            elif j == m[b]:
                color = "tab:purple" if m[b] == n_drafts else "tab:blue"
            else:
                color = "0.85"
            ax.add_patch(plt.Rectangle((j, B - 1 - b), 0.95, 0.9, color=color))
            ax.text(
                j + 0.47,
                B - 1 - b + 0.45,
                str(int(tok[b, j])),
                ha="center",
                va="center",
                color="white" if j <= m[b] else "0.4",
                fontsize=9,
            )
    ax.set_xlim(0, K1)
    ax.set_ylim(0, B)
    ax.set_xticks(np.arange(K1) + 0.47, [str(j) for j in range(K1)])
    ax.set_yticks(np.arange(B) + 0.45, [f"row {b}" for b in reversed(range(B))])
    ax.set(
        xlabel="output position j",
        title="accepted (green), recovered (blue), bonus (purple), -1 (grey)",
    )
    return ax


def race_walk(scores, block: int, *, ax=None):
    """One row of the race kernel's walk: the scores ``w / E`` column by column, in tiles of
    ``block`` columns; each tile's best, and the running best that a later tile must beat
    strictly (so the first maximum wins). Returns ``(ax, winner)``."""
    s = np.asarray(scores, dtype=float)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3))
    best, winner, running = -1.0, 0, []
    for start in range(0, s.size, block):
        tile = s[start : start + block]
        j = int(np.argmax(tile))
        if tile[j] > best:
            best, winner = float(tile[j]), start + j
        running.append((start, start + tile.size, best))
        ax.axvspan(
            start - 0.5, start + tile.size - 0.5, color=f"C{(start // block) % 2}", alpha=0.08
        )
    ax.bar(np.arange(s.size), s, color="0.6")
    ax.bar([winner], [s[winner]], color="tab:red", label=f"winner: column {winner}")
    for start, end, b in running:
        ax.hlines(b, start - 0.5, end - 0.5, colors="tab:red", linestyles=":")
    ax.set(
        xlabel="column (vocabulary)",
        ylabel="score w / E",
        title=f"tiles of {block}: the running best after each tile (dotted)",
    )
    ax.legend(fontsize=8)
    return ax, winner


def call_cost_curves(here: dict, record: dict, char: dict, *, ax=None):
    """cost(n)/cost(1) against n, the tokens one call scores: measured ``here`` (``{n:
    seconds}``, ``llm.call_costs``; it must hold n = 1), the stored ``bench llm`` record's
    SmolLM2 curve and the character target's from ``speedup_cpu.json``'s forward costs, each
    labelled with where and how it was measured; n one-token calls drawn for scale."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.6))
    sizes = sorted(here)
    ax.plot(sizes, [here[n] / here[1] for n in sizes], "o-", ms=4, lw=2, color="C3",
            label="SmolLM2, this machine (wall clock, now)")  # fmt: skip
    costs = record["call_costs"]
    ax.plot(costs["sizes"], costs["smollm2"]["ratio"], "s--", ms=3, color="C0",
            label=f"SmolLM2, record ({record['cpu']}, {record.get('clock', '?')})")  # fmt: skip
    fc = char["forward_costs"]
    ax.plot(fc["sizes"], fc["target_rel"], "^:", ms=3, color="C2",
            label=f"character target, record ({char['machine']})")  # fmt: skip
    top = max(sizes)
    ax.plot([1, top], [1, top], color="0.75", lw=1, label="n one-token calls")
    ax.set(xlabel="tokens scored in one call, n", ylabel="cost(n) / cost(1)",
           xlim=(0.5, top + 0.5), ylim=(0, 4))  # fmt: skip
    ax.legend(fontsize=7, loc="upper left")
    return ax
