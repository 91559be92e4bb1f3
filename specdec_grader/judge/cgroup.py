"""Cgroups for the sandbox: one per kernel, capping the memory and the processes of all of a
submission's processes together (v2, else v1 memory + pids), its CPU at one core (v2
``cpu.max``, v1 CFS quota) where the cpu controller can be had, and counting its CPU time
(v2 ``cpu.stat``, v1 ``cpuacct.usage``); and the killing of what is in one. Membership is
inherited by every child, ``setsid()`` or not, so a submission's detached spinners share its
one core. Split from :mod:`.sandbox`, which uses them."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

__all__ = ["CGroup", "kill_pids"]


# The CPU a kernel may use: one core (a CFS quota of one period per period).
CPU_PERIOD_US = 100_000
CPU_QUOTA_US = 100_000
_V1_CPU = ("cpu", "cpuacct")


class CGroup:
    """A cgroup (v2, else v1 memory + pids [+ cpu, cpuacct]) capping memory, processes and
    CPU of one kernel. ``cpu_capped``: the one-core cap holds; :meth:`cpu_seconds` is the
    CPU time of everything in it (``None`` where it cannot be read)."""

    def __init__(self, dirs: list[Path], cpu_capped: bool = False, usage: Path | None = None):
        self.dirs = dirs
        self.cpu_capped = cpu_capped
        self.usage = usage  # v2 cpu.stat or v1 cpuacct.usage

    def cpu_seconds(self) -> float | None:
        """CPU seconds used by every process that was ever in the cgroup (user + system)."""
        if self.usage is None:
            return None
        try:
            text = self.usage.read_text()
        except OSError:
            return None
        if self.usage.name == "cpu.stat":
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return None
        try:
            return int(text.split()[0]) / 1e9
        except (ValueError, IndexError):
            return None

    @staticmethod
    def _mounts() -> tuple[Path | None, dict[str, Path]]:
        v2, v1 = None, {}
        with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fstype, _, opts = (right.split() + ["", "", ""])[:3]
                mount = Path(left.split()[4])
                if fstype == "cgroup2":
                    v2 = mount
                elif fstype == "cgroup":
                    for ctl in ("memory", "pids", *_V1_CPU):
                        if ctl in opts.split(","):
                            v1[ctl] = mount
        return v2, v1

    @staticmethod
    def _own(controller: str) -> str:
        with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
            for line in f:
                _, ctls, path = line.rstrip("\n").split(":", 2)
                if (controller == "" and ctls == "") or controller in ctls.split(","):
                    return path.lstrip("/")
        return ""

    @classmethod
    def create(cls, tag: str, memory_bytes: int, pids_max: int) -> CGroup | None:
        """A new cgroup named ``tag`` with those limits, or ``None`` where none can be made."""
        v2, v1 = cls._mounts()
        if v2 is not None:
            d = v2 / cls._own("") / tag
            try:
                d.mkdir()
            except OSError:
                d = None
            if d is not None:
                if (d / "memory.max").exists() and (d / "pids.max").exists():
                    try:
                        (d / "memory.max").write_text(str(memory_bytes))
                        (d / "pids.max").write_text(str(pids_max))
                        with contextlib.suppress(OSError):
                            (d / "memory.swap.max").write_text("0")
                        capped = False
                        with contextlib.suppress(OSError):
                            (d / "cpu.max").write_text(f"{CPU_QUOTA_US} {CPU_PERIOD_US}")
                            capped = True
                        stat = d / "cpu.stat"
                        return cls([d], capped, stat if stat.exists() else None)
                    except OSError:
                        pass
                with contextlib.suppress(OSError):
                    d.rmdir()
        if "memory" in v1 and "pids" in v1:
            dirs = []
            try:
                for ctl in ("memory", "pids"):
                    d = v1[ctl] / cls._own(ctl) / tag
                    d.mkdir()
                    dirs.append(d)
                mem = dirs[0]
                (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                (dirs[1] / "pids.max").write_text(str(pids_max))
            except OSError:
                cls(dirs).remove()
                return None
            return cls._v1_cpu(dirs, v1, tag)
        return None

    @classmethod
    def _v1_cpu(cls, dirs: list[Path], v1: dict[str, Path], tag: str) -> CGroup:
        # The cpu and cpuacct hierarchies (one mount or two), where they can be had: the
        # kernel is still capped in memory and processes without them.
        capped, usage = False, None
        for ctl in _V1_CPU:
            if ctl not in v1:
                continue
            d = v1[ctl] / cls._own(ctl) / tag
            if d not in dirs:
                try:
                    d.mkdir()
                except OSError:
                    continue
                dirs.append(d)
            if ctl == "cpu":
                with contextlib.suppress(OSError):
                    (d / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                    (d / "cpu.cfs_quota_us").write_text(str(CPU_QUOTA_US))
                    capped = True
            elif (d / "cpuacct.usage").exists():
                usage = d / "cpuacct.usage"
        return cls(dirs, capped, usage)

    @classmethod
    def available(cls) -> CGroup | None:
        cg = cls.create(f"specdec-probe-{os.getpid()}", 2**30, 64)
        if cg is not None:
            cg.remove()
        return cg

    def oom_kills(self) -> int:
        """How many of its processes the memory cap has killed (0 where it cannot be read)."""
        for d in self.dirs:
            for name in ("memory.events", "memory.oom_control"):  # v2, v1
                with contextlib.suppress(OSError, ValueError):
                    for line in (d / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            return int(value)
        return 0

    def join(self) -> None:
        """Move the calling process into the cgroup (run in the child before exec)."""
        for d in self.dirs:
            with open(d / "cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                out |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
        return out

    def kill(self) -> None:
        """SIGKILL everything in the cgroup, until it is empty (about a second at most)."""
        for _ in range(100):
            pids = self.pids()
            if not pids:
                return
            kill_pids(pids)
            time.sleep(0.01)

    @classmethod
    def named(cls, prefix: str) -> list[CGroup]:
        """The cgroups (one per kernel) whose names start with ``prefix``, left by a judge
        that was killed before it could remove them."""
        v2, v1 = cls._mounts()
        parents = []
        if v2 is not None:
            parents.append(v2 / cls._own(""))
        parents += [v1[c] / cls._own(c) for c in ("memory", "pids", *_V1_CPU) if c in v1]
        parents = list(dict.fromkeys(parents))
        out = []
        for parent in parents:
            with contextlib.suppress(OSError):
                out += [cls([d]) for d in parent.iterdir() if d.name.startswith(prefix)]
        return out

    def remove(self) -> None:
        self.kill()
        for d in reversed(self.dirs):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def kill_pids(pids) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.kill(p, signal.SIGKILL)
