"""What a sandboxed kernel sees of the machine: the bubblewrap binds, at neutral paths.

The sandbox shows the system (``/usr`` and a few files of ``/etc``), the Python installation
the kernel needs, the course's data and the student edition of the package, all read-only,
and nothing else of the host: no folder keeps its host path. The base installation
(``sys.base_prefix``) is shown at ``/opt/python``, the environment (``sys.prefix``, a venv)
at ``/opt/venv``, a user site at ``/opt/user-site``, the student edition at
``/course/specdec_course`` (the grader's student side beside it at ``/course/specdec_grader``)
and the course's data (a copy, made once per process) at
``/course/data``: a kernel that lists ``/``, its own path or the mount table's mount points
finds no home folder, checkout or installation path of the grader's machine. Nor does the
mount table's root column (``/proc/self/mountinfo``, which names each bind's folder on its
file system): the interpreter's folders are bound from hard-linked copies under neutral names
(:func:`linked`, made once per machine), the edition and the data from the grader's own
temporary folders.

The kernel runs the base interpreter at its neutral path with ``-I -S`` and adds the
environment's site folders itself (:func:`kernel_command`): a venv's ``pyvenv.cfg`` names
its base installation by its host path, which the sandbox does not show.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import os
import shutil
import site
import sys
import tempfile
import threading
from pathlib import Path

from specdec_course.paths import data_dir

from . import edition, withheld

__all__ = ["COURSE", "binds", "inside", "kernel_command", "open_parents", "roots"]

COURSE = "/course"  # the student edition's parent (on the kernel's path) and the data
_NEUTRAL = {"base": "/opt/python", "venv": "/opt/venv", "user": "/opt/user-site"}
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


def roots() -> list[tuple[str, str]]:
    """``(host folder, its path in the sandbox)`` for the Python installation (the system's
    ``/usr`` keeps its path) and the course's data, longest host path first."""
    out: dict[str, str] = {}
    base = os.path.realpath(sys.base_prefix)
    candidates = [("base", base), ("venv", os.path.realpath(sys.prefix))]
    with contextlib.suppress(Exception):
        user_site = site.getusersitepackages()
        if user_site in sys.path and os.path.isdir(user_site):
            candidates.append(("user", os.path.realpath(user_site)))
    for kind, real in candidates:
        if os.path.isdir(real) and not (real == "/usr" or real.startswith("/usr/")):
            out.setdefault(real, _NEUTRAL[kind])
    out[os.path.realpath(data_dir())] = f"{COURSE}/data"
    return sorted(out.items(), key=lambda kv: -len(kv[0]))


def inside(path: str | os.PathLike) -> str:
    """Where the sandbox shows the host path ``path`` (unchanged under ``/usr``)."""
    real = os.path.realpath(path)
    for host, there in roots():
        if real == host or real.startswith(host + "/"):
            return there + real[len(host) :]
    return real


def package_path(name: str = "specdec_course") -> str:
    """Where the student edition of the package ``name`` (the course's, or the grader's
    student side) is shown, on the kernel's path."""
    return f"{COURSE}/{name}"


_lock = threading.Lock()
_data: list[str] = []


def _data_copy() -> str:
    # The course's data, copied (hard links where they can be made) into a folder of this
    # process, so that the sandbox's mount table names no folder of the checkout.
    with _lock:
        if not _data:
            where = tempfile.mkdtemp(prefix="specdec-data-")
            atexit.register(shutil.rmtree, where, True)
            target = os.path.join(where, "data")

            def link_or_copy(src, dst):
                try:
                    os.link(src, dst)
                except OSError:
                    shutil.copy2(src, dst)

            shutil.copytree(data_dir(), target, symlinks=False, copy_function=link_or_copy)
            os.chmod(where, 0o755)
            _data.append(target)
        return _data[0]


def _fingerprint(root: str) -> str:
    # What a changed installation changes: the folders a package install adds an entry to.
    parts = [root]
    for d in [root, *sorted(str(p) for p in Path(root).glob("lib*/python*/site-packages"))]:
        with contextlib.suppress(OSError):
            parts.append(f"{d}:{os.stat(d).st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _link_tree(src: str, dst: str) -> None:
    # ``src`` as a tree of hard links (no data is copied), its symlinks as symlinks.
    for folder, dirs, files in os.walk(src):
        rel = os.path.relpath(folder, src)
        out = dst if rel == "." else os.path.join(dst, rel)
        os.makedirs(out, exist_ok=True)
        os.chmod(out, 0o755)
        for name in [*dirs, *files]:
            p, q = os.path.join(folder, name), os.path.join(out, name)
            if os.path.islink(p):
                os.symlink(os.readlink(p), q)
            elif name in files:
                os.link(p, q)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]


_linked: dict[str, str] = {}


def linked(host: str, name: str) -> str:
    """The folder ``host`` (an installation) as a tree of hard links at a neutral path,
    ``$TMPDIR/specdec-<uid>-<fingerprint>/<name>``, so that binding it names no host folder
    in the sandbox's mount table. Made once per machine and installation state (a lock keeps
    two graders from making it twice; a changed installation gets a new one), reused when
    this user owns it and no one else can write it. Where hard links cannot be made (another
    file system), ``host`` itself, whose name the mount table then shows."""
    with _lock:
        if host in _linked:
            return _linked[host]
        uid = os.getuid()
        final = os.path.join(tempfile.gettempdir(), f"specdec-{uid}-{_fingerprint(host)}")
        tree = os.path.join(final, name)
        try:
            fd = os.open(f"{final}.lock", os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                st = os.lstat(final) if os.path.lexists(final) else None
                ours = st is not None and st.st_uid == uid and not st.st_mode & 0o022
                if not (ours and os.path.isfile(os.path.join(final, "complete"))):
                    if st is not None:
                        raise OSError(f"{final} exists and is not a finished tree of ours")
                    work = tempfile.mkdtemp(prefix="specdec-linking-")
                    try:
                        _link_tree(host, os.path.join(work, name))
                        Path(work, "complete").write_text(host + "\n")
                        os.chmod(work, 0o755)
                        os.rename(work, final)
                    except BaseException:
                        shutil.rmtree(work, True)
                        raise
            finally:
                os.close(fd)
        except OSError:
            tree = host
        _linked[host] = tree
        return tree


def binds() -> list[str]:
    """bwrap options that show the system, the Python installation, the course's data and
    the student edition (:func:`.edition.build_tree`: the listed modules only, so no file of
    the judge side is there), all read-only, at neutral paths."""
    opts = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            opts += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            opts += ["--ro-bind", top, top]
    for name in _ETC:
        opts += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    data = os.path.realpath(data_dir())
    for host, there in sorted(roots(), key=lambda kv: len(kv[1])):  # parents first
        source = _data_copy() if host == data else linked(host, os.path.basename(there))
        opts += ["--ro-bind", source, there]
    return opts + edition_binds(edition.build_tree()) + translate(withheld.hidden_package_options())


def edition_binds(tree: str | os.PathLike) -> list[str]:
    """Options that show ``tree`` (:func:`.edition.build_tree`: the course's package and the
    grader's student side, perhaps with functions withheld) at the packages' paths, and over
    each package where an installation shows it too (site-packages, say)."""
    opts: list[str] = []
    for name, real in sorted(edition.package_dirs().items()):
        src = os.path.join(str(tree), name)
        opts += ["--ro-bind", src, package_path(name)]
        shown = inside(real)
        if shown != str(real):
            opts += ["--ro-bind", src, shown]
    return opts


_ONE = {"--tmpfs", "--remount-ro", "--dir"}
_TWO = {"--ro-bind", "--ro-bind-try", "--bind", "--symlink"}


def translate(opts: list[str]) -> list[str]:
    """``opts`` (bwrap options) with every destination at its path in the sandbox."""
    out, i = [], 0
    while i < len(opts):
        if opts[i] in _ONE:
            out += [opts[i], inside(opts[i + 1])]
            i += 2
        elif opts[i] in _TWO:
            out += [opts[i], opts[i + 1], inside(opts[i + 2])]
            i += 3
        else:
            out.append(opts[i])
            i += 1
    return out


def open_parents(opts: list[str]) -> list[str]:
    """``--dir`` options, mode 0755, for the folders above every mount point in ``opts``:
    bubblewrap makes them 0700, which only a kernel that is (or maps to) root can cross."""
    dests, i = [], 0
    while i < len(opts):
        if opts[i] in _TWO:
            dests.append(opts[i + 2])
            i += 3
        else:  # --tmpfs, --remount-ro DEST
            dests.append(opts[i + 1])
            i += 2
    parents = {str(p) for d in dests for p in Path(d).parents if str(p) != "/"}
    out: list[str] = []
    for p in sorted(parents, key=lambda p: (p.count("/"), p)):
        out += ["--perms", "0755", "--dir", p]
    return out


def _site_dirs() -> list[str]:
    """The environment's site folders on this interpreter's path, at their sandbox paths."""
    found = []
    with contextlib.suppress(Exception):
        found += [d for d in site.getsitepackages() if d in sys.path]
    with contextlib.suppress(Exception):
        user = site.getusersitepackages()
        if user in sys.path:
            found.append(user)
    return [inside(d) for d in found if os.path.isdir(d)]


def interpreter() -> str:
    """This interpreter's binary, at its sandbox path."""
    return inside(os.path.realpath(sys.executable))


def env() -> dict[str, str]:
    """What a kernel's environment needs for the interpreter at its sandbox path."""
    base = inside(sys.base_prefix)
    return {
        "PATH": f"{os.path.dirname(interpreter())}:/usr/local/bin:/usr/bin:/bin",
        # A shared libpython is found by its host path (RPATH) otherwise.
        "LD_LIBRARY_PATH": f"{base}/lib",
        "SPECDEC_DATA": f"{COURSE}/data",
    }


def kernel_prelude() -> str:
    """Python code that puts the student edition first on the path and the environment's
    site folders after the standard library (``-S`` skipped them)."""
    return (
        f"import sys, site; sys.path.insert(0, {COURSE!r}); "
        f"[site.addsitedir(d) for d in {_site_dirs()!r}]; "
    )


def kernel_command(code: str) -> list[str]:
    """The command that runs ``code`` (after :func:`kernel_prelude`) in the sandbox."""
    return [interpreter(), "-I", "-S", "-c", kernel_prelude() + code]
