"""The copy scan, bounded: a notebook's code is read in a child process with its own CPU,
memory and wall-clock limits, and a notebook with more code than the grader reads is refused.

:func:`.copying.scan` parses every code cell and walks its tree; a notebook built to be
slow to parse (megabytes of code, thousands of nested attributes) would otherwise hold the
judge at full CPU before its kernel even starts. Here the scan runs in a forked child
(``RLIMIT_CPU``, ``RLIMIT_AS``, a wall deadline); a scan that does not finish within them
reads as tampering (the notebook's code cannot be read, so nothing it does can be judged
apart from the kernel's), said in the gradebook.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import resource
import select
import signal
import time

from .context import wall_backstop
from .copying import Findings, scan

__all__ = ["MAX_CODE_CHARS", "SCAN_CPU_S", "SCAN_MEMORY_MB", "bounded_scan", "too_much_code"]

# An honest notebook holds tens of kilobytes of code; a megabyte is data pasted into cells.
MAX_CODE_CHARS = 2**20
SCAN_CPU_S = 20
SCAN_MEMORY_MB = 1024


def too_much_code(cells: list[str]) -> str:
    """Why the notebook is refused ("" if it is not): its code cells are too long to read."""
    total = sum(len(c) for c in cells if isinstance(c, str))
    if total <= MAX_CODE_CHARS:
        return ""
    return (
        f"its code cells hold {total / 2**20:.1f} M characters, over the grader's limit of "
        f"{MAX_CODE_CHARS / 2**20:g} M: it is not graded (remove data or generated code "
        "pasted into cells; load data from a file instead)"
    )


def _vm_bytes() -> int:
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(w: int, cells, needs, answers, cpu_s: int, memory_mb: int) -> None:
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        if memory_mb:
            cap = _vm_bytes() + memory_mb * 2**20
            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            if hard != resource.RLIM_INFINITY:
                cap = min(cap, hard)
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        found = scan(cells, needs, answers)
        data = pickle.dumps((found.forwarders, found.flags, found.tampering))
        view = memoryview(data)
        while view:
            view = view[os.write(w, view) :]
        os._exit(0)
    except BaseException:  # noqa: BLE001 - memory or time ran out: the parent says so
        os._exit(3)


def bounded_scan(
    cells: list[str],
    needs,
    answers=(),
    *,
    cpu_s: int = SCAN_CPU_S,
    memory_mb: int = SCAN_MEMORY_MB,
) -> Findings:
    """:func:`.copying.scan` in a child process limited to ``cpu_s`` CPU seconds, about
    ``memory_mb`` MiB more memory than this process, and :func:`.context.wall_backstop` of
    ``cpu_s`` in wall time; a scan that breaks a limit gives a tampering finding."""
    with contextlib.suppress(Exception):  # once here, not once per child
        import IPython.core.inputtransformer2  # noqa: F401
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        _child(w, list(cells), set(needs), tuple(answers), int(cpu_s), int(memory_mb))
    os.close(w)
    chunks, deadline, timed_out = [], time.monotonic() + wall_backstop(cpu_s), False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([r], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(r, 2**20)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(r)
        if timed_out:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    found = Findings()
    if not timed_out and os.waitstatus_to_exitcode(status) == 0:
        with contextlib.suppress(Exception):
            forwarders, flags, tampering = pickle.loads(b"".join(chunks))
            found.forwarders, found.flags, found.tampering = forwarders, flags, tampering
            return found
    found.tamper(
        f"has code the copy scan could not read within its limits ({cpu_s} s of CPU, "
        f"{memory_mb} MiB)"
    )
    return found
