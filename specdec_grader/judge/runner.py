"""The batch grader's runner: read the submissions, run a pool of judges, keep every row.

Each worker (a :class:`.worker.Judge`, spawned once per pool slot, in its own process
group) grades one submission after another. The parent keeps a hard deadline per
submission and kills a worker that passes it or dies, then starts a fresh one: that
submission gets its row (``timeout`` or ``crashed``), and the others go on. Whatever
happens, when :func:`grade` returns no worker and no kernel is left, and nothing they
started: the parent is a child subreaper and kills what is left below it.

With ``scheduler`` set, the same jobs go to a Dask cluster instead (:mod:`.cluster`), one
task per submission, each graded by a judge on a Dask worker through the same
:class:`.worker.Judge`; the rows stream into the same results.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import sys
from multiprocessing.connection import wait as _wait_conns

from specdec_course._validate import check_int
from specdec_course.paths import REPO_ROOT

from ..student_side.results import CheckResult
from . import sandbox
from .cluster import check_scheduler, run_on_dask
from .core import checks_for, exercises
from .discovery import collect, disagreement, exercise_of
from .jobs import CELL_WALL_S, NOTEBOOK_WALL_S, Job, SubmissionResult
from .journal import Journal, submission_key
from .reports import escape
from .worker import Judge, orphans

__all__ = ["GradeRun", "collect", "exercise_of", "grade"]


class GradeRun(list):
    """The results of :func:`grade` (a list, in the order found), with the run's ``seed``,
    ``warnings`` (no cgroup here, say), ``sandbox`` (what the kernels ran in, as the
    gradebook says it), ``resumed`` (how many rows came from an interrupted run's journal)
    and ``journal`` (:class:`.journal.Journal`, or ``None``), for the reports."""

    seed: int | None = None
    warnings: list[str]
    sandbox: str = ""
    resumed: int = 0
    journal: Journal | None = None


def _check_args(workers, cell_timeout, notebook_timeout, memory_mb, seed, walls=()) -> None:
    if workers is not None:
        check_int(workers, "workers")
    times = [("cell_timeout", cell_timeout), ("notebook_timeout", notebook_timeout), *walls]
    for name, v in times:
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


def grade(
    paths: list[str | os.PathLike],
    *,
    exercise: str | None = None,
    workers: int | None = None,
    cell_timeout: float = 60.0,
    notebook_timeout: float = 300.0,
    memory_mb: int = 2048,
    progress: bool = True,
    seed: int | None = None,
    sandbox_mode: str = "auto",
    scheduler: str | None = None,
    solutions: list[str | os.PathLike] | None = None,
    journal: str | os.PathLike | None = None,
    cell_wall: float = CELL_WALL_S,
    notebook_wall: float = NOTEBOOK_WALL_S,
) -> GradeRun:
    """Grade every notebook in ``paths`` (files or folders); results in the order found.

    ``exercise`` overrides the exercise each notebook is taken to be; ``workers`` submissions
    run at once (default: the number of CPUs); ``cell_timeout`` seconds per cell and per
    check, ``notebook_timeout`` seconds for all of a notebook's cells (both CPU time where a
    cgroup counts it); ``cell_wall`` wall-clock seconds per cell and ``notebook_wall`` for all
    of a submission's grading (sleeping counts); ``memory_mb`` caps each submission's memory,
    all its processes together where a cgroup can be made (0: no cap), and the judge's work
    on it. Past a wall limit, the memory cap or the notebook's limit, the exercise scores 0,
    with a message that names the limit (:mod:`.submission`). ``seed`` draws the checks'
    cases (default: a fresh random seed, in the results); ``sandbox_mode`` is ``"auto"``,
    ``"require"``, ``"weak"`` or ``"off"`` (:func:`.sandbox.plan`: every mode but off refuses
    where bubblewrap cannot run, auto and require where no cgroup can be made).
    ``progress`` prints one line per finished submission to stderr. ``scheduler`` sends one
    task per submission to a Dask cluster instead of the local pool: ``"tcp://HOST:PORT"``
    (an existing scheduler; every worker needs this package and, for the sandbox,
    bubblewrap) or ``"local:N"`` (a ``LocalCluster`` of N one-thread workers); ``workers`` is
    then ignored. ``solutions``: folders of the course's solutions; a hard link to one of
    their files is not graded, and a near-copy of one of their notebooks is flagged
    (default: the course's own ``solutions/``, for hard links only). Submissions are never
    modified. ``journal``: the gradebook's path; each row is then on disk as soon as it is
    graded, and a run with the same options resumes an interrupted one (:mod:`.journal`).

    Raises ``FileNotFoundError`` for a missing path, ``ValueError`` for no notebooks, an
    unknown ``exercise``, bad limits, a bad ``scheduler`` or a journal of a run with other
    options, :class:`.sandbox.NoSandbox` (a ``RuntimeError``) before any notebook runs when
    no sandbox runs here or on a Dask worker (unless ``sandbox_mode`` is ``"off"``),
    ``RuntimeError`` when the cluster cannot be reached. Nothing a submission does raises.
    """
    walls = (("cell_wall", cell_wall), ("notebook_wall", notebook_wall))
    _check_args(workers, cell_timeout, notebook_timeout, memory_mb, seed, walls)
    if sandbox_mode not in sandbox.MODES:
        raise ValueError(f"sandbox must be one of {', '.join(sandbox.MODES)}; got {sandbox_mode!r}")
    if exercise is not None and exercise not in exercises():
        raise ValueError(f"exercise must be one of {', '.join(exercises())}; got {exercise!r}")
    if solutions is None:  # hard links to the course's own solutions only
        subs = collect(paths, [REPO_ROOT / "solutions"], compare=False)
    else:
        subs = collect(paths, list(solutions))
    for s in subs:
        if s.problem:
            continue
        s.exercise, s.why_unknown = exercise_of(s, exercise)
        why = disagreement(s, s.exercise)
        if why:
            s.flags.append(why)
    if scheduler is not None:
        check_scheduler(scheduler)
    the_plan = None
    if scheduler is None:  # (a Dask worker makes its own, and refuses the same way)
        the_plan = sandbox.plan(sandbox_mode)
        sandbox.refuse_unsandboxed(the_plan, sandbox_mode)
    log = None
    if journal is not None:
        options = {
            "exercise": exercise, "cell_timeout": cell_timeout,
            "notebook_timeout": notebook_timeout, "memory_mb": memory_mb,
            "cell_wall": cell_wall, "notebook_wall": notebook_wall,
            "sandbox": sandbox_mode, "scheduler": scheduler,
            "solutions": None if solutions is None else [str(p) for p in solutions],
            "submissions": sorted(submission_key(s) for s in subs),
        }  # fmt: skip
        log = Journal(journal, options, seed)
        seed = log.seed
    # 63 random bits: no case seed leads back to it (a 31-bit seed was found offline in
    # under a second from one case); the gradebook records it, and --seed replays a run.
    run_seed = secrets.randbits(63) if seed is None else int(seed)
    if log is not None:
        log.seed = run_seed

    results: dict[int, SubmissionResult] = {}
    keys = [submission_key(s) for s in subs]
    resumed = {i for i, k in enumerate(keys) if log is not None and k in log.done}
    for i in resumed:
        results[i] = log.done[keys[i]]
    fresh: set[int] = set()  # rows made here without grading, on disk once the run begins
    for i, s in enumerate(subs):
        if i in resumed:
            continue
        fresh.add(i)
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
        else:
            fresh.discard(i)
    queue = [i for i in range(len(subs)) if i not in results]
    jobs = {
        i: Job.for_submission(
            subs[i],
            cell_timeout=cell_timeout,
            notebook_timeout=notebook_timeout,
            memory_mb=memory_mb,
            seed=run_seed,
            cell_wall=cell_wall,
            notebook_wall=notebook_wall,
        )
        for i in queue
    }

    for i in fresh:
        results[i].flags = list(subs[i].flags) + results[i].flags

    def begin(where: str) -> None:  # the sandbox runs: the files start, and resumed rows
        if log is not None:
            log.begin(where, [results[i] for i in sorted(resumed)])
            for i in sorted(fresh):
                log.record(keys[i], results[i])
        if progress and resumed:
            print(
                f"resuming an interrupted run (journal {log.path}): {len(resumed)} of "
                f"{len(subs)} submissions graded already, seed {run_seed}",
                file=sys.stderr,
                flush=True,
            )

    def finish(i: int, res: SubmissionResult) -> None:
        res.flags = list(subs[i].flags) + [f for f in res.flags if f not in subs[i].flags]
        results[i] = res
        if log is not None and not res.timed_out():  # (the others after their re-run)
            log.record(keys[i], res)
        if progress:
            print(
                f"[{len(results)}/{len(subs)}] {escape(res.file)}: {res.points:g}/"
                f"{res.max_points:g} {escape(res.status)} ({res.seconds:.1f} s)",
                file=sys.stderr,
                flush=True,
            )

    if scheduler is None:
        where = the_plan.describe()
        begin(where)
        _run_pool(queue, jobs, workers, the_plan, finish)
        warnings = list(the_plan.warnings)
    else:
        kind = "none" if sandbox_mode == "off" else "bwrap"
        where = sandbox.Plan(kind, cgroup=sandbox_mode != "weak").describe()
        warnings = run_on_dask(queue, jobs, scheduler, sandbox_mode, finish, lambda: begin(where))

    # A check that ran out of time is graded again, alone (nothing else grading beside it),
    # before it is scored: a busy machine costs no one points. Both runs are in the
    # gradebook's time_limited column.
    # Within what is left of the submission's wall limit; none for one stopped by a limit.
    again = {
        i: jobs[i].only(results[i].timed_out(), results[i].seconds)
        for i in queue
        if results[i].timed_out() and not results[i].limit
    }

    def rerun_done(i: int, res: SubmissionResult) -> None:
        results[i].merge_rerun(res)
        if log is not None:
            log.record(keys[i], results[i])
        if progress:
            print(
                f"[re-run alone] {escape(res.file)}: {results[i].points:g}/"
                f"{results[i].max_points:g} {escape(results[i].status)}",
                file=sys.stderr,
                flush=True,
            )

    for i in again:  # one at a time
        if scheduler is None:
            _run_pool([i], again, 1, the_plan, rerun_done)
        else:
            run_on_dask([i], again, scheduler, sandbox_mode, rerun_done)
    out = GradeRun(results[i] for i in range(len(subs)))
    out.seed = run_seed
    out.warnings = warnings
    out.sandbox, out.resumed, out.journal = where, len(resumed), log
    return out


def _run_pool(queue: list[int], jobs: dict[int, Job], workers, the_plan, finish) -> None:
    """Grade ``jobs[i]`` for every ``i`` in ``queue`` on a pool of local judges."""
    sandbox.set_subreaper()
    before = sandbox.descendants(os.getpid())
    queue = list(queue)
    pool: list[Judge] = []
    try:
        n_workers = max(1, min(int(workers or os.cpu_count() or 1), len(queue)))
        pool = [Judge.spawn(the_plan) for _ in range(n_workers if queue else 0)]
        while queue or any(w.job is not None for w in pool):
            for k, w in enumerate(pool):
                if w.dead and queue:
                    pool[k] = w = Judge.spawn(the_plan)
                if w.job is None and not w.dead and queue:
                    i = queue.pop(0)
                    w.send(jobs[i], i)
            busy = [w for w in pool if w.job is not None]
            ready = _wait_conns([w.conn for w in busy], timeout=0.5)
            for w in busy:
                i = w.index
                res, broken = w.answer(w.conn in ready)
                if res is None:
                    continue
                if broken:
                    w.kill()
                    sandbox.kill_pids(orphans(before, pool))
                elif w.retire:  # a fresh judge for the next submission
                    w.stop()
                    w.dead = True
                finish(i, res)
    finally:
        for w in pool:
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(("stop", None))
        for w in pool:
            w.stop()
        # Anything still below us that was not here before: a detached process of a kernel
        # that ran without a sandbox, say (a sandbox takes its processes along).
        sandbox.kill_pids(orphans(before, []))
