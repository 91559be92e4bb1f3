"""The batch grader's runner: read the submissions, run a pool of judges, keep every row.

Each worker (:func:`.worker.worker_main`, spawned once per pool slot, in its own process
group) grades one submission after another. The parent keeps a hard deadline per
submission and kills a worker that passes it or dies, then starts a fresh one: that
submission gets its row (``timeout`` or ``crashed``), and the others go on. Whatever
happens, when :func:`grade` returns no worker and no kernel is left, and nothing they
started: the parent is a child subreaper and kills what is left below it.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import secrets
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import wait as _wait_conns
from typing import Any

from .._validate import check_int
from . import sandbox
from .core import checks_for, exercises
from .discovery import collect, exercise_of
from .jobs import Job, SubmissionResult
from .reports import escape
from .results import CheckResult
from .worker import worker_main

__all__ = ["GradeRun", "collect", "exercise_of", "grade"]

# Starting a worker (it imports torch) and its first kernel, on a busy machine.
_STARTUP_GRACE_S = 120.0


class GradeRun(list):
    """The results of :func:`grade` (a list, in the order found), with the run's ``seed``
    and ``warnings`` (no sandbox here, say), for the reports."""

    seed: int | None = None
    warnings: list[str]


@dataclass
class _Worker:
    proc: Any  # a multiprocessing Process
    conn: Any  # its end of a duplex pipe
    index: int | None = None  # the submission it is grading
    job: Job | None = None
    start: float = 0.0
    deadline: float = math.inf
    dead: bool = False


def _check_args(workers, cell_timeout, notebook_timeout, memory_mb, seed) -> None:
    if workers is not None:
        check_int(workers, "workers")
    for name, v in (("cell_timeout", cell_timeout), ("notebook_timeout", notebook_timeout)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a number of seconds > 0; got {v!r}")
    check_int(memory_mb, "memory_mb (MiB; 0: no cap)", minimum=0)
    if 0 < memory_mb < 1024:
        raise ValueError(
            f"memory_mb={memory_mb} is too small for a kernel with torch; "
            "use 1024 or more (0: no cap)"
        )
    if seed is not None:
        check_int(seed, "seed", minimum=0)


def _lost(w: _Worker, status: str, message: str) -> SubmissionResult:
    job = w.job
    return SubmissionResult(
        job.file,
        job.exercise,
        job.failed_checks(status, message),
        [message, "the grading worker was lost"],
        time.monotonic() - w.start,
        seed=job.seed,
    )


def _spawn(ctx, plan: sandbox.Plan) -> _Worker:
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=worker_main, args=(child, plan.to_dict()), daemon=True)
    proc.start()
    child.close()
    return _Worker(proc, parent)


def _kill_worker(w: _Worker) -> None:
    # Its process group holds it and any unsandboxed kernel's children that stayed in it;
    # a sandbox dies with it (--die-with-parent), and its cgroups are emptied here.
    for kill in (lambda: os.killpg(w.proc.pid, 9), lambda: os.kill(w.proc.pid, 9)):
        try:
            kill()
            break
        except (ProcessLookupError, PermissionError, OSError):
            continue
    w.proc.join(timeout=5)
    with contextlib.suppress(OSError, ValueError):
        w.conn.close()
    w.dead, w.job, w.index = True, None, None
    sandbox.remove_cgroups(f"specdec-grade-{w.proc.pid}-")


def grade(
    paths: list[str | os.PathLike],
    *,
    exercise: str | None = None,
    workers: int | None = None,
    cell_timeout: float = 60.0,
    notebook_timeout: float = 300.0,
    memory_mb: int = 4096,
    progress: bool = True,
    seed: int | None = None,
    sandbox_mode: str = "auto",
) -> GradeRun:
    """Grade every notebook in ``paths`` (files or folders); results in the order found.

    ``exercise`` overrides the exercise each notebook is taken to be; ``workers`` submissions
    run at once (default: the number of CPUs); ``cell_timeout`` seconds per cell and per
    check, ``notebook_timeout`` seconds for all of a notebook's cells; ``memory_mb`` caps
    each submission's memory, all its processes together where a cgroup can be made (0: no
    cap). ``seed`` draws the checks' cases (default: a fresh random seed, in the results);
    ``sandbox_mode`` is ``"auto"``, ``"require"`` or ``"off"`` (:func:`.sandbox.plan`).
    ``progress`` prints one line per finished submission to stderr. Submissions are never
    modified.

    Raises ``FileNotFoundError`` for a missing path, ``ValueError`` for no notebooks, an
    unknown ``exercise`` or bad limits, ``RuntimeError`` when a required sandbox cannot run.
    Nothing a submission does raises.
    """
    _check_args(workers, cell_timeout, notebook_timeout, memory_mb, seed)
    if exercise is not None and exercise not in exercises():
        raise ValueError(f"exercise must be one of {', '.join(exercises())}; got {exercise!r}")
    subs = collect(paths)
    for s in subs:
        if s.problem:
            continue
        s.exercise, s.why_unknown = exercise_of(s, exercise)
    the_plan = sandbox.plan(sandbox_mode)
    run_seed = secrets.randbelow(2**31) if seed is None else int(seed)

    results: dict[int, SubmissionResult] = {}
    for i, s in enumerate(subs):
        if s.problem:
            ex = exercise or exercise_of(s)[0]
            checks = checks_for(ex) if ex else []
            res = SubmissionResult(s.display, ex, notes=[s.problem], seed=run_seed)
            res.checks = [
                CheckResult(c.id, c.title, "unreadable", 0.0, c.points, message=s.problem)
                for c in checks
            ]
            results[i] = res
        elif s.exercise is None:
            results[i] = SubmissionResult(s.display, None, notes=[s.why_unknown], seed=run_seed)
    queue = [i for i in range(len(subs)) if i not in results]
    jobs = {
        i: Job.for_submission(
            subs[i],
            cell_timeout=cell_timeout,
            notebook_timeout=notebook_timeout,
            memory_mb=memory_mb,
            seed=run_seed,
        )
        for i in queue
    }

    def finish(i: int, res: SubmissionResult) -> None:
        results[i] = res
        if progress:
            print(
                f"[{len(results)}/{len(subs)}] {escape(res.file)}: {res.points:g}/"
                f"{res.max_points:g} {escape(res.status)} ({res.seconds:.1f} s)",
                file=sys.stderr,
                flush=True,
            )

    sandbox.set_subreaper()
    before = sandbox.descendants(os.getpid())
    ctx = mp.get_context("spawn")
    pool: list[_Worker] = []
    try:
        n_workers = max(1, min(int(workers or os.cpu_count() or 1), len(queue)))
        pool = [_spawn(ctx, the_plan) for _ in range(n_workers if queue else 0)]
        while queue or any(w.job is not None for w in pool):
            for k, w in enumerate(pool):
                if w.dead and queue:
                    pool[k] = w = _spawn(ctx, the_plan)
                if w.job is None and not w.dead and queue:
                    i = queue.pop(0)
                    w.index, w.job, w.start = i, jobs[i], time.monotonic()
                    w.deadline = w.start + jobs[i].deadline_s + _STARTUP_GRACE_S
                    w.conn.send(("job", jobs[i].to_dict()))
            busy = [w for w in pool if w.job is not None]
            ready = _wait_conns([w.conn for w in busy], timeout=0.5)
            for w in busy:
                res, broken = _answer(w, w.conn in ready)
                if res is None:
                    continue
                i = w.index
                if broken:
                    _kill_worker(w)
                    sandbox.kill_pids(_orphans(before, pool))
                else:
                    w.job = w.index = None
                finish(i, res)
    finally:
        for w in pool:
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(("stop", None))
        for w in pool:
            w.proc.join(timeout=10)
            if w.proc.is_alive():
                _kill_worker(w)
            with contextlib.suppress(OSError, ValueError):
                w.conn.close()
        # Anything still below us that was not here before: a detached process of a kernel
        # that ran without a sandbox, say (a sandbox takes its processes along). Not
        # multiprocessing's own helper, which outlives a pool by design.
        sandbox.kill_pids(sandbox.descendants(os.getpid()) - before - _mp_helpers())
    out = GradeRun(results[i] for i in range(len(subs)))
    out.seed = run_seed
    out.warnings = list(the_plan.warnings)
    return out


def _answer(w: _Worker, ready: bool) -> tuple[SubmissionResult | None, bool]:
    """``(result, worker broken)`` for a busy worker: its answer, or a lost result when it
    died, sent nonsense or ran past its deadline; ``(None, False)`` while it works."""
    if ready:
        try:
            kind, payload = w.conn.recv()
        except (EOFError, OSError):
            return _lost(w, "crashed", "the grading worker died (out of memory?)"), True
        except Exception as e:  # noqa: BLE001 - an unpicklable message
            return _lost(w, "crashed", f"the grader got a malformed result ({e})"), True
        if kind != "result":
            return _lost(w, "crashed", "the grading worker sent nothing usable"), True
        try:
            return SubmissionResult.from_dict(payload), False
        except (ValueError, TypeError, KeyError) as e:
            return _lost(w, "crashed", f"the grader got a malformed result ({e})"), True
    if time.monotonic() > w.deadline:
        message = "the submission ran past the grader's hard limit and was killed"
        return _lost(w, "timeout", message), True
    return None, False


def _mp_helpers() -> set[int]:
    from multiprocessing import resource_tracker

    pid = getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)
    return {pid} if isinstance(pid, int) else set()


def _orphans(before: set[int], pool: list[_Worker]) -> set[int]:
    # Processes below us that are neither a worker nor below a live worker, nor old.
    keep = _mp_helpers()
    for w in pool:
        if w.proc.is_alive():
            keep |= {w.proc.pid} | sandbox.descendants(w.proc.pid)
    return sandbox.descendants(os.getpid()) - before - keep
