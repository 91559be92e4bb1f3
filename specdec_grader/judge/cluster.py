"""Grading beyond one machine: one Dask task per submission, on an existing cluster or a local one.

    specdec-grader subs/ --scheduler tcp://HOST:8786   # a running Dask scheduler
    specdec-grader subs/ --scheduler local:4           # a LocalCluster of 4 workers

Each task (:func:`grade_task`) grades one submission on a Dask worker exactly as the local
pool does: a :class:`.worker.Judge` process (one per worker thread, kept between tasks)
starts the notebook's kernel in that machine's sandbox (:func:`.sandbox.plan`, made once per
worker process, since bubblewrap's paths are that machine's), runs the checks and answers
with the result, which the client checks field by field (``SubmissionResult.from_dict``) as
it does a local worker's. Results stream back as tasks finish, in any order.

What a failure costs: a submission that kills or hangs its judge costs only itself (a
``crashed`` or ``timeout`` row, as locally). A Dask worker that dies (its machine is
preempted, say) loses the tasks it was running; the scheduler runs each of them again
elsewhere, up to ``distributed.scheduler.allowed-failures`` times (Dask's default: 3), and
then that submission alone gets a ``crashed`` row, flagged, which keeps every check a
worker had judged for it before: each is sent to the scheduler as soon as it is judged (a
Dask event on the task's own topic, :func:`grade_task`), where the client reads them back.

Every worker needs this package (the same version) and, for the sandbox, bubblewrap; the
client checks both before it submits anything. Needs ``dask[distributed]`` (the package's
``cluster`` extra).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
from collections.abc import Callable
from multiprocessing.connection import wait as _wait_conns
from typing import Any

from specdec_course import __version__

from ..student_side.results import CheckResult
from . import sandbox
from .jobs import Job, SubmissionResult
from .worker import Judge, keep_check, lost_result, orphans

__all__ = ["check_scheduler", "grade_task", "run_on_dask"]

_LOCAL = re.compile(r"local:(\d+)")
_INSTALL = "install it with: pip install 'specdec-course[cluster]' (dask[distributed])"

# Per Dask worker process: its sandbox plans (by mode) and one judge per worker thread.
_state_lock = threading.Lock()
_plans: dict[str, sandbox.Plan] = {}
_judges: dict[int, Judge] = {}
_before: set[int] | None = None


def check_scheduler(scheduler: str) -> None:
    """ValueError unless ``scheduler`` is ``"local:N"`` (N >= 1) or a scheduler address
    (``tcp://HOST:PORT``, ``tls://...``)."""
    if not isinstance(scheduler, str):
        raise ValueError(f"scheduler must be text; got {scheduler!r}")
    m = _LOCAL.fullmatch(scheduler)
    if m and int(m.group(1)) >= 1:
        return
    if "://" in scheduler and not scheduler.startswith("local"):
        return
    raise ValueError(
        "--scheduler must be the address of a running Dask scheduler (tcp://HOST:8786) or "
        f"local:N for a local cluster of N workers (N >= 1); got {scheduler!r}"
    )


def _plan(mode: str) -> sandbox.Plan:
    with _state_lock:
        if mode not in _plans:
            _plans[mode] = sandbox.plan(mode)
        return _plans[mode]


def worker_ready(sandbox_mode: str) -> dict[str, Any]:
    """Run on every Dask worker before grading: its package version and sandbox warnings,
    or the error that stops it from grading (a required sandbox that cannot run)."""
    try:
        plan = _plan(sandbox_mode)
        sandbox.refuse_unsandboxed(plan, sandbox_mode)
    except sandbox.NoSandbox as e:
        return {"version": __version__, "error": "; ".join(e.missing), "warnings": [], "no": 1}
    except RuntimeError as e:
        return {"version": __version__, "error": str(e), "warnings": []}
    return {"version": __version__, "error": "", "warnings": list(plan.warnings)}


def _publisher(topic: str | None, file: str) -> Callable[[dict[str, CheckResult]], None]:
    """What sends each newly judged check of ``file`` to the scheduler, as an event on
    ``topic`` (a no-op outside a Dask worker, or without a topic)."""
    worker = None
    if topic:
        with contextlib.suppress(ImportError, ValueError):
            from distributed import get_worker

            worker = get_worker()
    sent: set[str] = set()

    def publish(judged: dict[str, CheckResult]) -> None:
        for cid, check in list(judged.items()):
            if worker is not None and cid not in sent:
                sent.add(cid)
                with contextlib.suppress(Exception):  # the client then lacks it, no more
                    event = {"check": check.to_dict(), "file": file, "worker": worker.address}
                    worker.log_event(topic, event)

    return publish


def grade_task(
    job_dict: dict[str, Any], sandbox_mode: str, topic: str | None = None
) -> tuple[dict[str, Any], list[str]]:
    """One Dask task: grade one submission (a ``Job`` as a dict) on this worker.

    Returns ``(SubmissionResult as a dict, this worker's sandbox warnings)``. The judge
    process of this worker thread grades it (a fresh one if the last was lost), under the
    same hard deadline as the local pool; each check, once judged, also goes to the
    scheduler as an event on ``topic``, so that a worker that dies later does not take it
    along. Raises ``RuntimeError`` when the required sandbox cannot run here.
    """
    global _before
    job = Job.from_dict(job_dict)
    plan = _plan(sandbox_mode)
    sandbox.refuse_unsandboxed(plan, sandbox_mode)  # (a worker that joined after the check)
    key = threading.get_ident()
    with _state_lock:
        if _before is None:
            sandbox.set_subreaper()  # orphans of an unsandboxed kernel come back to us
            _before = sandbox.descendants(os.getpid())
        judge = _judges.get(key)
        if judge is None or judge.dead or not judge.alive:
            judge = _judges[key] = Judge.spawn(plan)
    publish = _publisher(topic, job.file)
    judge.send(job)
    while True:
        ready = _wait_conns([judge.conn], timeout=0.5)
        res, broken = judge.answer(bool(ready))
        publish(judge.judged)
        if res is None:
            continue
        if broken:
            judge.kill()
            with _state_lock:
                sandbox.kill_pids(orphans(_before, list(_judges.values())))
        elif judge.retire:  # the next task gets a fresh judge
            judge.stop()
            judge.dead = True
        return res.to_dict(), list(plan.warnings)


def stop_judges() -> int:
    """Run on every Dask worker after grading: end its idle judge processes (a long-lived
    cluster would otherwise keep them, and their memory, until it stops). Returns how many."""
    with _state_lock:
        judges = list(_judges.values())
        _judges.clear()
    for judge in judges:
        judge.stop()
    return len(judges)


def _client(scheduler: str):
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError as e:
        raise RuntimeError(
            f"--scheduler needs dask.distributed, which is missing; {_INSTALL}"
        ) from e
    m = _LOCAL.fullmatch(scheduler)
    if m:
        # One thread per worker: a worker grades one submission at a time, as a pool slot.
        cluster = LocalCluster(
            n_workers=int(m.group(1)), threads_per_worker=1, processes=True, dashboard_address=None
        )
        return Client(cluster), cluster
    try:
        return Client(scheduler, timeout="30s"), None
    except (OSError, TimeoutError) as e:
        raise RuntimeError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from e


def run_on_dask(
    queue: list[int],
    jobs: dict[int, Job],
    scheduler: str,
    sandbox_mode: str,
    finish: Callable[[int, SubmissionResult], None],
    ready: Callable[[], None] | None = None,
) -> list[str]:
    """Grade ``jobs[i]`` for every ``i`` in ``queue`` as Dask tasks; call ``ready()`` once
    every worker can grade, before any task, and ``finish(i, result)`` as each one ends.
    Returns the workers' sandbox warnings (each once).

    Raises ``RuntimeError`` when the cluster cannot be reached or has no worker, or a worker
    runs another version of the package; :class:`.sandbox.NoSandbox` when the sandbox
    cannot run on one.
    """
    from dask.distributed import as_completed

    client, cluster = _client(scheduler)
    warnings: list[str] = []
    try:
        client.wait_for_workers(1, timeout=120)
        answers = client.run(worker_ready, sandbox_mode)
        for address, info in answers.items():
            if info["version"] != __version__:
                raise RuntimeError(
                    f"Dask worker {address} runs specdec-course {info['version']}, this client "
                    f"{__version__}: install the same version on every worker"
                )
            if info["error"] and info.get("no"):
                raise sandbox.NoSandbox([f"on Dask worker {address}: {info['error']}"])
            if info["error"]:
                raise RuntimeError(f"on Dask worker {address}: {info['error']}")
            warnings += [w for w in info["warnings"] if w not in warnings]
        if ready is not None:
            ready()
        futures, run = {}, secrets.token_hex(8)
        for i in queue:
            # pure=False: two identical notebooks are two submissions, graded twice.
            topic = f"specdec-grade-{run}-{i}"
            fut = client.submit(grade_task, jobs[i].to_dict(), sandbox_mode, topic, pure=False)
            futures[fut] = (i, topic)
        for fut in as_completed(futures):
            i, topic = futures[fut]
            finish(i, _result(fut, jobs[i], warnings, _judged_on(client, topic)))
    finally:
        with contextlib.suppress(Exception):
            client.run(stop_judges)
        with contextlib.suppress(Exception):
            client.close()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close()
    return warnings


def _judged_on(client, topic: str) -> Callable[[], list[Any]]:
    """What the workers sent on ``topic`` (read only when a task is lost)."""

    def read() -> list[Any]:
        try:
            return [msg for _, msg in client.get_events(topic)]
        except Exception:  # noqa: BLE001 - a scheduler gone too: nothing kept
            return []

    return read


def _result(fut, job: Job, warnings: list[str], judged_on=list) -> SubmissionResult:
    """The row of a finished task: its result, checked, or a lost row saying why, with the
    checks that its workers had judged before (``judged_on()``: the task's events)."""
    from dask.distributed import KilledWorker

    def lost(message: str, flag: str = "") -> SubmissionResult:
        judged: dict[str, CheckResult] = {}
        for msg in judged_on():
            try:
                keep_check(job, judged, CheckResult.from_dict(msg["check"]))
            except (ValueError, TypeError, KeyError):  # not a check of this job: dropped
                continue
        res = lost_result(job, judged, "crashed", message)
        res.flags = [flag] if flag else []
        return res

    try:
        payload, worker_warnings = fut.result()
    except KilledWorker:
        return lost(
            "the Dask workers grading this submission died, every retry",
            "its Dask workers died while grading it, every retry (its judged checks kept)",
        )
    except Exception as e:  # noqa: BLE001 - a task that raised: that submission alone
        return lost(f"the Dask task failed: {type(e).__name__}: {e}")
    warnings += [w for w in worker_warnings if w not in warnings]
    try:
        return SubmissionResult.from_dict(payload)
    except (ValueError, TypeError, KeyError) as e:
        return lost(f"the grader got a malformed result ({e})")
