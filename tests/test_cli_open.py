"""``specdec-course open``: the course runs from a working copy, so the clone stays clean."""

from __future__ import annotations

import subprocess
import sys

from specdec_course.cli import build_parser
from specdec_course.cli.open_command import working_copy
from specdec_course.paths import REPO_ROOT


def test_the_working_copy_holds_every_notebook_and_never_overwrites_the_learners(tmp_path):
    dest = tmp_path / "my-course"
    first = working_copy(REPO_ROOT, dest)
    lessons = sorted(p.name for p in (REPO_ROOT / "lessons").glob("*.ipynb"))
    assert sorted(p.name for p in (dest / "lessons").glob("*.ipynb")) == lessons
    assert (dest / "exercises").is_dir() and (dest / "solutions").is_dir()
    assert len(first) >= len(lessons)
    mine = dest / "lessons" / lessons[0]
    mine.write_text("my own run")
    (dest / "exercises" / "ex01_residual.ipynb").unlink()
    again = working_copy(REPO_ROOT, dest)
    assert again == [dest / "exercises" / "ex01_residual.ipynb"]  # only what was missing
    assert mine.read_text() == "my own run"


def test_jupyterlab_arguments_follow_a_double_dash():
    args = build_parser().parse_args(["open", "--no-launch", "--", "--allow-root", "--ip=0"])
    assert args.lab_args == ["--allow-root", "--ip=0"] and args.dir == "my-course"


def test_open_makes_the_copy_and_leaves_the_clone_as_it_was(tmp_path):
    before = subprocess.run(["git", "status", "--porcelain", "lessons", "exercises"],
                            cwd=REPO_ROOT, capture_output=True, text=True).stdout  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-c", "import sys; from specdec_course.cli import main; sys.exit(main())",
         "open", "--no-launch", "--dir",
         str(tmp_path / "c")], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "working copy" in r.stdout and (tmp_path / "c" / "lessons").is_dir()
    after = subprocess.run(["git", "status", "--porcelain", "lessons", "exercises"],
                           cwd=REPO_ROOT, capture_output=True, text=True).stdout  # fmt: skip
    assert after == before
