"""Grading on Dask: the same gradebook as the local pool, and a dead worker costs one retry.

Both tests use a ``LocalCluster`` of 2 one-thread worker processes, as an instructor's
``--scheduler local:2`` does; the second starts it itself and passes its ``tcp://`` address,
the path an existing cluster takes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from specdec_course.grading.judge import batch

distributed = pytest.importorskip("dask.distributed", reason="needs dask[distributed]")

ROOT = Path(__file__).resolve().parent.parent
LIMITS = dict(cell_timeout=30, notebook_timeout=90, memory_mb=3000, progress=False, seed=11)


def _solved_and_untouched(folder: Path, n: int) -> None:
    solved = nbformat.read(ROOT / "solutions" / "ex01_residual.ipynb", as_version=4)
    untouched = nbformat.read(ROOT / "exercises" / "ex01_residual.ipynb", as_version=4)
    for i in range(n):
        nbformat.write(solved if i % 2 else untouched, folder / f"ex01_{i:02d}.ipynb")


def test_dask_local_cluster_gives_the_same_gradebook_as_the_local_pool(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    _solved_and_untouched(subs, 2)
    dead = nbformat.read(ROOT / "solutions" / "ex01_residual.ipynb", as_version=4)
    dead.cells.insert(3, new_code_cell("import os\nos._exit(1)"))  # kills its kernel
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
    slow = nbformat.read(ROOT / "solutions" / "ex01_residual.ipynb", as_version=4)
    slow.cells.insert(2, new_code_cell("import time\ntime.sleep(6)"))
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
