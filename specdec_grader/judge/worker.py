"""The judge process: a worker that grades one submission after another, and its handle.

A :class:`Judge` is the parent's handle on one worker process (this module run as
``__main__``, see ``_BOOT``), started in its own process group with one end of a socket
pair (its descriptor in ``SPECDEC_JUDGE_FD``). The parent sends it jobs (``("job", Job as
a dict)``); the worker answers each with ``("result", SubmissionResult as a dict)`` and ends
on ``("stop", None)`` or when the socket closes. The local pool (:mod:`.runner`) keeps
several judges; a Dask task (:mod:`.cluster`) keeps one per worker thread: both grade
through :meth:`Judge.send` and :meth:`Judge.answer`, which turns a worker that died, sent
nonsense or ran past the hard deadline into a lost result, so that only that submission
pays.

A worker is a plain subprocess, not a ``multiprocessing.Process``: a Dask worker is a
daemonic process, which ``multiprocessing`` forbids to have children. It imports torch and
the exercise modules once, not once per submission, and never runs student code itself:
that runs in the kernels it starts (:mod:`.judge`), in a sandbox, as its children.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from specdec_course.devices import set_threads

from ..student_side.results import CheckResult
from .jobs import Job, SubmissionResult
from .sandbox import Plan, descendants, remove_cgroups, set_subreaper
from .submission import grade_submission

__all__ = ["Judge", "grade_job", "keep_check", "lost_result", "orphans", "worker_main"]

# How a judge started by Judge.spawn finds its end of the socket pair.
_FD_VAR = "SPECDEC_JUDGE_FD"
# How a judge starts: this module as __main__, with one import ruled out first. nbformat
# validates a notebook with jsonschema, whose import builds some forty IRI grammars when
# rfc3987_syntax is installed (it is, beside JupyterLab): about a second of CPU per judge, for
# format checks that validating a notebook never runs (nbformat asks for none).
_BOOT = (
    "import sys; sys.modules['rfc3987_syntax'] = None; import runpy; "
    "runpy.run_module('specdec_grader.judge.worker', run_name='__main__', alter_sys=True)"
)

# Starting a worker (it imports torch) and its first kernel, on a busy machine.
STARTUP_GRACE_S = 120.0


# The judge's own memory (its data segment: heap and anonymous maps), whatever a kernel asks
# of it: its size once started (torch, the checks) plus the job's memory cap (--memory-mb,
# 2 GiB by default) for its work on each submission, far above an honest check's need (the
# budgets of :mod:`.exposure` keep it so). Past it the check in hand fails with a
# MemoryError, the exercise scores 0, and a fresh judge grades the next submission.
JUDGE_MEMORY_MB = 2048
# A judge whose resident memory grew by more than this on one submission is replaced, so
# that the next submission does not share what it was driven to.
RETIRE_GROWTH_MB = 512


def _data_mb() -> float:
    """This process's data segment (``VmData``) in MiB (0 where it cannot be read)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmData:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def limit_memory(mb: int) -> None:
    """Cap this process's data segment at what it holds now plus ``mb`` MiB (soft limit; its
    kernels lift it)."""
    import resource

    with contextlib.suppress(ValueError, OSError):
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = int((_data_mb() + mb) * 2**20)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))


def _die_with_parent() -> None:
    # A grader killed outright (SIGKILL) takes its judges along, and they their kernels
    # (bubblewrap's --die-with-parent): a rerun resumes on a machine with nothing left over.
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PDEATHSIG
    if os.getppid() == 1:  # the parent died before that
        os._exit(1)


def grade_job(job: Job, plan: Plan, seq: int, on_check=None) -> SubmissionResult:
    """Grade ``job`` in kernels under ``plan``; a grader bug becomes a "crashed" result."""
    try:
        return grade_submission(job, plan, seq, on_check)
    except BaseException as e:  # noqa: BLE001 - always answer the parent
        if isinstance(e, KeyboardInterrupt):
            raise
        return SubmissionResult(
            job.file,
            job.exercise,
            job.failed_checks("crashed", f"the grader failed: {type(e).__name__}: {e}"),
            [f"the grader failed on this submission: {type(e).__name__}: {e}"],
            0.0,
            seed=job.seed,
        )


def worker_main(conn, plan_dict: dict[str, Any]) -> None:
    """The worker's loop: grade each job sent on ``conn`` with kernels under the plan."""
    try:
        os.setsid()  # our own process group: the parent can kill us and what we started
    except OSError:
        pass
    _die_with_parent()
    # Orphans of an unsandboxed kernel (a daemon that detached itself) come back to us, so
    # that cleanup finds them.
    set_subreaper()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"

    set_threads(1)  # the judge's share of the cores; the kernels have theirs
    plan = Plan.from_dict(plan_dict)
    seq = 0
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            return
        if kind != "job":
            return
        seq += 1

        def judged(check) -> None:  # each check as soon as it is judged
            with contextlib.suppress(OSError, ValueError):
                conn.send(("check", check.to_dict()))

        job = Job.from_dict(payload)
        limit_memory(job.memory_mb or JUDGE_MEMORY_MB)  # this submission's work
        peak = _peak_rss_mb()
        res = grade_job(job, plan, seq, judged)
        answer = res.to_dict()
        # (A submission stopped by a limit, the judge's memory cap included, retires it too.)
        answer["retire"] = bool(_peak_rss_mb() - peak > RETIRE_GROWTH_MB or res.limit)
        try:
            conn.send(("result", answer))
        except (OSError, ValueError):
            return
        if answer["retire"]:  # the parent starts a fresh judge for the next submission
            return


def keep_check(job: Job, judged: dict[str, CheckResult], check: CheckResult) -> None:
    """Keep ``check``, judged for ``job`` by a worker that may be lost later, in ``judged``;
    ``ValueError`` if it is no check of the job or claims more points than it is worth."""
    known = {cid: points for cid, _, points, _ in job.checks}
    if check.id not in known or not 0 <= check.points <= known[check.id]:
        raise ValueError(f"a result for no check of this job ({check.id!r})")
    judged[check.id] = check


def lost_result(
    job: Job, judged: dict[str, CheckResult], status: str, message: str, seconds: float = 0.0
) -> SubmissionResult:
    """The result of ``job`` when its worker was lost: the checks it had judged (``judged``),
    and 0 points with ``status`` and ``message`` for the others."""
    checks = [judged.get(c.id, c) for c in job.failed_checks(status, message)]
    notes = [message, "the grading worker was lost"]
    return SubmissionResult(job.file, job.exercise, checks, notes, seconds, seed=job.seed)


@dataclass
class Judge:
    """A worker process, the submission it is grading (if any) and that one's deadline."""

    proc: subprocess.Popen
    conn: Connection  # the parent's end of the socket pair
    index: int | None = None  # the caller's number for the submission it is grading
    job: Job | None = None
    start: float = 0.0
    deadline: float = math.inf
    dead: bool = False
    retire: bool = False  # it asked to be replaced (it was driven to use much memory)
    judged: dict[str, CheckResult] = field(default_factory=dict)  # checks already judged

    @classmethod
    def spawn(cls, plan: Plan) -> Judge:
        """Start a worker that grades under ``plan``. Raises ``OSError`` if it cannot start."""
        parent, child = socket.socketpair()
        env = dict(os.environ)
        # The package as this process sees it, even when it was not installed.
        import specdec_course

        here = [  # the folders holding specdec_grader/ and specdec_course/
            str(Path(__file__).resolve().parents[2]),
            str(Path(specdec_course.__file__).resolve().parents[1]),
        ]
        env["PYTHONPATH"] = os.pathsep.join(
            dict.fromkeys(p for p in (*here, env.get("PYTHONPATH")) if p)
        )
        env[_FD_VAR] = str(child.fileno())  # the judge's end of the socket pair
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT],
                stdin=subprocess.DEVNULL,
                pass_fds=(child.fileno(),),
                env=env,
            )
        finally:
            child.close()
        conn = Connection(parent.detach())
        conn.send(("plan", plan.to_dict()))
        return cls(proc, conn)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, job: Job, index: int | None = None) -> None:
        """Hand the worker ``job``; its hard deadline starts now."""
        self.index, self.job, self.start = index, job, time.monotonic()
        self.judged = {}
        self.deadline = self.start + job.deadline_s + STARTUP_GRACE_S
        self.conn.send(("job", job.to_dict()))

    def answer(self, ready: bool) -> tuple[SubmissionResult | None, bool]:
        """``(result, worker broken)`` once the busy worker answered (``ready``: its socket
        has data), died, sent nonsense or ran past its deadline; ``(None, False)`` while it
        works. The job is then done: a broken worker must be :meth:`kill`-ed."""
        res, broken = self._answer(ready)
        if res is not None and not broken:
            self.job = self.index = None
        return res, broken

    def _answer(self, ready: bool) -> tuple[SubmissionResult | None, bool]:
        if ready:
            try:
                kind, payload = self.conn.recv()
            except (EOFError, OSError):
                return self.lost("crashed", "the grading worker died (out of memory?)"), True
            except Exception as e:  # noqa: BLE001 - an unpicklable message
                return self.lost("crashed", f"the grader got a malformed result ({e})"), True
            if kind == "check":  # one check judged; the rest of the submission goes on
                try:
                    self._keep(CheckResult.from_dict(payload))
                except (ValueError, TypeError, KeyError) as e:
                    return self.lost("crashed", f"the grader got a malformed result ({e})"), True
                return None, False
            if kind != "result":
                return self.lost("crashed", "the grading worker sent nothing usable"), True
            try:
                self.retire = isinstance(payload, dict) and payload.get("retire") is True
                return SubmissionResult.from_dict(payload), False
            except (ValueError, TypeError, KeyError) as e:
                return self.lost("crashed", f"the grader got a malformed result ({e})"), True
        if time.monotonic() > self.deadline:
            message = "the submission ran past the grader's hard limit and was killed"
            return self.lost("timeout", message), True
        return None, False

    def _keep(self, check: CheckResult) -> None:
        keep_check(self.job, self.judged, check)

    def lost(self, status: str, message: str) -> SubmissionResult:
        """The result of the job in hand when the worker was lost: the checks it had judged
        already, and 0 points with the reason for the others."""
        elapsed = time.monotonic() - self.start
        return lost_result(self.job, self.judged, status, message, elapsed)

    def kill(self) -> None:
        """Kill the worker and what it started; empty its kernels' cgroups."""
        # Its process group holds it and any unsandboxed kernel's children that stayed in it;
        # a sandbox dies with it (--die-with-parent), and its cgroups are emptied here.
        for kill in (lambda: os.killpg(self.proc.pid, 9), lambda: os.kill(self.proc.pid, 9)):
            try:
                kill()
                break
            except (ProcessLookupError, PermissionError, OSError):
                continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        with contextlib.suppress(OSError, ValueError):
            self.conn.close()
        self.dead, self.job, self.index = True, None, None
        remove_cgroups(f"specdec-grade-{self.proc.pid}-")

    def stop(self) -> None:
        """Ask the worker to end; kill it if it has not within 10 seconds."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(("stop", None))
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        with contextlib.suppress(OSError, ValueError):
            self.conn.close()


def _mp_helpers() -> set[int]:
    from multiprocessing import resource_tracker

    pid = getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)
    return {pid} if isinstance(pid, int) else set()


def orphans(before: set[int], judges: list[Judge]) -> set[int]:
    """Processes below this one that were not there before (``before``), are no live judge
    and are not below one: what a lost judge or an unsandboxed kernel left behind. Not
    ``multiprocessing``'s own helper, which outlives a pool by design."""
    keep = _mp_helpers()
    for w in judges:
        if w.alive:
            keep |= {w.proc.pid} | descendants(w.proc.pid)
    return descendants(os.getpid()) - before - keep


def _main() -> None:
    conn = Connection(int(os.environ.pop(_FD_VAR)))
    kind, plan = conn.recv()
    if kind == "plan":
        worker_main(conn, plan)


if __name__ == "__main__":
    _main()
