"""What the judge takes from outside the checks, each attack of issue 27 as a test (fast:
no kernel is started here; tests/test_judge_sandbox.py runs the ones that need one).

- a symbolic link that leads out of the submissions folder (to ``solutions/``, to another
  class) is refused, one that stays inside is followed; two names of one file and two
  files with one text are flagged;
- a notebook whose metadata names another exercise than its file name is graded as its
  name says (the metadata is the student's to edit), and flagged;
- no message quotes a file's content (nbformat's error text may);
- the run's seed comes from ``secrets`` (63 bits) and is recorded; ``auto`` refuses where
  no cgroup can be made, unless ``weak`` is asked for; bubblewrap's root is read-only and
  the kernel's user is not root;
- every write to a kernel has a deadline; the judge's budgets refuse what a kernel asks
  beyond them; a lost worker keeps the checks it had judged.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import nbformat
import pytest
import torch

from specdec_course.model import CharGPT, GPTConfig
from specdec_grader.judge import batch, exposure, sandbox
from specdec_grader.judge.discovery import collect, disagreement, exercise_of
from specdec_grader.judge.exposure import Exposed
from specdec_grader.judge.jobs import Job
from specdec_grader.judge.submission import grade_submission
from specdec_grader.judge.worker import Judge
from specdec_grader.student_side import wire
from specdec_grader.student_side.results import CheckResult

ROOT = Path(__file__).resolve().parent.parent
SOLVED = nbformat.read(ROOT / "solutions" / "ex01_residual.ipynb", as_version=4)


def _by_name(subs):
    return {s.path.name: s for s in subs}


def test_links_out_of_the_submissions_folder_are_refused_inside_followed(tmp_path):
    folder = tmp_path / "subs"
    folder.mkdir()
    nbformat.write(SOLVED, folder / "alice_ex01.ipynb")
    os.symlink(ROOT / "solutions" / "ex01_residual.ipynb", folder / "mallory_ex01.ipynb")
    other = tmp_path / "other_class"
    other.mkdir()
    nbformat.write(SOLVED, other / "bob_ex01.ipynb")
    os.symlink(other / "bob_ex01.ipynb", folder / "eve_ex01.ipynb")
    os.symlink(folder / "alice_ex01.ipynb", folder / "alias_ex01.ipynb")
    subs = _by_name(collect([folder]))
    for name in ("mallory_ex01.ipynb", "eve_ex01.ipynb"):
        assert subs[name].source is None
        assert "leads out of the submissions folder" in subs[name].problem
    assert subs["alias_ex01.ipynb"].source == subs["alice_ex01.ipynb"].source
    assert any("the same file as" in f for f in subs["alias_ex01.ipynb"].flags)
    assert any("alias_ex01.ipynb" in f for f in subs["alice_ex01.ipynb"].flags)


def test_identical_submissions_are_flagged_and_different_ones_not(tmp_path):
    nbformat.write(SOLVED, tmp_path / "a_ex01.ipynb")
    nbformat.write(SOLVED, tmp_path / "b_ex01.ipynb")
    changed = copy.deepcopy(SOLVED)
    code = next(c for c in changed.cells if c.cell_type == "code")
    code.source += "\n# mine"  # (a change of the text only, markdown, is a near-copy)
    nbformat.write(changed, tmp_path / "c_ex01.ipynb")
    subs = _by_name(collect([tmp_path]))
    assert subs["a_ex01.ipynb"].flags == [f"identical to {tmp_path / 'b_ex01.ipynb'}"]
    assert subs["c_ex01.ipynb"].flags == []


def test_a_name_and_metadata_that_disagree_go_by_the_name_and_are_flagged(tmp_path):
    solved_ex08 = nbformat.read(ROOT / "solutions" / "ex08_dynamic_k.ipynb", as_version=4)
    path = tmp_path / "mallory_ex01.ipynb"
    nbformat.write(solved_ex08, path)
    (sub,) = collect([path])
    assert exercise_of(sub) == ("ex01", "")
    assert "metadata says ex08" in disagreement(sub, "ex01")
    renamed = tmp_path / "alice.ipynb"  # no exNN in the name: the metadata says
    nbformat.write(solved_ex08, renamed)
    (sub,) = collect([renamed])
    assert exercise_of(sub) == ("ex08", "") and disagreement(sub, "ex08") == ""


def test_an_unreadable_notebook_is_reported_without_its_content(tmp_path):
    secret = "the instructor's private key: hunter2"
    path = tmp_path / "x_ex01.ipynb"
    path.write_text('{"cells": [], "nbformat": 4, "oops": "' + secret + '"')
    (sub,) = collect([path])
    sub.exercise = "ex01"
    job = Job.for_submission(sub, cell_timeout=5, notebook_timeout=5, memory_mb=0, seed=1)
    res = grade_submission(job, sandbox.Plan("none"))
    text = " ".join([*res.notes, *(c.message for c in res.checks)])
    assert "not a readable notebook" in text and "hunter2" not in text and "private" not in text


def test_the_runs_seed_is_fresh_secret_and_recorded(tmp_path):
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "nobody.ipynb")  # no exercise
    seeds = {batch.grade([tmp_path], progress=False, sandbox_mode="off").seed for _ in range(4)}
    assert len(seeds) == 4 and max(seeds) >= 2**32  # (63 random bits: fails with p < 2^-120)
    run = batch.grade([tmp_path], progress=False, sandbox_mode="off", seed=12345)
    assert run.seed == 12345 and run[0].seed == 12345


def test_no_cgroup_refuses_unless_weak_is_asked_for(monkeypatch):
    monkeypatch.setattr(sandbox.CGroup, "available", classmethod(lambda cls: None))
    with pytest.raises(RuntimeError, match="--sandbox weak"):
        sandbox.plan("auto")
    with pytest.raises(RuntimeError, match="--sandbox weak"):
        sandbox.plan("require")
    weak = sandbox.plan("weak")
    assert any("cgroup" in w for w in weak.warnings)
    with pytest.raises(ValueError, match="sandbox must be"):
        sandbox.plan("strong")


@pytest.mark.skipif(sandbox.plan("weak").mode != "bwrap", reason="bubblewrap cannot run here")
def test_bubblewrap_root_is_read_only_and_the_kernel_is_not_root():
    opts = sandbox.plan("weak").bwrap
    assert ["--remount-ro", "/"] == opts[opts.index("--remount-ro", opts.index("--chdir") - 2) :][
        :2
    ]
    if "--unshare-user" in opts:
        assert opts[opts.index("--uid") + 1] != "0"
    # The package's path in the sandbox shows the student edition's tree, no judge side.
    package = sandbox.mounts.package_path()
    tree = opts[opts.index(package) - 1]
    assert opts[opts.index(package) - 2] == "--ro-bind" and tree.endswith("specdec_course")
    assert not os.path.exists(os.path.join(tree, "grading", "judge"))


def test_a_write_to_a_kernel_that_stops_reading_has_a_deadline():
    r, w = os.pipe()
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            wire.write_frame(w, {"op": "x"}, [b"\0" * (8 * 2**20)], time.monotonic() + 0.3)
        # load-independent: a hang guard, 100 times the 0.3 s deadline (a hang never returns)
        assert time.monotonic() - t0 < 30
        assert os.get_blocking(w)  # (left as it was)
    finally:
        os.close(r)
        os.close(w)


def test_the_judges_budgets_refuse_what_a_kernel_asks_beyond_them():
    cfg = GPTConfig(vocab_size=11, block_size=32, n_layer=1, n_head=2, n_embd=8)
    model = CharGPT(cfg).eval()
    ex = Exposed()
    ex.clear()
    ref = ex.export(model, may_call=True)["$ref"][0]
    new_cache, _ = ex.getattr(ref, "new_cache")
    mref = ex.for_results(new_cache)["$ref"][0]
    with pytest.raises(ValueError, match="1 .. 16 rows"):
        ex.call(mref, (65536,), {})
    for _ in range(exposure.MAX_CACHE_ROWS_PER_CHECK // 16):
        ex.call(mref, (16,), {})
    with pytest.raises(ValueError, match="cache rows"):
        ex.call(mref, (1,), {})
    with pytest.raises(ValueError, match="tokens"):
        ex.call(ref, (torch.zeros(4096, 2, dtype=torch.long),), {})
    ex.clear()  # a new check, a new budget
    ref = ex.export(model, may_call=True)["$ref"][0]
    assert ex.call(ref, (torch.zeros(1, 3, dtype=torch.long),), {}).shape == (1, 3, 11)


def test_a_lost_worker_keeps_the_checks_it_had_judged():
    (sub,) = collect([ROOT / "solutions" / "ex01_residual.ipynb"])
    sub.exercise = "ex01"
    job = Job.for_submission(sub, cell_timeout=5, notebook_timeout=5, memory_mb=0, seed=1)
    judge = Judge(proc=None, conn=None)
    judge.job, judge.start = job, time.monotonic()
    first = job.checks[0]
    judge._keep(CheckResult(first[0], first[1], "passed", first[2], first[2]))
    with pytest.raises(ValueError):
        judge._keep(CheckResult("ex01.nothing", "", "passed", 99.0, 99.0))
    res = judge.lost("timeout", "the submission ran past the grader's hard limit")
    assert [c.status for c in res.checks] == ["passed", "timeout", "timeout"]
    assert res.points == first[2]
