"""The judge: grade one submission with its notebook in a sandboxed kernel.

1. Read the notebook (the runner already holds its text; nothing is read from the
   submissions folder here) and scan its source for copies (:mod:`.copying`).
2. Run its code cells one by one in a fresh kernel (:mod:`.session`), each with a time
   limit. A cell that raises or is interrupted is noted and the run goes on; a cell that
   kills the kernel, or will not stop, is noted and skipped, and the notebook is replayed in
   a fresh kernel without it: it costs only what it would have defined. A cell that passes
   its wall-clock limit (sleeping counts) or the memory cap, or cells that together pass the
   notebook's limits, stop the submission at once: the exercise scores 0, with a message that
   names the limit, and the worker goes on to the next submission.
3. Run every check of the exercise in this process, on the functions the notebook defined,
   found by name: each call goes to the kernel with arguments the check chose (cases drawn
   fresh from the run's seed) and comes back as plain data, which the check judges. Points
   and statuses come from the registry alone. A kernel lost during a check costs that check;
   the next one gets a fresh kernel with the notebook replayed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import nbformat

from . import context, withheld
from .context import wall_backstop
from .core import CheckResult, CheckSpec, checks_for, public_implementations, run_check
from .jobs import Job, SubmissionResult
from .remote import Remote
from .sandbox import Plan
from .scan_bounds import bounded_scan, too_much_code
from .session import KernelGone, Session

__all__ = ["grade_submission"]

# Kernels per submission: every loss while the cells run skips one cell for good, and every
# check may lose one; the notebook's time budget bounds the replays as well.
_MAX_STARTS_CAP = 64
_MAX_NOTES = 12


class _Notebook:
    """The notebook's code cells and a kernel that has run them (except the killers)."""

    def __init__(self, job: Job, plan: Plan, cells: list[str], seq: int):
        self.job, self.cells = job, cells
        limits = {
            "as": job.memory_mb * 2**20 if job.memory_mb else 0,
            "cpu": int(job.deadline_s) + 30,
            "nproc": 256,
            "fsize": 256 * 2**20,
            "nofile": 1024,
        }
        name = os.path.basename(job.file.replace("\\", "/")) or "submission.ipynb"
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:100]
        self.session = Session(
            plan,
            tag=f"specdec-grade-{os.getpid()}-{seq}",
            memory_mb=job.memory_mb,
            limits=limits,
            notebook_name=safe or "submission.ipynb",
            notebook_text=job.source,
            withhold=(job.exercise, public_implementations(job.exercise)),
        )
        self.max_starts = min(_MAX_STARTS_CAP, len(cells) + len(job.checks) + 1)
        self.skipped: set[int] = set()
        self.seen: set[int] = set()  # cells already run once (their notes are taken)
        self.notes: list[str] = []
        # The notebook's time: CPU seconds of its kernel (wall time where they cannot be
        # read), and a wall backstop for cells that wait.
        self.budget = job.notebook_timeout
        self.wall_budget = wall_backstop(job.notebook_timeout)
        self.stopped_at: int | None = None
        # The submission's wall-clock limit, from its start: cells, replays and checks.
        self.end = time.monotonic() + job.notebook_wall - job.wall_used
        self.limit, self.limit_status = "", ""  # the limit that stopped it, if one did
        self.names = job.limit_names()

    def stop(self, limit: str, status: str, where: str = "") -> None:
        """The submission passed ``limit`` (a key of :meth:`.jobs.Job.limit_names`)."""
        if not self.limit:
            self.limit = f"{where}passed {self.names[limit]}: the exercise scores 0"
            self.limit_status = status

    def note(self, text: str) -> None:
        if len(self.notes) < _MAX_NOTES:
            self.notes.append(text)

    def run(self) -> bool:
        """Start a kernel and run the cells; ``False`` if no kernel could be kept alive."""
        while self.session.starts < self.max_starts and not self.limit:
            try:
                self.session.start()
            except KernelGone as e:
                self.note(f"the kernel could not start: {e.why}")
                return False
            if self._run_cells():
                return True
        self.note(f"the kernel was lost {self.max_starts} times: the notebook could not be run")
        return False

    def _run_cells(self) -> bool:
        for i, source in enumerate(self.cells):
            if i in self.skipped or (self.stopped_at is not None and i >= self.stopped_at):
                continue
            first = i not in self.seen
            self.seen.add(i)
            where = f"code cell {i + 1} "
            if self.end - time.monotonic() <= 0:
                self.stop("notebook_wall", "timeout", where)
                return True
            if min(self.budget, self.wall_budget) <= 0:  # (CPU: it costs the cells left)
                self.stopped_at = i
                self.note(
                    f"the notebook ran past its {self.job.notebook_timeout:g} s limit and was "
                    f"stopped before code cell {i + 1}"
                )
                continue
            cell_wall = min(self.job.cell_wall, self.end - time.monotonic())
            wall = max(0.5, min(cell_wall, self.wall_budget))
            timeout = max(0.5, min(self.job.cell_timeout, self.budget, wall))
            clock = self._clock()
            try:
                reply = self.session.run_cell(source, timeout, wall)
            except KernelGone as e:
                self._spend(clock)
                if e.limit == "memory" or time.monotonic() - clock[0] >= wall:
                    # Killed by the memory cap, or past its wall limit and deaf to the alarm.
                    walls = "cell_wall" if wall >= self.job.cell_wall - 0.01 else "notebook_wall"
                    self.stop("memory" if e.limit == "memory" else walls, e.status, where)
                    return True
                self.skipped.add(i)
                what = (
                    f"ran past {timeout:g} s and did not stop when interrupted"
                    if e.status == "timeout"
                    else f"killed the kernel ({e.why})"
                )
                self.note(f"code cell {i + 1} {what}; the notebook was run again without it")
                return False
            self._spend(clock)
            err = reply.get("error")
            if isinstance(err, dict) and err.get("type") == "MemoryError":
                self.stop("memory", "error", where)
                return True
            if reply.get("timeout") and self._waited(clock, wall):
                # Its wall limit, not its CPU limit, and it used next to no CPU: it waited.
                walls = "cell_wall" if wall >= self.job.cell_wall - 0.01 else "notebook_wall"
                self.stop(walls, "timeout", where)
                return True
            if not first:
                continue
            if reply.get("timeout"):
                self.note(f"code cell {i + 1} ran past {timeout:g} s and was interrupted")
            elif withheld.named_in(reply.get("error")):
                # A lesson tool that uses a withheld function (ex10's block_verify): the cell
                # is only a demo, and the checks call the notebook's own functions.
                name = withheld.named_in(reply["error"])[0]
                self.note(
                    f"code cell {i + 1} used {name}, which the grader withholds while "
                    f"{self.job.exercise} is graded (it costs nothing: the checks call your "
                    "functions)"
                )
            elif isinstance(reply.get("error"), dict):
                err = reply["error"]
                text = str(err.get("message", "")).strip().split("\n")[0][:160]
                name = str(err.get("type", "Error"))
                self.note(
                    f"code cell {i + 1} raised {name}: {text}"
                    if text
                    else f"code cell {i + 1} raised {name}"
                )
        return True

    def _waited(self, clock: tuple[float, float | None], wall: float) -> bool:
        # Stopped by its wall limit while using under 5% of it in CPU time (where the CPU
        # time cannot be read, every stop at the wall limit counts): a starved computation
        # is stopped as its CPU limit would have, and costs only itself.
        t0, cpu0 = clock
        if time.monotonic() - t0 < wall - 0.25:
            return False
        cpu = self.session.cpu_seconds() if cpu0 is not None else None
        return cpu is None or cpu - cpu0 < 0.05 * wall

    def _clock(self) -> tuple[float, float | None]:
        return time.monotonic(), self.session.cpu_seconds()

    def _spend(self, clock: tuple[float, float | None]) -> None:
        t0, cpu0 = clock
        wall = time.monotonic() - t0
        cpu = self.session.cpu_seconds() if cpu0 is not None else None
        self.wall_budget -= wall
        self.budget -= wall if cpu is None else max(0.0, cpu - cpu0)

    def revive(self) -> bool:
        """A fresh kernel with the notebook replayed (after a check lost the kernel)."""
        if self.session.alive:
            return True
        self.budget = self.job.notebook_timeout  # a replay gets the notebook's time again
        self.wall_budget = wall_backstop(self.job.notebook_timeout)
        while self.session.starts < self.max_starts and not self.limit:
            try:
                self.session.start()
            except KernelGone:
                return False
            if self._run_cells():
                return not self.limit
        return False


def _lost_check(spec: CheckSpec, status: str, message: str) -> CheckResult:
    return CheckResult(
        spec.id, spec.title, status, 0.0, spec.points, message=message, hint=spec.hint
    )


def _tampered(spec: CheckSpec, why: str) -> CheckResult:
    return _lost_check(
        spec,
        "failed",
        f"the notebook {why}: the grader cannot tell its answers from the kernel's, so it "
        "scores 0 (flagged for the instructor, who decides)",
    )


def _judge(spec: CheckSpec, nb: _Notebook, forwarders: dict[str, str], job: Job) -> CheckResult:
    session = nb.session
    if not nb.revive():
        why = session.lost.why if session.lost else "it could not be started"
        return _lost_check(spec, "crashed", f"no kernel to check this function in: {why}")
    session.exposed.clear()
    try:
        info = session.describe(list(spec.needs))
    except KernelGone as e:
        return _lost_check(spec, e.status, f"the kernel was lost: {e.why}")
    absent = [n for n in spec.needs if not (info.get(n) or {}).get("defined")]
    if absent:
        note = "; ".join(nb.notes[:3])
        return _lost_check(
            spec,
            "missing",
            f"no {' or '.join(absent)} is defined: define a function with exactly that name"
            + (f"; {note}" if note else ""),
        )
    for n in spec.needs:
        module = str((info.get(n) or {}).get("module") or "")
        if n not in forwarders and module.split(".")[0] in ("specdec_course", "specdec_grader"):
            forwarders[n] = f"is the package's own object ({module})"
    copied = [n for n in spec.needs if n in forwarders]
    if copied:
        return _lost_check(
            spec,
            "failed",
            f"{copied[0]} {forwarders[copied[0]]}: it only forwards to the course package's "
            "reference instead of implementing it; write your own (flagged for the "
            "instructor: copy detection is best effort)",
        )
    remotes = [Remote(session, n, info[n]) for n in spec.needs]
    res = run_check(spec.id, *remotes, time_limit=job.cell_timeout, quiet=True)
    # The verdict is the judge's: points come from the registry, never from the kernel.
    res.points = spec.points if res.status == "passed" else 0.0
    return res


def grade_submission(
    job: Job, plan: Plan, seq: int = 0, on_check: Callable[[CheckResult], None] | None = None
) -> SubmissionResult:
    """Grade ``job`` (its notebook text, exercise, limits and seed) in kernels under ``plan``.

    Returns one result per check of the exercise, the notes on the notebook's cells and the
    copy-detection flags; ``on_check`` gets each check's result as soon as it is judged.
    Nothing the submission does raises; a grader bug may.
    """
    t0 = time.monotonic()
    result = SubmissionResult(job.file, job.exercise, seed=job.seed)
    wanted = {c[0] for c in job.checks}  # all of them, or those re-run alone
    specs = [s for s in checks_for(job.exercise) if s.id in wanted]
    try:
        nb_obj = nbformat.reads(job.source, as_version=4)
        nbformat.validate(nb_obj)
        cells = [c.source for c in nb_obj.cells if c.cell_type == "code"]
        if not all(isinstance(c, str) for c in cells):
            raise ValueError("a code cell's source is not text")
        too_much = too_much_code(cells)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the student's problem
        # The error's type only: its text may quote the file (which may be anyone's).
        reason = f"not a readable notebook ({type(e).__name__}; open it in Jupyter to see why)"
        result.checks = job.failed_checks("unreadable", reason)
        result.notes.append(reason)
        result.seconds = time.monotonic() - t0
        return result
    if too_much:
        result.checks = job.failed_checks("unreadable", too_much)
        result.notes.append(too_much)
        result.seconds = time.monotonic() - t0
        return result
    needs = {n for s in checks_for(job.exercise) for n in s.needs}
    findings = bounded_scan(cells, needs, public_implementations(job.exercise))
    nb = _Notebook(job, plan, cells, seq)
    try:
        if not findings.tampering:  # (tampering scores 0 without running anything)
            nb.run()
        with context.grading_seed(job.seed):
            for spec in specs:
                if nb.limit:  # past a limit: no check runs, the worker is freed
                    break
                if time.monotonic() > nb.end:
                    nb.stop("notebook_wall", "timeout", f"the grading, before check {spec.id}, ")
                    break
                forwarders = dict(findings.forwarders)
                if findings.tampering:
                    result.checks.append(_tampered(spec, findings.tampering[0]))
                    continue
                result.checks.append(_judge(spec, nb, forwarders, job))
                if on_check is not None:  # kept, should this worker be lost later
                    on_check(result.checks[-1])
                for n, why in forwarders.items():
                    findings.flag(f"{n} {why}")
    finally:
        nb.session.close()
    for name in sorted(nb.session.withheld_called):
        findings.flag(
            f"calls the course's own {name}, which its sandbox withholds while {job.exercise} "
            "is graded"
        )
    if nb.session.judge_memory:
        nb.stop("judge_memory", "error", "the judge's work on it ")
    result.notes = nb.notes
    result.flags = findings.flags
    if nb.limit:
        result.checks = job.failed_checks(nb.limit_status, nb.limit)
        result.stopped_by(nb.limit, nb.limit_status)
    result.seconds = time.monotonic() - t0
    return result
