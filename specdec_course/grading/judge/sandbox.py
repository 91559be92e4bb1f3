"""The sandbox a submission's kernel runs in: bubblewrap, a cgroup, limits, and cleanup.

With bubblewrap (``bwrap``), the kernel sees a read-only system (``/usr``, a few files of
``/etc``), the Python installation and the course package and data, read-only; a private
tmpfs as its home and ``/tmp``; no network, no other process (its own PID namespace), no
submissions folder, no ``solutions/``, no output folder, no home folder. ``--die-with-parent``
ends it with its judge. A cgroup, where one can be created (v2, else v1), caps the memory and
the number of processes of everything in the sandbox together; the kernel also sets per-process
limits on itself (address space, CPU time, processes, file size) before any student code runs.

Where bubblewrap cannot run, the kernel runs as a plain process in its own session and a
private temporary folder, under the same limits (and the cgroup if any); :func:`plan` says so
in its warnings, and the grader prints them. Cleanup then kills the process group, every
process left below the judge (it is a child subreaper) and everything in the cgroup.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specdec_course.paths import data_dir

from ..kernel import BATCH_ENV
from . import withheld
from .cgroup import CGroup, kill_pids

__all__ = [
    "CGroup",
    "Plan",
    "descendants",
    "kill_pids",
    "plan",
    "remove_cgroups",
    "set_subreaper",
    "start",
]

HOME = "/home/student"
FDS_ENV = "SPECDEC_KERNEL_FDS"  # "r,w": the kernel's ends of its two pipes
_TMPFS_MB = 256  # the scratch folders' size (they count against the memory cap too)
_ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "passwd",
    "group",
    "alternatives",
)


@dataclass
class Plan:
    """How kernels are started in this grading run (plain data: it travels to the workers)."""

    mode: str  # "bwrap" or "none"
    bwrap: list[str] = field(default_factory=list)  # bwrap and its options, before the command
    env: dict[str, str] = field(default_factory=dict)
    cgroup: bool = False  # a cgroup per kernel can be created here
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "bwrap": list(self.bwrap),
            "env": dict(self.env),
            "cgroup": self.cgroup,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        return cls(d["mode"], list(d["bwrap"]), dict(d["env"]), bool(d["cgroup"]), d["warnings"])


def kernel_command() -> list[str]:
    """The command that starts a kernel (:mod:`.kernel`), with this interpreter."""
    return [sys.executable, "-I", "-m", "specdec_course.grading.kernel"]


def _env(home: str) -> dict[str, str]:
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        # One thread per kernel: several kernels share the machine's cores.
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",  # fewer malloc arenas: less address space per thread
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": "/tmp/matplotlib",
        "IPYTHONDIR": "/tmp/ipython",
        "TRITON_CACHE_DIR": "/tmp/triton",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "SPECDEC_DATA": str(data_dir()),
    }
    for passthrough in ("ATEN_CPU_CAPABILITY", "TRITON_INTERPRET"):
        if passthrough in os.environ:
            env[passthrough] = os.environ[passthrough]
    return env


def judge_dir() -> str:
    """The judge side's folder (references, exact laws, checks): never shown to a kernel."""
    return os.path.dirname(os.path.abspath(__file__))


def _binds() -> list[str]:
    """bwrap options that show the system, Python and the package, all read-only, with the
    judge side's folder covered by an empty read-only one (no file of it is visible)."""
    import specdec_course

    opts = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            opts += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            opts += ["--ro-bind", top, top]
    for name in _ETC:
        opts += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    roots: list[str] = []
    package = Path(specdec_course.__file__).resolve().parent
    candidates = [sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix]
    import site

    with contextlib.suppress(Exception):
        user_site = site.getusersitepackages()
        if user_site in sys.path and os.path.isdir(user_site):
            candidates.append(user_site)
    candidates += [str(package), str(data_dir())]
    for c in candidates:
        real = os.path.realpath(c)
        if not os.path.isdir(real) or real.startswith("/usr/"):
            continue
        if any(real == r or real.startswith(r + "/") for r in roots):
            continue
        roots = [r for r in roots if not r.startswith(real + "/")] + [real]
    for r in roots:
        opts += ["--ro-bind", r, r]
    hidden = os.path.realpath(judge_dir())
    opts += ["--tmpfs", hidden, "--remount-ro", hidden]
    # The venv's python is a symlink into the base installation; keep the path it was run by.
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    if not any(exe_dir == r or exe_dir.startswith(r + "/") for r in roots + ["/usr"]):
        opts += ["--ro-bind", exe_dir, exe_dir]
    return opts


def _bwrap_options(variant: int) -> list[str]:
    opts = ["--unshare-all", "--die-with-parent", "--new-session"]
    if variant == 0:
        # A user namespace of its own, no nested ones (they would lift the limits), and, when
        # the grader is root, no capability left at all.
        opts += ["--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534"]
    if os.geteuid() == 0:
        opts += ["--cap-drop", "ALL"]
    opts += ["--proc", "/proc", "--dev", "/dev"]
    # The private scratch folders first: the read-only binds go on top of them, so that a
    # Python or a package installed under /tmp (a CI checkout, say) stays visible inside.
    for path in ("/tmp", HOME, "/dev/shm"):
        opts += ["--size", str(_TMPFS_MB * 2**20), "--tmpfs", path]
    opts += _binds()
    # Everything but the three scratch folders read-only: the root's own tmpfs (which has
    # no size cap) takes no file.
    opts += ["--remount-ro", "/", "--chdir", HOME, "--clearenv"]
    return opts


MODES = ("auto", "require", "weak", "off")


def plan(mode: str = "auto") -> Plan:
    """Decide how to sandbox kernels: ``"auto"`` (bubblewrap if it works, else none, with a
    warning), ``"require"`` (bubblewrap or ``RuntimeError``), ``"weak"`` (as auto, and
    without a cgroup too) or ``"off"``.

    ``auto`` and ``require`` need a cgroup per kernel (``RuntimeError`` where none can be
    made): without one, nothing caps a submission's processes together. Tries bubblewrap
    once, by starting Python in it. Raises ``ValueError`` for another mode.
    """
    if mode not in MODES:
        raise ValueError(f"sandbox must be one of {', '.join(MODES)}; got {mode!r}")
    warnings: list[str] = []
    cg = CGroup.available()
    if cg is None and mode in ("auto", "require"):
        raise RuntimeError(
            "no cgroup can be created here, so one submission's processes together are not "
            "capped (memory, process count; RLIMIT_NPROC binds no root process): run as "
            "root with cgroups v2 (or v1 memory + pids) writable, or pass --sandbox weak to "
            "grade with per-process limits only"
        )
    result = Plan("none", [], _env(HOME), cg is not None, warnings)
    if mode != "off":  # auto, require, weak
        exe = shutil.which("bwrap")
        why = "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
        if exe:
            for variant in (0, 1):
                opts = [exe, *_bwrap_options(variant)]
                for k, v in result.env.items():
                    opts += ["--setenv", k, v]
                try:
                    probe = subprocess.run(
                        [*opts, sys.executable, "-I", "-c", "import specdec_course.paths"],
                        capture_output=True,
                        timeout=60,
                    )
                except (OSError, subprocess.TimeoutExpired) as e:
                    why = f"bubblewrap could not start: {e}"
                    continue
                if probe.returncode == 0:
                    result.mode, result.bwrap = "bwrap", opts
                    break
                err = probe.stderr.decode(errors="replace").strip().splitlines()
                why = "bubblewrap failed: " + (err[-1] if err else f"exit {probe.returncode}")
        if result.mode != "bwrap":
            if mode == "require":
                raise RuntimeError(why)
            warnings.append(
                f"NO SANDBOX: {why}. Submissions ran as this user, with the network, the file "
                "system and the other processes in reach; only time and memory limits applied"
            )
    else:
        warnings.append("NO SANDBOX (--sandbox off): submissions ran as this user")
    if result.mode != "bwrap":
        # The judge side can be imported there: keep the notebook's check() cells quiet.
        result.env[BATCH_ENV] = "1"
    if cg is None:
        warnings.append(
            "no cgroup could be created here: the memory cap is per process (address space), "
            "and the process count is limited by RLIMIT_NPROC only (which binds no root process)"
        )
    return result


# --------------------------------------------------------------------------- processes


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


def _child_setup(cg: CGroup | None) -> None:
    # In the child, before exec: the judge's own memory cap is not the kernel's (it has its
    # own limits, and the cgroup's), then into the cgroup.
    import resource

    with contextlib.suppress(ValueError, OSError):
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))
    if cg is not None:
        cg.join()


def start(
    the_plan: Plan,
    tag: str,
    memory_mb: int,
    pids_max: int = 256,
    withhold: tuple[str, tuple[str, ...]] = ("", ()),
) -> Started:
    """Start a kernel under ``the_plan``, in a new cgroup named ``tag`` where possible.

    ``memory_mb`` (0: none) caps the cgroup. ``withhold`` is ``(exercise, functions)``: in
    bubblewrap, the package's modules holding those functions are shown rewritten without
    them (:mod:`.withheld`). Raises ``OSError`` when it cannot start.
    """
    before = descendants(os.getpid())
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    cg = None
    if the_plan.cgroup and memory_mb > 0:
        cg = CGroup.create(tag, memory_mb * 2**20, pids_max)
    scratch = None
    fds = f"{to_r},{from_w}"  # the kernel's ends: it reads requests, writes answers
    if the_plan.mode == "bwrap":
        exercise, functions = withhold
        hide = withheld.bwrap_options(exercise, functions) if functions else []
        argv = [*the_plan.bwrap, *hide, "--setenv", FDS_ENV, fds, *kernel_command()]
        env, cwd = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, None
    else:
        scratch = tempfile.mkdtemp(prefix="specdec-kernel-")
        argv = kernel_command()
        env = dict(the_plan.env, HOME=scratch, TMPDIR=scratch, **{FDS_ENV: fds})
        env.update({k: f"{scratch}/{k.lower()}" for k in ("MPLCONFIGDIR", "IPYTHONDIR")})
        env["TRITON_CACHE_DIR"] = f"{scratch}/triton"
        cwd = scratch
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=None if os.environ.get("SPECDEC_GRADE_DEBUG") else subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            pass_fds=(to_r, from_w),
            start_new_session=True,
            preexec_fn=functools.partial(_child_setup, cg),
        )
    except BaseException:
        for fd in (to_r, to_w, from_r, from_w):
            os.close(fd)
        if cg is not None:
            cg.remove()
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    os.close(to_r)
    os.close(from_w)
    return Started(proc, to_w, from_r, cg, scratch, before)
