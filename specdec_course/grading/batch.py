"""Grade a class: run each submitted notebook in a fresh kernel, then its checks, by name.

    specdec-course grade submissions/ --out grades.csv [--junit grades.xml] [--workers 4]

``grades.csv`` has one row per submission and exercise (the gradebook); ``grades.checks.csv``
beside it has one row per check, with the reason for every lost point.

Each submission is graded in its own worker process, several at a time. The worker copies
the notebook to a temporary folder (the submission is never modified), starts a kernel with
a memory cap, runs every code cell with nbclient (errors do not stop the run; a cell that
runs past ``cell_timeout`` is interrupted), then runs one extra cell that looks the exercise's
functions up in the kernel's globals and checks them (:mod:`._inkernel`). So the grade does not
depend on which cells the student kept, deleted, moved or duplicated, only on the functions
that exist at the end.

Whatever a submission does, the batch goes on: invalid JSON ("unreadable"), a cell that
raises, an endless loop (interrupted; the notebook as a whole is stopped at
``notebook_timeout``), a kernel that dies or runs out of memory ("crashed"), a notebook that
defines nothing ("missing"). Each gets 0 for what it lacks, with the reason in the message.
The parent process also keeps a hard deadline per submission and kills the worker and its
kernel when it passes.

Not a security sandbox: the submission runs as the grading user, like nbgrader and otter.
Grade untrusted work in a container or a throw-away account.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import math
import multiprocessing as mp
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from multiprocessing.connection import wait as _wait_conns
from pathlib import Path
from typing import Any

from .core import BATCH_ENV, CheckResult, checks_for, exercises

__all__ = [
    "Submission",
    "SubmissionResult",
    "collect",
    "exercise_of",
    "format_summary",
    "grade",
    "write_csv",
    "write_checks_csv",
    "checks_csv_path",
    "write_junit",
]

CSV_FIELDS = ["file", "exercise", "points", "max_points", "status", "message"]
CHECK_CSV_FIELDS = ["file", "exercise", "check", "points", "max_points", "status", "message"]

# Kernel start-up and teardown, on top of the notebook's and the grading cell's budgets,
# before the parent kills a worker that has not answered.
_STARTUP_GRACE_S = 90.0


@dataclass
class Submission:
    path: Path
    exercise: str | None
    why_unknown: str = ""


@dataclass
class SubmissionResult:
    """The grade of one submission: one :class:`CheckResult` per check of its exercise."""

    file: str
    exercise: str | None
    checks: list[CheckResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def points(self) -> float:
        return sum(c.points for c in self.checks)

    @property
    def max_points(self) -> float:
        return sum(c.max_points for c in self.checks)

    @property
    def status(self) -> str:
        """ "passed" when every check passed, else the first non-passing check's status."""
        if not self.checks:
            return "unknown exercise"
        bad = [c.status for c in self.checks if c.status != "passed"]
        return bad[0] if bad else "passed"


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


# --------------------------------------------------------------------------- one submission


def _specs(exercise: str) -> list[list[Any]]:
    # What a worker needs to know about the checks, without importing the exercise module
    # (and torch) in every worker process.
    return [[s.id, s.title, s.points, s.hint] for s in checks_for(exercise)]


def _failed_checks(specs: list[list[Any]], status: str, message: str) -> list[CheckResult]:
    return [
        CheckResult(cid, title, status, 0.0, points, message=message, hint=hint)
        for cid, title, points, hint in specs
    ]


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


def _cell_error(cell) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            value = str(out.get("evalue", "")).strip().split("\n")[0][:160]
            return f"{out.get('ename', 'Error')}: {value}" if value else out.get("ename", "Error")
    return None


_TIMEOUT_ENAME = "CellTimeout"


async def _execute(nb, tmp: Path, job: dict, conn) -> dict[str, Any]:
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError
    from nbformat.v4 import new_code_cell

    cell_timeout = job["cell_timeout"]
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
    notes: list[str] = []
    out: dict[str, Any] = {"notes": notes, "lines": [], "state": "ok"}
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
        deadline = time.monotonic() + job["notebook_timeout"]
        code_no = 0
        for index, cell in enumerate(list(nb.cells)):
            if cell.cell_type != "code":
                continue
            code_no += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                out["state"] = "timeout"
                notes.append(
                    f"the notebook ran past its {job['notebook_timeout']:g} s limit (a cell that "
                    f"ignores interrupts?) and was stopped before code cell {code_no}"
                )
                break
            client.timeout = max(1, math.ceil(min(cell_timeout, remaining)))
            try:
                await client.async_execute_cell(cell, index)
            except DeadKernelError:
                out["state"] = "crashed"
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
                    out["state"] = "timeout"
                    notes.append(
                        f"code cell {code_no} ignored the interrupt (it catches "
                        "KeyboardInterrupt?); the notebook was stopped there"
                    )
                    break
            elif err is not None:
                notes.append(f"code cell {code_no} raised {err}")
        if out["state"] != "ok":
            return out

        note = "; ".join(notes[:3])
        source = (
            "import specdec_course.grading._inkernel as _specdec_grader\n"
            f"_specdec_grader.report({job['exercise']!r}, globals(), {job['nonce']!r}, "
            f"{float(cell_timeout)!r}, {note!r})"
        )
        grading_cell = new_code_cell(source)
        nb.cells.append(grading_cell)
        # Each check stops itself after cell_timeout (SIGALRM in the kernel); this is the
        # limit for a kernel that is stuck where signals do not reach.
        client.timeout = math.ceil(len(job["checks"]) * cell_timeout + 30)
        try:
            await client.async_execute_cell(grading_cell, len(nb.cells) - 1)
        except DeadKernelError:
            out["state"] = "grading crashed"
        text = "".join(
            o.get("text", "")
            for o in grading_cell.get("outputs", [])
            if o.get("output_type") == "stream"
        )
        out["lines"] = [
            ln[len(job["nonce"]) + 1 :]
            for ln in text.splitlines()
            if ln.startswith(job["nonce"] + " ")
        ]
        err = failed.get(len(nb.cells) - 1)
        if err is not None and err.startswith(_TIMEOUT_ENAME):
            out["state"] = "grading timeout"
        elif err is not None:
            notes.append(f"the grading cell raised {err}")
    return out


def _grade_in_worker(job: dict, conn) -> dict[str, Any]:
    t0 = time.monotonic()
    exercise = job["exercise"]
    os.environ[BATCH_ENV] = "1"
    # One thread per kernel: several kernels share the machine's cores.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    os.environ["MALLOC_ARENA_MAX"] = "2"  # fewer malloc arenas: less address space per thread
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    _limit_memory(job["memory_mb"])

    result: dict[str, Any] = {"file": job["file"], "exercise": exercise, "notes": []}
    tmp = Path(tempfile.mkdtemp(prefix="specdec-grade-"))
    try:
        copy = tmp / Path(job["path"]).name
        shutil.copyfile(job["path"], copy)
        import nbformat

        try:
            nb = nbformat.read(copy, as_version=4)
            nbformat.validate(nb)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the student's problem
            msg = str(e).strip().split("\n")[0][:200]
            reason = f"not a readable notebook ({type(e).__name__}: {msg})"
            result["checks"] = [
                c.to_dict() for c in _failed_checks(job["checks"], "unreadable", reason)
            ]
            result["notes"].append(reason)
            return result

        out = asyncio.run(_execute(nb, tmp, job, conn))
        result["notes"] = out["notes"]
        got = {}
        for line in out["lines"]:
            try:
                r = CheckResult.from_dict(json.loads(line))
                got[r.id] = r
            except Exception:  # noqa: BLE001 - a mangled line counts as no result
                continue
        why = {
            "timeout": ("timeout", "; ".join(out["notes"][-1:])),
            "crashed": ("crashed", "; ".join(out["notes"][-1:])),
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
                "the grading cell reported nothing for this check: " + "; ".join(out["notes"][-1:]),
            ),
        }[out["state"]]
        checks = [got.get(c.id) or c for c in _failed_checks(job["checks"], *why)]
        result["checks"] = [c.to_dict() for c in checks]
        return result
    finally:
        result["seconds"] = time.monotonic() - t0
        shutil.rmtree(tmp, ignore_errors=True)


def _worker_main(job: dict, conn) -> None:
    try:
        os.setsid()  # our own process group: the parent can kill us and nothing else
    except OSError:
        pass
    try:
        res = _grade_in_worker(job, conn)
    except BaseException as e:  # noqa: BLE001 - always answer the parent
        res = {
            "file": job["file"],
            "exercise": job["exercise"],
            "seconds": 0.0,
            "notes": [f"the grader failed on this submission: {type(e).__name__}: {e}"],
            "checks": [
                c.to_dict()
                for c in _failed_checks(
                    job["checks"], "crashed", f"the grader failed: {type(e).__name__}: {e}"
                )
            ],
        }
    try:
        conn.send(("result", res))
    finally:
        conn.close()


def _kill(pid: int | None) -> None:
    if not pid:
        return
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
            return
        except (ProcessLookupError, PermissionError, OSError):
            continue


# --------------------------------------------------------------------------- the batch


def _check_args(workers, cell_timeout, notebook_timeout, memory_mb) -> None:
    if workers is not None and (
        isinstance(workers, bool) or int(workers) != workers or workers < 1
    ):
        raise ValueError(f"workers must be a whole number >= 1; got {workers!r}")
    for name, v in (("cell_timeout", cell_timeout), ("notebook_timeout", notebook_timeout)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a number of seconds > 0; got {v!r}")
    if not (isinstance(memory_mb, int) and memory_mb >= 0):
        raise ValueError(
            f"memory_mb must be a whole number of MiB >= 0 (0: no cap); got {memory_mb!r}"
        )
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
    running: dict[int, dict[str, Any]] = {}

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
                s = subs[i]
                specs = _specs(s.exercise)
                n_checks = len(specs)
                job = {
                    "checks": specs,
                    "file": str(s.path),
                    "path": str(s.path.resolve()),
                    "exercise": s.exercise,
                    "cell_timeout": float(cell_timeout),
                    "notebook_timeout": float(notebook_timeout),
                    "memory_mb": int(memory_mb),
                    "nonce": "SPECDEC-" + secrets.token_hex(8),
                }
                r, w = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_worker_main, args=(job, w), daemon=True)
                proc.start()
                w.close()
                limit = notebook_timeout + n_checks * cell_timeout + 40 + _STARTUP_GRACE_S
                running[i] = {
                    "proc": proc,
                    "conn": r,
                    "kernel": None,
                    "start": time.monotonic(),
                    "deadline": time.monotonic() + limit,
                    "job": job,
                }
            ready = _wait_conns([st["conn"] for st in running.values()], timeout=0.5)
            for i, st in list(running.items()):
                res = None
                if st["conn"] in ready:
                    try:
                        kind, payload = st["conn"].recv()
                    except (EOFError, OSError):
                        kind, payload = "dead", None
                    if kind == "kernel":
                        st["kernel"] = payload
                        continue
                    if kind == "result":
                        res = _from_payload(payload)
                    else:
                        res = _lost(st, "crashed", "the grading worker died (out of memory?)")
                elif time.monotonic() > st["deadline"]:
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
                    _kill(st["kernel"])
                st["proc"].join(timeout=5)
                if st["proc"].is_alive():
                    _kill(st["proc"].pid)
                    st["proc"].join(timeout=5)
                st["conn"].close()
                del running[i]
                finish(i, res)
    finally:
        for st in running.values():  # interrupted (Ctrl-C): leave no kernel behind
            _kill(st["kernel"])
            _kill(st["proc"].pid)
    return [results[i] for i in range(len(subs))]


def _from_payload(d: dict[str, Any]) -> SubmissionResult:
    return SubmissionResult(
        d["file"],
        d["exercise"],
        [CheckResult.from_dict(c) for c in d.get("checks", [])],
        list(d.get("notes", [])),
        float(d.get("seconds", 0.0)),
    )


_LOST_NOTE = "the grading worker was lost"


def _lost(st: dict[str, Any], status: str, message: str) -> SubmissionResult:
    job = st["job"]
    return SubmissionResult(
        job["file"],
        job["exercise"],
        _failed_checks(job["checks"], status, message),
        [message, _LOST_NOTE],
        time.monotonic() - st["start"],
    )


# --------------------------------------------------------------------------- reports


def write_csv(results: list[SubmissionResult], path: str | os.PathLike) -> None:
    """The gradebook: one row per submission and exercise.

    Columns: file, exercise, points, max_points, status ("passed" or the first non-passing
    check's status), message (the first problem, prefixed by its check id, and the notes
    that explain it). A notebook whose exercise is unknown gets status "unknown exercise".
    """
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in results:
            first = next((c for c in r.checks if c.status != "passed"), None)
            message = f"{first.id}: {first.message}" if first else ""
            if not r.checks:
                message = "; ".join(r.notes)
            w.writerow(
                [r.file, r.exercise or "", f"{r.points:g}", f"{r.max_points:g}", r.status, message]
            )


def checks_csv_path(path: str | os.PathLike) -> Path:
    """Where the per-check CSV goes: ``grades.csv`` -> ``grades.checks.csv``."""
    p = Path(path)
    return p.with_name(p.stem + ".checks" + (p.suffix or ".csv"))


def write_checks_csv(results: list[SubmissionResult], path: str | os.PathLike) -> None:
    """One row per submission and check: file, exercise, check, points, max_points, status,
    message. A notebook whose exercise is unknown gets one row with status "unknown exercise".
    """
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CHECK_CSV_FIELDS)
        for r in results:
            if not r.checks:
                w.writerow([r.file, "", "", 0, 0, "unknown exercise", "; ".join(r.notes)])
            for c in r.checks:
                w.writerow(
                    [
                        r.file,
                        r.exercise,
                        c.id,
                        f"{c.points:g}",
                        f"{c.max_points:g}",
                        c.status,
                        "" if c.status == "passed" else c.message,
                    ]
                )


def write_junit(results: list[SubmissionResult], path: str | os.PathLike) -> None:
    """JUnit XML: one test suite per submission, one test case per check."""
    root = ET.Element("testsuites", name="specdec-course grade")
    for r in results:
        suite = ET.SubElement(
            root,
            "testsuite",
            name=r.file,
            tests=str(max(1, len(r.checks))),
            failures=str(sum(c.status == "failed" for c in r.checks)),
            errors=str(
                sum(c.status not in ("passed", "failed") for c in r.checks) + (0 if r.checks else 1)
            ),
            time=f"{r.seconds:.3f}",
        )
        if not r.checks:
            tc = ET.SubElement(suite, "testcase", classname=r.file, name="exercise")
            ET.SubElement(tc, "error", message="; ".join(r.notes))
        for c in r.checks:
            tc = ET.SubElement(
                suite,
                "testcase",
                classname=f"{r.file}.{r.exercise}",
                name=c.id,
                time=f"{c.seconds:.3f}",
            )
            ET.SubElement(tc, "properties")
            if c.status == "failed":
                ET.SubElement(tc, "failure", message=c.message, type=c.status).text = c.report()
            elif c.status != "passed":
                ET.SubElement(tc, "error", message=c.message, type=c.status).text = c.report()
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def format_summary(results: list[SubmissionResult]) -> str:
    """The terminal table: one line per submission with points, status and the first problem."""
    rows = [("file", "exercise", "points", "status", "first problem")]
    for r in results:
        first = next((c for c in r.checks if c.status != "passed"), None)
        problem = f"{first.id}: {first.message}" if first else ""
        if not r.checks:
            problem = "; ".join(r.notes)
        rows.append(
            (
                r.file,
                r.exercise or "?",
                f"{r.points:g}/{r.max_points:g}",
                r.status,
                problem if len(problem) <= 90 else problem[:87] + "...",
            )
        )
    widths = [max(len(row[k]) for row in rows) for k in range(4)]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(row[k].ljust(widths[k]) for k in range(4)) + "  " + row[4])
        if n == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 13)
    return "\n".join(lines)
