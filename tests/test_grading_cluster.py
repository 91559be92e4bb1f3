"""Grading on Dask: the same gradebook as the local pool, a dead worker costs one retry, and
a submission whose workers die every retry keeps the checks judged before.

The tests use a ``LocalCluster`` of 2 one-thread worker processes, as an instructor's
``--scheduler local:2`` does; the last two start it themselves and pass its ``tcp://``
address, the path an existing cluster takes. Every submission is ex01's definitions only (the
solution's or the stub's, tests/graded_class.py): what is checked here is where and how a
notebook is graded, not the notebook.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import nbformat
import pytest
from graded_class import ex01_defs
from nbformat.v4 import new_code_cell

from specdec_grader.judge import batch

distributed = pytest.importorskip("dask.distributed", reason="needs dask[distributed]")

ROOT = Path(__file__).resolve().parent.parent
LIMITS = dict(cell_timeout=30, notebook_timeout=90, memory_mb=3000, progress=False, seed=11)


def _solved() -> nbformat.NotebookNode:
    """ex01's solution, definitions only: setup, imports, then its three functions."""
    return ex01_defs("solutions")


def _solved_and_untouched(folder: Path, n: int) -> None:
    solved = _solved()
    untouched = ex01_defs("exercises")
    for i in range(n):
        nbformat.write(solved if i % 2 else untouched, folder / f"ex01_{i:02d}.ipynb")


def test_dask_local_cluster_gives_the_same_gradebook_as_the_local_pool(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    _solved_and_untouched(subs, 2)
    dead = _solved()
    dead.cells.insert(2, new_code_cell("import os\nos._exit(1)"))  # kills its kernel
    nbformat.write(dead, subs / "ex01_kills_kernel.ipynb")
    books = {}
    for how, kw in (("pool", {"workers": 2}), ("dask", {"scheduler": "local:2"})):
        res = batch.grade([subs], **kw, **LIMITS)
        batch.write_csv(res, tmp_path / f"{how}.csv")
        batch.write_checks_csv(res, tmp_path / f"{how}.checks.csv")
        books[how] = res
    for name in ("{}.csv", "{}.checks.csv"):
        pool = (tmp_path / name.format("pool")).read_text()
        assert pool == (tmp_path / name.format("dask")).read_text()
    points = {Path(r.file).name: r.points for r in books["dask"]}
    assert points["ex01_01.ipynb"] == points["ex01_kills_kernel.ipynb"] == 10
    assert points["ex01_00.ipynb"] == 0
    assert books["dask"].warnings == books["pool"].warnings


def test_a_dask_worker_that_dies_costs_only_its_submission_a_retry(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    slow = _solved()
    slow.cells.insert(1, new_code_cell("import time\ntime.sleep(6)"))
    nbformat.write(slow, subs / "ex01_slow.ipynb")
    _solved_and_untouched(subs, 1)  # ex01_00: untouched
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    client = distributed.Client(cluster)
    out: dict = {}
    try:
        pids = client.run(os.getpid)
        grading = threading.Thread(
            target=lambda: out.setdefault(
                "res", batch.grade([subs], scheduler=cluster.scheduler_address, **LIMITS)
            )
        )
        grading.start()
        deadline = time.monotonic() + 120
        victim = None
        while victim is None and time.monotonic() < deadline:
            busy = [w for w, keys in client.processing().items() if keys]
            victim = busy[0] if busy else None
            time.sleep(0.2)
        assert victim is not None, "no grading task started within two minutes"
        time.sleep(2)  # the task is under way: its judge runs the notebook
        os.kill(pids[victim], signal.SIGKILL)
        grading.join(timeout=300)
        assert not grading.is_alive()
        # The nanny restarted the worker that died.
        assert pids[victim] not in client.run(os.getpid).values()
    finally:
        client.close()
        cluster.close()
    res = out["res"]
    assert [(Path(r.file).name, r.points, r.status) for r in res] == [
        ("ex01_00.ipynb", 0, "not attempted"),
        ("ex01_slow.ipynb", 10, "passed"),
    ]


# Slower than the solution's (16,000 calls, 2 ms each): the kill lands while it is checked.
SLOW_SAMPLER = """
import time
_fast_sample = speculative_sample
def speculative_sample(p, q, generator=None):
    time.sleep(0.002)
    return _fast_sample(p, q, generator=generator)
"""


def test_a_submission_whose_workers_die_every_retry_keeps_its_judged_checks(tmp_path):
    import dask

    subs = tmp_path / "subs"
    subs.mkdir()
    victim = _solved()
    at = next(
        i for i, c in enumerate(victim.cells) if c.source.startswith("def speculative_sample")
    )
    victim.cells.insert(at + 1, new_code_cell(SLOW_SAMPLER))  # after speculative_sample's cell
    nbformat.write(victim, subs / "ex01_victim.ipynb")
    _solved_and_untouched(subs, 2)  # ex01_00 untouched, ex01_01 solved: the classmates
    out: dict = {}
    # One death loses the task; each worker holds only the task it runs (no classmate queued
    # behind the victim, which would be lost with it).
    one = {
        "distributed.scheduler.allowed-failures": 0,
        "distributed.scheduler.worker-saturation": 1.0,
    }
    with dask.config.set(one):
        cluster = distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        )
        client = distributed.Client(cluster)
        try:
            pids = client.run(os.getpid)
            grading = threading.Thread(
                target=lambda: out.setdefault(
                    "res", batch.grade([subs], scheduler=cluster.scheduler_address, **LIMITS)
                )
            )
            grading.start()
            deadline, victim = time.monotonic() + 240, None
            while victim is None and time.monotonic() < deadline:
                for name, events in client.get_events().items():
                    checks = [m for _, m in events if isinstance(m, dict) and "check" in m]
                    mine = [m for m in checks if m["file"].endswith("ex01_victim.ipynb")]
                    # The victim's first check (its next one is slow), judged and sent.
                    if str(name).startswith("specdec-grade-") and [
                        (m["check"]["id"], m["check"]["points"]) for m in mine
                    ] == [("ex01.residual_distribution", 3)]:
                        victim = checks[0]["worker"]
                time.sleep(0.05)
            assert victim is not None, "no first check of the victim within four minutes"
            os.kill(pids[victim], signal.SIGKILL)
            grading.join(timeout=300)
            assert not grading.is_alive()
        finally:
            client.close()
            cluster.close()
    rows = {Path(r.file).name: r for r in out["res"]}
    lost = rows["ex01_victim.ipynb"]
    statuses = {c.id: (c.status, c.points) for c in lost.checks}
    assert statuses["ex01.residual_distribution"] == ("passed", 3)  # judged before: kept
    assert statuses["ex01.speculative_sample"] == ("crashed", 0)
    assert lost.points == 3 and "died" in lost.notes[0]
    assert any("Dask workers died" in f for f in lost.flags)
    assert (rows["ex01_00.ipynb"].points, rows["ex01_01.ipynb"].points) == (0, 10)
    # (ex01_01 is the solution: a near-copy of the course's, which is all it is flagged for)
    assert rows["ex01_00.ipynb"].flags == []
    assert all(f.startswith("a near-copy of ") for f in rows["ex01_01.ipynb"].flags)
