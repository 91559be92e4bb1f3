"""Where the time of ``grade --scheduler local:2`` goes, against ``--workers 2``, in one run.

    python tools/profile_dask_grading.py [N ...]        # class sizes, default: 4 12

For each class size N (exercise 01, half solved, half untouched) it grades the same folder
with the local pool of 2 judges and with a LocalCluster of 2 one-thread workers, the order
flipped from one size to the next so that a drifting machine hits both alike, and splits the
Dask run's wall time into its phases, measured from the client (``batch.grade`` unchanged;
the cluster module's functions are wrapped, never edited):

- ``start``: the LocalCluster and its client (scheduler, 2 nannies, 2 worker processes);
- ``ready``: ``client.run(worker_ready)`` (each worker imports the grader and plans its
  sandbox) up to the first task starting on a worker;
- ``grading``: first task start to last task end, with each task's own wall time on its
  worker (``task_s``, which includes the judge process's start-up on a worker's first task,
  as the pool's first job on each judge does) and the grader's per-submission seconds;
- ``idle``: per worker, the time between its tasks (scheduler round trips);
- ``close``: last task end to ``batch.grade`` returning (stop_judges, client and cluster close);
- CPU seconds of the Dask processes themselves (this process, which runs the scheduler and a
  LocalCluster's nannies, and the worker processes; judges and kernels excluded), sampled
  every 0.2 s;
- ``MALLOC_TRIM_THRESHOLD_`` as the judges see it: a nanny sets it (Dask's
  ``distributed.nanny.pre-spawn-environ``) in this process's own environment before it
  spawns a worker, and judges copy the environment they are started from;
- the bytes a task's arguments pickle to (the notebook travels inside the Job).

Prints one JSON object per class size and a summary line. Figures move with the machine's
load; quote them with the date.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import psutil

from specdec_grader.judge import batch, cluster

ROOT = Path(__file__).resolve().parent.parent
LIMITS = dict(cell_timeout=60, notebook_timeout=300, memory_mb=3000, progress=False, seed=11)
LOG = Path(tempfile.gettempdir()) / f"dask-profile-{os.getpid()}.jsonl"


def _make_class(folder: Path, n: int) -> None:
    solved = nbformat.read(ROOT / "solutions" / "ex01_residual.ipynb", as_version=4)
    untouched = nbformat.read(ROOT / "exercises" / "ex01_residual.ipynb", as_version=4)
    for i in range(n):
        nbformat.write(solved if i % 2 else untouched, folder / f"ex01_{i:02d}.ipynb")


def timed_grade_task(job_dict, sandbox_mode, log=str(LOG)):
    # Runs on the Dask worker (pickled by value from this script): the real task, timed.
    import os as _os
    import threading as _th
    import time as _t

    from specdec_grader.judge import cluster as _c

    had_judge = _th.get_ident() in _c._judges
    t0 = _t.time()
    out = _c.grade_task(job_dict, sandbox_mode)
    t1 = _t.time()
    with open(log, "a") as f:
        f.write(json.dumps({"pid": _os.getpid(), "t0": t0, "t1": t1, "had_judge": had_judge}))
        f.write("\n")
    return out


class _CpuSampler:
    """CPU seconds of a set of processes, the last value seen before each one ends."""

    def __init__(self):
        self.pids: dict[int, str] = {}
        self.last: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            for pid in list(self.pids):
                try:
                    ct = psutil.Process(pid).cpu_times()
                    self.last[pid] = ct.user + ct.system
                except psutil.Error:
                    pass
            self.stop.wait(0.2)

    def by_role(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, role in self.pids.items():
            out[role] = out.get(role, 0.0) + self.last.get(pid, 0.0)
        return {k: round(v, 2) for k, v in out.items()}


def _dask_run(subs: Path) -> dict:
    marks: dict[str, float] = {}
    finishes: list[float] = []
    sampler = _CpuSampler()
    real_client, real_run = cluster._client, cluster.run_on_dask
    real_task = cluster.grade_task

    def client(scheduler):
        t = time.time()
        c, lc = real_client(scheduler)
        c.wait_for_workers(2, timeout=120)
        marks["started"] = time.time()
        marks["start_s"] = marks["started"] - t
        for pid in c.run(os.getpid).values():
            sampler.pids[pid] = "worker processes"
            parent = psutil.Process(pid).ppid()
            if parent != os.getpid():  # a LocalCluster's nannies run in this process
                sampler.pids[parent] = "nannies"
        return c, lc

    def run_on_dask(queue, jobs, scheduler, mode, finish):
        import cloudpickle

        marks["bytes"] = statistics.median(
            len(cloudpickle.dumps((jobs[i].to_dict(), mode))) for i in queue
        )

        def fin(i, res):
            finishes.append(time.time())
            finish(i, res)

        out = real_run(queue, jobs, scheduler, mode, fin)
        marks["closed"] = time.time()
        return out

    LOG.unlink(missing_ok=True)
    trim_before = os.environ.get("MALLOC_TRIM_THRESHOLD_")
    main = psutil.Process()
    cpu0 = sum(main.cpu_times()[:2])
    sampler.thread.start()
    cluster._client, cluster.run_on_dask, cluster.grade_task = client, run_on_dask, timed_grade_task
    try:
        t0 = time.time()
        res = batch.grade([subs], scheduler="local:2", **LIMITS)
        wall = time.time() - t0
    finally:
        cluster._client, cluster.run_on_dask, cluster.grade_task = real_client, real_run, real_task
        sampler.stop.set()
    cpu_main = sum(main.cpu_times()[:2]) - cpu0
    tasks = [json.loads(line) for line in LOG.read_text().splitlines()]
    LOG.unlink(missing_ok=True)
    first = min(t["t0"] for t in tasks)
    last = max(t["t1"] for t in tasks)
    idle = []
    for pid in {t["pid"] for t in tasks}:
        mine = sorted((t["t0"], t["t1"]) for t in tasks if t["pid"] == pid)
        idle += [b[0] - a[1] for a, b in zip(mine, mine[1:])]
    return {
        "wall_s": round(wall, 1),
        "start_s": round(marks["start_s"], 1),
        "ready_s": round(first - marks["started"], 1),
        "grading_s": round(last - first, 1),
        "close_s": round(marks["closed"] - last, 1),
        "after_close_s": round(t0 + wall - marks["closed"], 1),
        "task_s_median": round(statistics.median(t["t1"] - t["t0"] for t in tasks), 2),
        "first_task_s": [round(t["t1"] - t["t0"], 1) for t in tasks if not t["had_judge"]],
        "idle_between_tasks_s_max": round(max(idle, default=0.0), 3),
        "idle_between_tasks_s_median": round(statistics.median(idle), 3) if idle else 0.0,
        "seconds_per_submission_median": round(statistics.median(r.seconds for r in res), 2),
        "malloc_trim_before_after": [trim_before, os.environ.get("MALLOC_TRIM_THRESHOLD_")],
        "dask_cpu_s": {"this process": round(cpu_main, 2)} | sampler.by_role(),
        "task_pickle_bytes": marks["bytes"],
        "points": sorted(r.points for r in res),
    }


def _pool_run(subs: Path) -> dict:
    trim = os.environ.get("MALLOC_TRIM_THRESHOLD_")  # left here by an earlier Dask run
    main = psutil.Process()
    cpu0 = sum(main.cpu_times()[:2])
    t0 = time.time()
    res = batch.grade([subs], workers=2, **LIMITS)
    wall = time.time() - t0
    return {
        "wall_s": round(wall, 1),
        "seconds_per_submission_median": round(statistics.median(r.seconds for r in res), 2),
        "client_cpu_s": round(sum(main.cpu_times()[:2]) - cpu0, 2),
        "malloc_trim": trim,
        "points": sorted(r.points for r in res),
    }


def main(sizes: list[int]) -> None:
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} cores", flush=True)
    for j, n in enumerate(sizes):
        with tempfile.TemporaryDirectory() as tmp:
            subs = Path(tmp) / "subs"
            subs.mkdir()
            _make_class(subs, n)
            order = ("pool", "dask") if j % 2 == 0 else ("dask", "pool")
            row: dict = {"N": n, "order": order}
            for how in order:
                row[how] = _pool_run(subs) if how == "pool" else _dask_run(subs)
            assert row["pool"]["points"] == row["dask"]["points"], "gradebooks differ"
            row["ratio_dask_over_pool"] = round(row["dask"]["wall_s"] / row["pool"]["wall_s"], 2)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [4, 12])
