"""The batch grader's runner: find the submissions, run a pool of workers, kill the lost ones.

Each submission is graded by :func:`.worker.worker_main` in its own process (spawned, in its
own process group); the parent keeps a hard deadline per submission and kills a worker and
its kernel when it passes or when the worker dies.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import re
import secrets
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import wait as _wait_conns
from pathlib import Path
from typing import Any

from .._validate import check_int
from .core import checks_for, exercises
from .jobs import Job, Submission, SubmissionResult
from .worker import worker_main

__all__ = ["collect", "exercise_of", "grade"]

# Kernel start-up and teardown, on top of the notebook's and the grading cell's budgets,
# before the parent kills a worker that has not answered.
_STARTUP_GRACE_S = 90.0


# --------------------------------------------------------------------------- discovery


def collect(paths: list[str | os.PathLike]) -> list[Path]:
    """The notebooks named by ``paths``: files as given, folders searched recursively.

    Checkpoint folders (``.ipynb_checkpoints``) and hidden folders are skipped. Raises
    ``FileNotFoundError`` for a path that does not exist and ``ValueError`` when nothing is
    found or a file is not an ``.ipynb``.
    """
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise FileNotFoundError(f"submission path {str(p)!r} does not exist; check the name")
        if p.is_dir():
            for nb in sorted(p.rglob("*.ipynb")):
                rel = nb.relative_to(p).parts[:-1]
                if not any(part.startswith(".") for part in rel):
                    found.append(nb)
        elif p.suffix != ".ipynb":
            raise ValueError(
                f"submission {str(p)!r} is not a notebook (.ipynb); pass notebooks "
                "or folders of notebooks"
            )
        else:
            found.append(p)
    unique = list(dict.fromkeys(found))
    if not unique:
        raise ValueError(f"no .ipynb notebooks found in {', '.join(map(str, paths))}")
    return unique


def exercise_of(path: Path, override: str | None = None) -> tuple[str | None, str]:
    """Which exercise a notebook is: ``override``, else its metadata, else its file name.

    The exercise notebooks carry ``metadata.specdec_course.exercise``; a renamed copy still
    says ``ex01`` there. Failing that, ``ex01`` anywhere in the file name counts. Returns
    ``(exercise, "")`` or ``(None, reason)``.
    """
    known = exercises()
    if override is not None:
        return override, ""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))["metadata"]["specdec_course"]
        if meta.get("exercise") in known:
            return meta["exercise"], ""
    except Exception:  # noqa: BLE001 - unreadable notebooks fall back to the file name
        pass
    m = re.search(r"(?<![a-z0-9])(ex\d{2,})(?!\d)", path.name.lower())
    if m and m.group(1) in known:
        return m.group(1), ""
    return None, (
        f"cannot tell which exercise {path.name!r} is (no 'exNN' in its name or metadata); "
        f"pass --exercise, one of {', '.join(known)}"
    )


# --------------------------------------------------------------------------- the pool


@dataclass
class _Running:
    """A worker at work on a job: its process, its pipe, its kernel's pid once it says."""

    job: Job
    proc: Any  # a multiprocessing Process
    conn: Any  # the reading end of its pipe
    start: float
    deadline: float
    kernel: int | None = None


_LOST_NOTE = "the grading worker was lost"


def _lost(st: _Running, status: str, message: str) -> SubmissionResult:
    return SubmissionResult(
        st.job.file,
        st.job.exercise,
        st.job.failed_checks(status, message),
        [message, _LOST_NOTE],
        time.monotonic() - st.start,
    )


def _kill(pid: int | None) -> None:
    if not pid:
        return
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
            return
        except (ProcessLookupError, PermissionError, OSError):
            continue


def _check_args(workers, cell_timeout, notebook_timeout, memory_mb) -> None:
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


def grade(
    paths: list[str | os.PathLike],
    *,
    exercise: str | None = None,
    workers: int | None = None,
    cell_timeout: float = 60.0,
    notebook_timeout: float = 300.0,
    memory_mb: int = 4096,
    progress: bool = True,
) -> list[SubmissionResult]:
    """Grade every notebook in ``paths`` (files or folders); results in the order found.

    ``exercise`` overrides the exercise each notebook is taken to be; ``workers`` submissions
    run at once (default: the number of CPUs); ``cell_timeout`` seconds per cell and per
    check, ``notebook_timeout`` seconds for all of a notebook's cells; ``memory_mb`` caps each
    kernel's address space (0: no cap). ``progress`` prints one line per finished submission
    to stderr. Submissions are never modified.

    Raises ``FileNotFoundError`` for a missing path and ``ValueError`` for no notebooks, an
    unknown ``exercise`` or bad limits. Nothing a submission does raises.
    """
    _check_args(workers, cell_timeout, notebook_timeout, memory_mb)
    if exercise is not None and exercise not in exercises():
        raise ValueError(f"exercise must be one of {', '.join(exercises())}; got {exercise!r}")
    files = collect(paths)
    subs = [Submission(p, *exercise_of(p, exercise)) for p in files]
    workers = int(workers or os.cpu_count() or 1)

    results: dict[int, SubmissionResult] = {}
    for i, s in enumerate(subs):
        if s.exercise is None:
            results[i] = SubmissionResult(str(s.path), None, notes=[s.why_unknown])
    queue = [i for i in range(len(subs)) if i not in results]
    for s in {subs[i].exercise for i in queue}:
        checks_for(s)  # import the exercise modules once, here, before any worker starts

    ctx = mp.get_context("spawn")
    running: dict[int, _Running] = {}

    def finish(i: int, res: SubmissionResult) -> None:
        results[i] = res
        if progress:
            done = len(results)
            print(
                f"[{done}/{len(subs)}] {res.file}: {res.points:g}/{res.max_points:g} "
                f"{res.status} ({res.seconds:.1f} s)",
                file=sys.stderr,
                flush=True,
            )

    try:
        while queue or running:
            while queue and len(running) < workers:
                i = queue.pop(0)
                job = Job.for_submission(
                    subs[i],
                    cell_timeout=cell_timeout,
                    notebook_timeout=notebook_timeout,
                    memory_mb=memory_mb,
                    nonce="SPECDEC-" + secrets.token_hex(8),
                )
                r, w = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=worker_main, args=(job.to_dict(), w), daemon=True)
                proc.start()
                w.close()
                limit = notebook_timeout + len(job.checks) * cell_timeout + 40 + _STARTUP_GRACE_S
                now = time.monotonic()
                running[i] = _Running(job, proc, r, start=now, deadline=now + limit)
            ready = _wait_conns([st.conn for st in running.values()], timeout=0.5)
            for i, st in list(running.items()):
                res = None
                if st.conn in ready:
                    try:
                        kind, payload = st.conn.recv()
                    except (EOFError, OSError):
                        kind, payload = "dead", None
                    if kind == "kernel":
                        st.kernel = payload
                        continue
                    if kind == "result":
                        res = SubmissionResult.from_dict(payload)
                    else:
                        res = _lost(st, "crashed", "the grading worker died (out of memory?)")
                elif time.monotonic() > st.deadline:
                    res = _lost(
                        st,
                        "timeout",
                        "the submission ran past the grader's hard limit and was killed",
                    )
                if res is None:
                    continue
                if res.notes[-1:] == [_LOST_NOTE]:
                    # Only a lost worker leaves its kernel behind; a finished one shut it down
                    # (and its pid may already belong to another process).
                    _kill(st.kernel)
                st.proc.join(timeout=5)
                if st.proc.is_alive():
                    _kill(st.proc.pid)
                    st.proc.join(timeout=5)
                st.conn.close()
                del running[i]
                finish(i, res)
    finally:
        for st in running.values():  # interrupted (Ctrl-C): leave no kernel behind
            _kill(st.kernel)
            _kill(st.proc.pid)
    return [results[i] for i in range(len(subs))]
