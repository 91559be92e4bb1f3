"""The batch grader's worker process: one submission, run in a fresh kernel, then checked.

The parent (:mod:`.runner`) starts :func:`worker_main` with a :class:`~.jobs.Job` as a dict
and reads two kinds of message from the pipe: ``("kernel", pid)`` once the kernel is up (so
the parent can kill it), then ``("result", SubmissionResult as a dict)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core import BATCH_ENV, CheckResult
from .jobs import Job, SubmissionResult

__all__ = ["worker_main"]

_TIMEOUT_ENAME = "CellTimeout"


def _limit_memory(memory_mb: int) -> None:
    try:
        import resource
    except ImportError:  # not on Windows: grade without a cap there
        return
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core files from dying kernels
    if memory_mb > 0:
        # The cap on the address space is inherited by the kernel this process starts:
        # a submission that allocates without bound gets MemoryError (or its kernel dies)
        # instead of taking the machine down. macOS does not enforce RLIMIT_AS.
        lim = memory_mb * 2**20
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))


@dataclass
class _Run:
    """What running a notebook gave: how it ended, notes on its cells, the result lines."""

    state: str = "ok"  # or timeout, crashed, grading timeout, grading crashed
    notes: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # the grading cell's, nonce stripped


async def _execute(nb, tmp: Path, job: Job, conn) -> _Run:
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError
    from nbformat.v4 import new_code_cell

    cell_timeout = job.cell_timeout
    client = NotebookClient(
        nb,
        timeout=max(1, math.ceil(cell_timeout)),
        # On a timeout, interrupt the kernel once and go on with an error reply instead of
        # waiting: a cell that swallows KeyboardInterrupt then only delays the cells after it,
        # until the notebook's deadline.
        interrupt_on_timeout=True,
        error_on_timeout={"ename": _TIMEOUT_ENAME, "evalue": "interrupted", "traceback": []},
        allow_errors=True,
        kernel_name="python3",
        shutdown_kernel="immediate",
        shell_timeout_interval=1,
        iopub_timeout=2,
        resources={"metadata": {"path": str(tmp)}},
    )
    out = _Run()
    notes = out.notes
    # A timed-out cell gets an error *reply* but no error output; the hook sees both.
    failed: dict[int, str] = {}

    def on_error(cell, cell_index, execute_reply):
        c = execute_reply.get("content", {}) if execute_reply else {}
        value = str(c.get("evalue", "")).strip().split("\n")[0][:160]
        failed[cell_index] = f"{c.get('ename', 'Error')}: {value}" if value else c.get("ename", "")

    client.on_cell_error = on_error
    # The kernel's own chatter (ipykernel warnings) would drown the grader's progress lines.
    async with client.async_setup_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        pid = getattr(getattr(client.km, "provisioner", None), "pid", None)
        if pid:
            conn.send(("kernel", int(pid)))
        deadline = time.monotonic() + job.notebook_timeout
        code_no = 0
        for index, cell in enumerate(list(nb.cells)):
            if cell.cell_type != "code":
                continue
            code_no += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                out.state = "timeout"
                notes.append(
                    f"the notebook ran past its {job.notebook_timeout:g} s limit (a cell that "
                    f"ignores interrupts?) and was stopped before code cell {code_no}"
                )
                break
            client.timeout = max(1, math.ceil(min(cell_timeout, remaining)))
            try:
                await client.async_execute_cell(cell, index)
            except DeadKernelError:
                out.state = "crashed"
                notes.append(
                    f"the kernel died in code cell {code_no} (out of memory, os._exit "
                    "or a crash); nothing after it ran"
                )
                break
            err = failed.pop(index, None)
            if err is not None and err.startswith(_TIMEOUT_ENAME):
                notes.append(f"code cell {code_no} ran past {client.timeout} s and was interrupted")
                # Did the interrupt work? A cell that swallows KeyboardInterrupt keeps the
                # kernel busy, and nothing after it can run.
                probe = new_code_cell("pass")
                client.timeout = 5
                await client.async_execute_cell(probe, index)
                if failed.pop(index, "").startswith(_TIMEOUT_ENAME):
                    out.state = "timeout"
                    notes.append(
                        f"code cell {code_no} ignored the interrupt (it catches "
                        "KeyboardInterrupt?); the notebook was stopped there"
                    )
                    break
            elif err is not None:
                notes.append(f"code cell {code_no} raised {err}")
        if out.state != "ok":
            return out

        note = "; ".join(notes[:3])
        source = (
            "import specdec_course.grading._inkernel as _specdec_grader\n"
            f"_specdec_grader.report({job.exercise!r}, globals(), {job.nonce!r}, "
            f"{float(cell_timeout)!r}, {note!r})"
        )
        grading_cell = new_code_cell(source)
        nb.cells.append(grading_cell)
        # Each check stops itself after cell_timeout (SIGALRM in the kernel); this is the
        # limit for a kernel that is stuck where signals do not reach.
        client.timeout = math.ceil(len(job.checks) * cell_timeout + 30)
        try:
            await client.async_execute_cell(grading_cell, len(nb.cells) - 1)
        except DeadKernelError:
            out.state = "grading crashed"
        text = "".join(
            o.get("text", "")
            for o in grading_cell.get("outputs", [])
            if o.get("output_type") == "stream"
        )
        out.lines = [
            ln[len(job.nonce) + 1 :] for ln in text.splitlines() if ln.startswith(job.nonce + " ")
        ]
        err = failed.get(len(nb.cells) - 1)
        if err is not None and err.startswith(_TIMEOUT_ENAME):
            out.state = "grading timeout"
        elif err is not None:
            notes.append(f"the grading cell raised {err}")
    return out


def _grade(job: Job, conn) -> SubmissionResult:
    t0 = time.monotonic()
    os.environ[BATCH_ENV] = "1"
    # One thread per kernel: several kernels share the machine's cores.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    os.environ["MALLOC_ARENA_MAX"] = "2"  # fewer malloc arenas: less address space per thread
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    _limit_memory(job.memory_mb)

    result = SubmissionResult(job.file, job.exercise)
    tmp = Path(tempfile.mkdtemp(prefix="specdec-grade-"))
    try:
        copy = tmp / Path(job.path).name
        shutil.copyfile(job.path, copy)
        import nbformat

        try:
            nb = nbformat.read(copy, as_version=4)
            nbformat.validate(nb)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the student's problem
            msg = str(e).strip().split("\n")[0][:200]
            reason = f"not a readable notebook ({type(e).__name__}: {msg})"
            result.checks = job.failed_checks("unreadable", reason)
            result.notes.append(reason)
            return result

        out = asyncio.run(_execute(nb, tmp, job, conn))
        result.notes = out.notes
        got = {}
        for line in out.lines:
            try:
                r = CheckResult.from_dict(json.loads(line))
                got[r.id] = r
            except Exception:  # noqa: BLE001 - a mangled line counts as no result
                continue
        why = {
            "timeout": ("timeout", "; ".join(out.notes[-1:])),
            "crashed": ("crashed", "; ".join(out.notes[-1:])),
            "grading timeout": (
                "timeout",
                "the checks did not finish in time: this function loops forever, or the kernel "
                "was still busy with a cell that ignored its interrupt",
            ),
            "grading crashed": (
                "crashed",
                "the kernel died while this function was checked (out of memory?)",
            ),
            "ok": (
                "error",
                "the grading cell reported nothing for this check: " + "; ".join(out.notes[-1:]),
            ),
        }[out.state]
        result.checks = [got.get(c.id) or c for c in job.failed_checks(*why)]
        return result
    finally:
        result.seconds = time.monotonic() - t0
        shutil.rmtree(tmp, ignore_errors=True)


def worker_main(job_dict: dict[str, Any], conn) -> None:
    """The worker process: grade the job, send the result to the parent, always answer."""
    try:
        os.setsid()  # our own process group: the parent can kill us and nothing else
    except OSError:
        pass
    job = Job.from_dict(job_dict)
    try:
        res = _grade(job, conn)
    except BaseException as e:  # noqa: BLE001 - always answer the parent
        res = SubmissionResult(
            job.file,
            job.exercise,
            job.failed_checks("crashed", f"the grader failed: {type(e).__name__}: {e}"),
            [f"the grader failed on this submission: {type(e).__name__}: {e}"],
            0.0,
        )
    try:
        conn.send(("result", res.to_dict()))
    finally:
        conn.close()
