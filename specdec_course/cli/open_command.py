"""``specdec-course open``: the course in JupyterLab, from a working copy of its notebooks.

The lessons and exercises are committed executed. Opened in place, JupyterLab's autosave would
write every run's new outputs back into the clone, and the next ``git pull`` would conflict.
So the course is opened from a working copy: on first use ``lessons/``, ``exercises/`` and
``solutions/`` are copied into ``my-course/`` beside them (git-ignored); later runs copy only
what is missing there (a lesson added by a pull), never over the learner's own files.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

FOLDERS = ("lessons", "exercises", "solutions")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "open",
        help="open the course in JupyterLab from a working copy (my-course/)",
        description="Copy the course's notebooks into a working copy on first use (later: only "
        "the files it lacks; a learner's own files are never overwritten), then start "
        "JupyterLab there, showing the lessons, so that running them leaves the clone as it "
        "was. Arguments after -- go to JupyterLab (e.g. -- --allow-root as root, or "
        "-- --no-browser).",
    )
    p.add_argument("--dir", default="my-course", help="the working copy's folder")
    p.add_argument("--no-launch", action="store_true", help="make the copy, do not start Lab")
    p.add_argument("lab_args", nargs="*", metavar="JUPYTER_ARG", help="passed to jupyter lab")
    p.set_defaults(run=run)


def working_copy(repo: Path, dest: Path) -> list[Path]:
    """Copy ``repo``'s course folders into ``dest``, skipping files already there; returns the
    files copied. ValueError if ``repo`` holds no lessons."""
    if not (repo / "lessons").is_dir():
        raise ValueError(f"{repo} has no lessons/ folder: run this from the course's clone")
    copied = []
    for folder in FOLDERS:
        for src in sorted((repo / folder).rglob("*")):
            rel = src.relative_to(repo)
            if src.is_dir() or ".ipynb_checkpoints" in rel.parts or "__pycache__" in rel.parts:
                continue
            out = dest / rel
            if not out.exists():
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, out)
                copied.append(out)
    return copied


def run(args) -> int:
    from ..paths import REPO_ROOT

    dest = Path(args.dir)
    dest = dest if dest.is_absolute() else REPO_ROOT / dest
    copied = working_copy(REPO_ROOT, dest)
    print(f"working copy: {dest} ({len(copied)} file(s) copied; the clone stays as it is)")
    if args.no_launch:
        return 0
    import subprocess

    cmd = [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.root_dir={dest}",
           "--ContentsManager.preferred_dir=lessons", *args.lab_args]  # fmt: skip
    return subprocess.call(cmd)
