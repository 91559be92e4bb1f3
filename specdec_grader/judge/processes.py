"""The processes of a kernel: the record of one started (:class:`Started`, which stops it
and everything it left), the processes below the judge, and the cleanup of what a killed
judge left behind.

What the kernel runs under (bubblewrap, the plan, the binds) is :mod:`.sandbox`'s; this is
what stops it, whatever it ran under.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

from .cgroup import CGroup, kill_pids

__all__ = ["Started", "descendants", "kill_pids", "remove_cgroups", "set_subreaper"]


def set_subreaper() -> bool:
    """Make this process a child subreaper (Linux): orphans below it are re-parented to it,
    so that :func:`descendants` still finds a daemon that detached itself."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from ``/proc``; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def remove_cgroups(prefix: str) -> None:
    """Empty and remove every cgroup named ``prefix...`` (a killed judge's kernels)."""
    for cg in CGroup.named(prefix):
        cg.remove()


@dataclass
class Started:
    """A kernel process and what must go when it goes."""

    proc: subprocess.Popen
    to_kernel: int  # the judge's ends of the two pipes
    from_kernel: int
    cgroup: CGroup | None
    scratch: str | None  # the private folder of an unsandboxed kernel
    before: set[int] = field(default_factory=set)  # processes below the judge before it

    def stop(self) -> None:
        """Kill the kernel and everything it started; close the pipes; remove its traces."""
        for fd in (self.to_kernel, self.from_kernel):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # its session (unsandboxed kernels)
        with contextlib.suppress(OSError):
            self.proc.kill()
        if self.cgroup is not None:
            self.cgroup.remove()
        # Left behind by an unsandboxed kernel (a daemon that detached itself is still below
        # the judge, which is a subreaper); in a sandbox its PID namespace took them along.
        kill_pids(descendants(os.getpid()) - self.before - {self.proc.pid})
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            self.proc.wait(timeout=10)
        with contextlib.suppress(ChildProcessError, OSError):
            while os.waitpid(-1, os.WNOHANG)[0]:  # orphans re-parented to us
                pass
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
