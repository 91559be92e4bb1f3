"""The ``bench speedup`` record: written as JSON with its time-split figure, read back, and
printed as tables (``bench.speedup`` measures it)."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import torch

from ..paths import results_dir
from .records import newest_record
from .speedup import SPLIT

__all__ = [
    "format_speedup_table",
    "format_medusa_table",
    "best_row",
    "plot_time_split",
    "save_speedup_results",
    "load_speedup_results",
    "load_gpu_speedup_results",
]


def save_speedup_results(
    forward_costs: dict,
    results: list[dict],
    command: str,
    out: str | Path | None = None,
    *,
    device: torch.device | str = "cpu",
    name: str | None = None,
) -> list[Path]:
    """Write the ``bench speedup`` record as JSON, and its time-split figure as PNG.

    Files ``<name>.json`` (costs, tables, machine, date; lessons 04 and 07 read them) and
    ``<name>.png`` in ``out`` (default ``data/results/``). ``name`` defaults to
    ``speedup_cpu`` on a CPU and ``speedup-<gpu>-<date>`` for a CUDA ``device``, whose name
    and torch and triton versions the record then gives as its machine (no PNG when only
    Medusa was measured: the figure splits the drafts' iterations). Returns the paths.
    """
    import platform

    from .records import machine_name, record_stem, save_figure

    out_dir = Path(out) if out else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device)
    if name is None:
        name = (
            "speedup_cpu" if dev.type == "cpu" else record_stem("speedup", machine_name(dev)).name
        )
    path = out_dir / f"{name}.json"
    if dev.type == "cuda":
        import triton

        machine = f"{machine_name(dev)}, torch {torch.__version__}, triton {triton.__version__}"
    else:
        machine = (
            f"{platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} thread, torch {torch.__version__}"
        )
    payload = {
        "command": command,
        "machine": machine,
        "date": _dt.date.today().isoformat(),
        "forward_costs": forward_costs,
        "results": results,
    }
    path.write_text(json.dumps(payload, indent=1))
    if not any(r["methods"] for r in results):  # Medusa alone: no draft's split to plot
        return [path]
    return [path, save_figure(lambda: plot_time_split(results), out_dir / f"{name}.png")]


def best_row(result: dict, method: str) -> dict:
    """The row of ``method`` with the highest measured speedup."""
    return max(result["methods"][method], key=lambda r: r["measured_speedup"])


def format_speedup_table(result: dict) -> str:
    """The result of :func:`measure_speedup` as text tables, one per draft."""
    graphed = ", CUDA graphs" if result.get("cuda_graphs") else ""
    lines = [
        f"temperature {result['temperature']}{graphed}: plain decoding "
        f"{result['plain_token_s'] * 1e6:.0f} us per character "
        f"({result['prompts']} prompts x {result['max_new_tokens']} characters, "
        f"median of {result['repeats']})"
    ]
    for name, rows in result["methods"].items():
        lines += [
            f"{name}:",
            " k | alpha | tok/call |   c   | Thm 3.8 | cost-aware | measured | meas/cost-aware",
            "---+-------+----------+-------+---------+------------+----------+----------------",
        ]
        for r in rows:
            lines.append(
                f"{r['k']:2d} | {r['alpha']:.3f} | {r['tokens_per_target_call']:8.3f} | "
                f"{r['c']:.3f} | {r['predicted_speedup']:6.2f}x | {r['cost_aware_speedup']:9.2f}x"
                f" | {r['measured_speedup']:7.2f}x | {r['measured_over_cost_aware']:15.3f}"
            )
    return "\n".join(lines)


def format_medusa_table(result: dict) -> str:
    lines = [
        f"Medusa, temperature {result['temperature']}:",
        " tree    | nodes | accepted length | tok/call | measured speedup",
        "---------+-------+-----------------+----------+-----------------",
    ]
    for r in result.get("medusa", []):
        lines.append(
            f" {r['tree']:7s} | {r['nodes']:5d} | {r['mean_accepted_length']:15.3f} | "
            f"{r['tokens_per_target_call']:8.3f} | {r['measured_speedup']:15.3f}x"
        )
    return "\n".join(lines)


def plot_time_split(results, methods=None):
    """Stacked bars: where one iteration's time goes (the prompt's prefill shared out over
    the run's iterations, draft, target, verify, rest) for each draft and k, beside what plain
    decoding spends on the same number of characters.

    ``results``: one result of :func:`measure_speedup` or a list of them (one row of panels
    each, e.g. temperatures 1 and 0).
    """
    import matplotlib.pyplot as plt

    results = [results] if isinstance(results, dict) else list(results)
    methods = list(methods or results[0]["methods"])
    fig, axes = plt.subplots(
        len(results), len(methods), figsize=(4.2 * len(methods), 3.2 * len(results)), squeeze=False
    )
    colors = {
        "prefill": "tab:purple",
        "draft": "tab:orange",
        "target": "tab:blue",
        "verify": "tab:green",
        "rest": "0.6",
    }
    for row_axes, result in zip(axes, results):
        for ax, name in zip(row_axes, methods):
            rows = result["methods"][name]
            xs = [r["k"] for r in rows]
            bottom = [0.0] * len(rows)
            for part in SPLIT:
                h = [r["split_s"].get(part, 0.0) * 1e6 for r in rows]  # older records: 4
                ax.bar(xs, h, bottom=bottom, color=colors[part], label=part, width=0.7)
                bottom = [b + v for b, v in zip(bottom, h)]
            plain = [
                r["tokens_per_target_call"] * r.get("plain_token_s", result["plain_token_s"]) * 1e6
                for r in rows
            ]
            ax.plot(xs, plain, "k_", markersize=16, mew=2, label="plain, same characters")
            ax.set_xticks(xs)
            graphed = ", CUDA graphs" if result.get("cuda_graphs") else ""
            ax.set(title=f"{name}, temperature {result['temperature']}{graphed}", xlabel="k")
            ax.set_ylabel("microseconds per iteration")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def load_speedup_results(directory: str | Path | None = None, *, name: str = "speedup_cpu") -> dict:
    """The stored ``bench speedup`` record (``data/results/speedup_cpu.json``; ``name=
    "speedup_cpu_numpy"`` the one with the target's steps in NumPy, ``fast.numpy_steps``)."""
    path = Path(directory or results_dir()) / f"{name}.json"
    if not path.is_file():
        flag = " --target-executor numpy" if name.endswith("numpy") else ""
        raise FileNotFoundError(
            f"{path} not found; run: specdec-course bench speedup --method all{flag}"
        )
    return json.loads(path.read_text())


def load_gpu_speedup_results(directory: str | Path | None = None) -> dict | None:
    """The newest stored GPU ``speedup-<gpu>-<date>.json`` record, or None if none is stored."""
    path = newest_record("speedup", directory)
    return None if path is None else json.loads(path.read_text())
