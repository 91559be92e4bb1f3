"""Author and execute the course notebooks.

    python tools/nb.py build SRC.py OUT.ipynb     # percent-format script -> notebook
    python tools/nb.py export NB.ipynb SRC.py     # notebook -> percent-format script
    python tools/nb.py execute NB.ipynb [...]     # run in place, as CI's nbval will

Percent format: ``# %%`` starts a code cell, ``# %% [markdown]`` a markdown cell whose lines
are written as ``# text``; ``# %% tags=["nbval-ignore-output"]`` gives a code cell metadata tags
(how nbval is told that a cell's output is live, e.g. a wall-clock timing: never a comment in
the code a learner reads). Notebooks are executed top to bottom in a fresh kernel with the
notebook's folder as working directory, so that strict nbval in CI sees the same outputs.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import nbformat

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def build(src: Path, out: Path) -> None:
    cells, kind, buf, tags = [], None, [], []

    def flush():
        if kind is None:
            return
        text = "\n".join(buf).strip("\n")
        if kind == "markdown":
            text = "\n".join(
                l[2:] if l.startswith("# ") else l.lstrip("#") for l in text.split("\n")
            )
            cells.append(nbformat.v4.new_markdown_cell(text))
        else:
            cell = nbformat.v4.new_code_cell(text)
            if tags:
                cell.metadata["tags"] = list(tags)
            cells.append(cell)

    for line in src.read_text().split("\n"):
        if line.startswith("# %%"):
            flush()
            kind, buf = ("markdown" if "[markdown]" in line else "code"), []
            tags = json.loads(line.split("tags=", 1)[1]) if "tags=" in line else []
        else:
            buf.append(line)
    flush()
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = KERNELSPEC
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, out)


def export(nb_path: Path, out: Path) -> None:
    nb = nbformat.read(nb_path, as_version=4)
    parts = []
    for c in nb.cells:
        if c.cell_type == "markdown":
            body = "\n".join(("# " + l) if l else "#" for l in c.source.split("\n"))
            parts.append("# %% [markdown]\n" + body)
        else:
            tags = c.metadata.get("tags")
            head = f"# %% tags={json.dumps(tags)}" if tags else "# %%"
            parts.append(head + "\n" + c.source)
    out.write_text("\n\n".join(parts) + "\n")


def execute(nb_path: Path) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(nb_path, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        record_timing=False,  # per-cell timestamps would make every re-run a diff
        resources={"metadata": {"path": str(nb_path.parent)}},
    ).execute()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    seconds = time.perf_counter() - t0
    nb.metadata["kernelspec"] = KERNELSPEC
    nbformat.write(nb, nb_path)
    if nb_path.resolve().parent == RUN_RECORD.parent.parent / "lessons":
        record_run_time(nb_path.name, seconds)
    print(f"{nb_path}: executed in {seconds:.1f}s")


# What executing each lesson took here: the run time that a lesson's stated time includes
# (tools/lesson_time.py adds it to the reading estimate). Written by ``execute``.
RUN_RECORD = Path(__file__).resolve().parent / "lesson_run_seconds.json"


def record_run_time(name: str, seconds: float) -> None:
    """Store ``seconds`` as lesson ``name``'s run time, labelled with this machine."""
    import os
    import platform

    rec = json.loads(RUN_RECORD.read_text()) if RUN_RECORD.exists() else {"seconds": {}}
    rec["clock"] = "wall, the whole notebook in a fresh kernel (tools/nb.py execute)"
    rec["threads"] = os.environ.get("OMP_NUM_THREADS", "torch's default")
    rec["machine"] = f"{platform.machine()}, {os.cpu_count()} cores"
    rec["seconds"][name] = round(seconds, 1)
    rec["seconds"] = dict(sorted(rec["seconds"].items()))
    RUN_RECORD.write_text(json.dumps(rec, indent=1) + "\n")


def main(argv: list[str]) -> None:
    cmd, *rest = argv
    if cmd == "build":
        build(Path(rest[0]), Path(rest[1]))
    elif cmd == "export":
        export(Path(rest[0]), Path(rest[1]))
    elif cmd == "execute":
        for p in rest:
            execute(Path(p))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
