"""Where benchmark records go: ``data/results/<kind>-<machine>-<date>.<ext>``, newest first.

A record measured on a GPU is committed under ``data/results/`` so that machines without
one can show it (lessons 04, 05 and 07). Its file names carry what was measured, on what
and when: ``verifier-nvidia-h200-2026-12-01.json``. A reader takes the newest by date.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
from pathlib import Path

import torch

from ..paths import results_dir

__all__ = [
    "slug",
    "machine_name",
    "record_stem",
    "newest_record",
    "save_record",
    "load_record",
    "save_figure",
    "LOAD_BOUND",
    "load_average",
    "load_header",
]

# How far the 1-minute load average may move during a timed run before its record says that
# its timings are not comparable: one busy core's worth, on the course's 2-core machine half
# of it.
LOAD_BOUND = 1.0


def slug(name: str) -> str:
    """``name`` in lower case with runs of other characters as one ``-``: file-name safe."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def machine_name(device: torch.device | str) -> str:
    """The GPU's name for a CUDA device (``"NVIDIA H200"``), else ``"cpu"``."""
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def record_stem(kind: str, machine: str, out: str | Path | None = None, date=None) -> Path:
    """``out/<kind>-<slug(machine)>-<date>`` (no suffix); ``out`` defaults to data/results."""
    day = date or _dt.date.today().isoformat()
    return Path(out or results_dir()) / f"{kind}-{slug(machine)}-{day}"


def newest_record(kind: str, directory: str | Path | None = None) -> Path | None:
    """The newest ``<kind>-*.json`` in ``directory`` (default data/results), or None."""
    d = Path(directory or results_dir())
    # Names end in the ISO date, so the last 10 characters of the stem sort by day.
    files = sorted(d.glob(f"{kind}-*.json"), key=lambda p: (p.stem[-10:], p.name))
    return files[-1] if files else None


def save_record(file_name: str, command: str, record: dict, out: str | Path | None = None) -> Path:
    """Write ``record`` with the command that made it, this machine and today's date as JSON
    ``out/file_name`` (``out`` defaults to data/results, created if missing). Returns the path."""
    out_dir = Path(out) if out else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / file_name
    payload = {
        "command": command,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} thread, torch {torch.__version__}",
        "date": _dt.date.today().isoformat(),
        **record,
    }
    path.write_text(json.dumps(payload, indent=1))
    return path


def save_figure(draw, path, **savefig) -> Path:
    """Save the figure ``draw()`` returns to ``path`` (``savefig``'s options; 100 dpi unless
    they say otherwise) and close it. Drawn with matplotlib's Agg backend, selected first, so
    that a command writes its PNG on a machine without a display. Returns ``Path(path)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = draw()
    fig.savefig(path, **{"dpi": 100, **savefig})
    plt.close(fig)
    return Path(path)


def load_average() -> float | None:
    """The 1-minute load average (None where the system does not report one)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def load_header(start: float | None, end: float | None, bound: float = LOAD_BOUND) -> dict:
    """A record's header fields for the load at the start and end of a run: ``load_average``
    ``{start, end, bound}``, ``load_changed`` (True when it moved by more than ``bound``) and,
    when it did, a ``warning`` saying the timings are not comparable."""
    changed = start is not None and end is not None and abs(end - start) > bound
    head: dict = {
        "load_average": {"start": start, "end": end, "bound": bound},
        "load_changed": changed,
    }
    if changed:
        head["warning"] = (
            f"the load average moved from {start:.2f} to {end:.2f} during the run (more than "
            f"{bound:g}): other work competed for the CPU, so these timings are not a result"
        )
    return head


def load_record(file_name: str, command: str, directory: str | Path | None = None) -> dict:
    """The stored JSON ``directory/file_name`` (default data/results). Raises
    FileNotFoundError naming ``command``, which makes it, when it is missing."""
    path = Path(directory or results_dir()) / file_name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; run: {command}")
    return json.loads(path.read_text())
