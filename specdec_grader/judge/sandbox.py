"""The sandbox a submission's kernel runs in: bubblewrap, a cgroup, limits, and cleanup.

With bubblewrap (``bwrap``), the kernel sees a read-only system (``/usr``, a few files of
``/etc``), the Python installation, the course's data and the student edition of the
package (:mod:`.edition`: the listed modules only), read-only and at neutral paths
(:mod:`.mounts`: no folder keeps its host path); a private
tmpfs as its home and ``/tmp``; no network, no other process (its own PID namespace), no
submissions folder, no ``solutions/``, no output folder, no home folder. ``--die-with-parent``
ends it with its judge. A cgroup, where one can be created (v2, else v1), caps the memory and
the number of processes of everything in the sandbox together; the kernel also sets per-process
limits on itself (address space, CPU time, processes, file size) before any student code runs.
Without a cgroup (``weak``) a root grader runs each kernel under a uid of its own, where
RLIMIT_NPROC binds. While an exercise is graded, the edition's own versions of what it asks
for are stubs (:mod:`.withheld`).

No working sandbox, no grading (:class:`NoSandbox`, :func:`refuse_unsandboxed`): only
``--sandbox off``, the instructor's explicit choice for notebooks they trust, runs a kernel
as a plain process in its own session and a private temporary folder, under the same limits
(and the cgroup if any); the gradebook then says so. Cleanup kills the process group, every
process left below the judge (it is a child subreaper) and everything in the cgroup
(:mod:`.processes`: the started kernel's record, which stops it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specdec_course.paths import data_dir

from ..student_side import BATCH_ENV, UID_ENV
from . import edition, mounts
from .cgroup import CGroup, kill_pids
from .processes import Started, descendants, remove_cgroups, set_subreaper

__all__ = [
    "CGroup",
    "NO_SANDBOX_EXIT",
    "NoSandbox",
    "Plan",
    "Started",
    "descendants",
    "kill_pids",
    "plan",
    "refuse_unsandboxed",
    "remove_cgroups",
    "set_subreaper",
    "start",
]

HOME = "/home/student"
FDS_ENV = "SPECDEC_KERNEL_FDS"  # "r,w": the kernel's ends of its two pipes
_TMPFS_MB = 256  # the scratch folders' size (they count against the memory cap too)


@dataclass
class Plan:
    """How kernels are started in this grading run (plain data: it travels to the workers)."""

    mode: str  # "bwrap" or "none"
    bwrap: list[str] = field(default_factory=list)  # bwrap and its options, before the command
    env: dict[str, str] = field(default_factory=dict)
    cgroup: bool = False  # a cgroup per kernel can be created here
    warnings: list[str] = field(default_factory=list)
    own_uid: bool = False  # each kernel leaves root for a uid of its own (:func:`kernel_uid`)
    why: str = ""  # why bubblewrap does not run here ("" where it does)

    def describe(self) -> str:
        """What the gradebook says of the sandbox its rows were graded in."""
        if self.mode == "bwrap":
            return "bubblewrap" + ("" if self.cgroup else " (no cgroup: per-process caps)")
        return "NONE: graded without a sandbox (--sandbox off), for trusted notebooks only"

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "bwrap": list(self.bwrap),
            "env": dict(self.env),
            "cgroup": self.cgroup,
            "warnings": list(self.warnings),
            "own_uid": self.own_uid,
            "why": self.why,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        return cls(
            d["mode"],
            list(d["bwrap"]),
            dict(d["env"]),
            bool(d["cgroup"]),
            d["warnings"],
            bool(d.get("own_uid", False)),
            str(d.get("why", "")),
        )


# Where a root grader without a cgroup puts its kernels: uid BASE + the judge process's pid,
# one judge grading one submission at a time. RLIMIT_NPROC counts the processes of a uid (and
# binds no root process): a uid per kernel makes it one kernel's cap, which a classmate's
# processes do not eat into, and leaves a kernel no process of another to signal or trace.
# (No account has such a uid; nothing in the kernel needs one: HOME and USER are set.)
KERNEL_UID_BASE = 2**30


def kernel_uid() -> int:
    """The uid this judge process's kernels take when the plan says ``own_uid``."""
    return KERNEL_UID_BASE + os.getpid()


def _this_package() -> str:
    # Python code that puts the folder holding the package the judge runs first on the path:
    # ``-I`` ignores PYTHONPATH, and an editable install's finder may name another checkout
    # (one the sandbox does not show), so the kernel would run other code than the judge's.
    import specdec_course

    parent = str(Path(specdec_course.__file__).resolve().parent.parent)
    return f"import sys; sys.path.insert(0, {parent!r}); "


_RUN_KERNEL = (
    "import runpy; runpy.run_module('specdec_grader.student_side', "
    "run_name='__main__', alter_sys=True)"
)


def kernel_command(sandboxed: bool = False) -> list[str]:
    """The command that starts a kernel (:mod:`.student_side`), with this interpreter and this
    copy of the package: in bubblewrap (``sandboxed``) at their neutral paths (:mod:`.mounts`)."""
    if sandboxed:
        return mounts.kernel_command(_RUN_KERNEL)
    return [sys.executable, "-I", "-c", _this_package() + _RUN_KERNEL]


def _env(home: str) -> dict[str, str]:
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "USER": "student",
        "LOGNAME": "student",
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


def _bwrap_options(variant: int) -> list[str]:
    if variant == 2:
        # Root without a cgroup: no user namespace (in one, the kernel's uid would still be
        # root's outside, which RLIMIT_NPROC never binds); the kernel keeps only the two
        # capabilities it needs to leave root for its own uid (UID_ENV), which it does before
        # it reads a request, and which clears them. bwrap sets no_new_privs: none comes back.
        opts = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        opts += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
        opts += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        opts = ["--unshare-all", "--die-with-parent", "--new-session"]
    if variant == 0:
        # A user namespace of its own, no nested ones (they would lift the limits), and, when
        # the grader is root, no capability left at all.
        opts += ["--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534"]
    if os.geteuid() == 0 and variant != 2:
        opts += ["--cap-drop", "ALL"]
    opts += ["--proc", "/proc", "--dev", "/dev"]
    # The private scratch folders first: the read-only binds go on top of them, so that a
    # Python or a package installed under /tmp (a CI checkout, say) stays visible inside.
    # (Writable by all: in variant 2 the kernel is not the root that made them.)
    for path in ("/tmp", HOME, "/dev/shm"):
        opts += ["--perms", "1777"] if variant == 2 else []
        opts += ["--size", str(_TMPFS_MB * 2**20), "--tmpfs", path]
    binds = mounts.binds()
    if variant == 2:
        opts += mounts.open_parents(binds)
    opts += binds
    # Everything but the three scratch folders read-only: the root's own tmpfs (which has
    # no size cap) takes no file.
    opts += ["--remount-ro", "/", "--chdir", HOME, "--clearenv"]
    return opts


MODES = ("auto", "require", "weak", "off")

# The exit status of ``specdec-grader`` when it refuses to grade without a sandbox.
NO_SANDBOX_EXIT = 3
INSTALL_BWRAP = (
    "Debian/Ubuntu: sudo apt-get install bubblewrap; Fedora: sudo dnf install bubblewrap"
)


class NoSandbox(RuntimeError):
    """No working sandbox here, so nothing is graded: the message says what is missing, how
    to install it, and that ``--sandbox off`` grades notebooks the instructor trusts."""

    def __init__(self, missing: list[str], hint: str = ""):
        self.missing = list(missing)
        bwrap = any("bubblewrap" in m for m in self.missing)
        super().__init__(
            "no sandbox, so no notebook was run. Missing: "
            + "; ".join(self.missing)
            + ". "
            + (
                f"Install bubblewrap ({INSTALL_BWRAP}) and run the same command again. "
                if bwrap
                else ""
            )
            + (f"{hint[0].upper()}{hint[1:]}. " if hint else "")
            + "For notebooks you trust (your own solutions, say), --sandbox off grades without "
            f"a sandbox, and the gradebook says so. (exit status {NO_SANDBOX_EXIT})"
        )


def refuse_unsandboxed(the_plan: Plan, mode: str) -> None:
    """Raise :class:`NoSandbox` unless ``the_plan`` runs kernels in bubblewrap or ``mode``
    is ``"off"`` (the instructor asked for no sandbox)."""
    if mode != "off" and the_plan.mode != "bwrap":
        raise NoSandbox([the_plan.why or "bubblewrap cannot run here"])


def _probe(argv: list[str], env: dict[str, str] | None) -> str:
    """Run ``argv``; "" if it exited 0, else why not (its last line of stderr)."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=120, env=env, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"it could not start: {e}"
    if done.returncode == 0:
        return ""
    err = done.stderr.decode(errors="replace").strip().splitlines()
    return err[-1] if err else f"exit {done.returncode}"


# What a kernel that leaves root must still do: take its uid and import what it runs with.
_AS_KERNEL = (
    "from specdec_grader.student_side import drop_root; drop_root(); "
    "import os, torch, IPython, specdec_course.paths; assert os.getuid() != 0"
)


def plan(mode: str = "auto") -> Plan:
    """Decide how to sandbox kernels: ``"auto"`` and ``"require"`` (bubblewrap and a cgroup
    per kernel, or :class:`NoSandbox`, a ``RuntimeError``, saying what is missing),
    ``"weak"`` (bubblewrap without a cgroup too) or ``"off"`` (no sandbox).

    Without a cgroup, nothing caps a submission's processes together. A ``weak`` plan where
    bubblewrap does not run has mode ``"none"`` and says why (:attr:`Plan.why`): the grader
    refuses it (:func:`refuse_unsandboxed`); only ``off`` grades without a sandbox. ``weak``
    without a cgroup, as root, runs each kernel in bubblewrap without a user namespace under
    a uid of its own (:data:`KERNEL_UID_BASE`), so that RLIMIT_NPROC binds it. Tries
    bubblewrap once, by starting Python in it. Raises ``ValueError`` for another mode.
    """
    if mode not in MODES:
        raise ValueError(f"sandbox must be one of {', '.join(MODES)}; got {mode!r}")
    warnings: list[str] = []
    cg = CGroup.available()
    no_cgroup = (
        "no cgroup can be created here, so one submission's processes together are not "
        "capped (memory, process count; RLIMIT_NPROC binds no root process)"
    )
    weak_hint = (
        "for a cgroup, run as root with cgroups v2 (or v1 memory + pids) writable, or pass "
        "--sandbox weak to grade in bubblewrap with per-process limits only"
    )
    own_uid = cg is None and mode != "off" and os.geteuid() == 0
    result = Plan("none", [], _env(HOME), cg is not None, warnings, own_uid)
    uid = {UID_ENV: str(kernel_uid())} if own_uid else {}
    if mode != "off":  # auto, require, weak
        exe = shutil.which("bwrap")
        why = "bubblewrap (bwrap) is not installed"
        for variant in ((2,) if own_uid else (0, 1)) if exe else ():
            opts = [exe, *_bwrap_options(variant)]
            for k, v in {**result.env, **mounts.env()}.items():
                opts += ["--setenv", k, v]
            extra = [a for k, v in uid.items() for a in ("--setenv", k, v)]
            kernel = mounts.kernel_command(_AS_KERNEL if own_uid else "import specdec_course.paths")
            failed = _probe([*opts, *extra, *kernel], None)
            if not failed:
                result.mode, result.bwrap = "bwrap", opts
                break
            why = f"bubblewrap failed: {failed}"
        if result.mode != "bwrap":
            result.why = why
            if mode in ("auto", "require"):
                raise NoSandbox(
                    [why] + ([no_cgroup] if cg is None else []), weak_hint if cg is None else ""
                )
            # (weak: a plan the grader refuses, :func:`refuse_unsandboxed`.)
            return result
        if cg is None and mode != "weak":
            raise NoSandbox([no_cgroup], weak_hint)
    else:
        warnings.append(
            "NO SANDBOX (--sandbox off): submissions ran as this user, with the network, the "
            "file system and the other processes in reach; only time and memory limits applied"
        )
    if result.mode != "bwrap":
        # The judge side can be imported there: keep the notebook's check() cells quiet.
        result.env[BATCH_ENV] = "1"
    if cg is None:
        per = " (each kernel under a uid of its own, so it binds)" if own_uid else ""
        warnings.append(
            "no cgroup could be created here: the memory cap is per process (address space), "
            f"and the process count is limited by RLIMIT_NPROC only{per}"
            + ("" if own_uid else " (which binds no root process)")
        )
    if cg is None or not cg.cpu_capped or cg.usage is None:
        warnings.append(
            "no cgroup cpu controller here (v2 cpu.max, v1 cpu + cpuacct): a submission is "
            "not held to one core, and its time limits count wall time, which a busy machine "
            "uses up (checks that time out are re-run alone)"
        )
    return result


# --------------------------------------------------------------------------- starting


def _child_setup(cg: CGroup | None) -> None:
    # In the child, before exec: the judge's own memory cap is not the kernel's (it has its
    # own limits, and the cgroup's), then into the cgroup; it dies with its judge.
    import ctypes
    import resource
    import signal

    with contextlib.suppress(ValueError, OSError):
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PDEATHSIG
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
    bubblewrap, the student edition is shown with those functions rewritten as stubs
    (:func:`.edition.build_tree`). Raises ``OSError`` when it cannot start.
    """
    before = descendants(os.getpid())
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    cg = None
    if the_plan.cgroup and memory_mb > 0:
        cg = CGroup.create(tag, memory_mb * 2**20, pids_max)
    scratch = None
    fds = f"{to_r},{from_w}"  # the kernel's ends: it reads requests, writes answers
    uid = {UID_ENV: str(kernel_uid())} if the_plan.own_uid else {}
    if the_plan.mode == "bwrap":
        exercise, functions = withhold
        hide = []
        if functions:  # the edition with this exercise's functions withheld, over the plain one
            hide = mounts.edition_binds(edition.build_tree(exercise, functions))
        argv = [*the_plan.bwrap, *hide, "--setenv", FDS_ENV, fds]
        argv += [a for k, v in uid.items() for a in ("--setenv", k, v)] + kernel_command(True)
        env, cwd = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, None
    else:
        scratch = tempfile.mkdtemp(prefix="specdec-kernel-")
        if uid:  # the kernel's own folder, once it is no longer root
            os.chown(scratch, kernel_uid(), kernel_uid())
        argv = kernel_command()
        env = dict(the_plan.env, HOME=scratch, TMPDIR=scratch, **{FDS_ENV: fds}, **uid)
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
