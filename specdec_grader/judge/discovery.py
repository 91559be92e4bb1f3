"""Finding the submissions: regular files only, read once, with names safe to print.

Every notebook is read here, at the start, before any is graded: a submission that writes
to the submissions folder (where no sandbox stops it) cannot change what a classmate handed
in. Only regular files are opened, and only up to a size limit: a FIFO, a device, a socket,
a symbolic link that leads to none of those or nowhere, or a file too large is reported in
the gradebook and never opened; a link to a regular file is followed. Names that are not
UTF-8 or hold control characters are shown escaped.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import stat
import tokenize
from pathlib import Path

from .core import exercises
from .fingerprint import flag_near_copies
from .jobs import Submission
from .reports import escape

__all__ = ["MAX_NOTEBOOK_BYTES", "collect", "display_name", "exercise_of"]

MAX_NOTEBOOK_BYTES = 50 * 2**20


def display_name(path: str | os.PathLike) -> str:
    """``path`` as the reports show it: undecodable bytes and control characters escaped."""
    raw = os.fsencode(path)
    return escape(raw.decode("utf-8", errors="backslashreplace"))


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _read(path: Path, sub: Submission, folder: str | None = None) -> None:
    """Fill in ``sub.source`` or ``sub.problem`` without ever blocking or reading too much.

    A symbolic link is followed only when it stays inside ``folder`` (the submissions folder
    it was found in, as a real path); one that leads out of it (to ``solutions/``, to another
    class's folder) is refused."""
    try:
        st = os.lstat(path)
    except OSError as e:
        sub.problem = f"cannot be read ({e.strerror})"
        return
    link = stat.S_ISLNK(st.st_mode)
    if link:
        try:
            st = os.stat(path)
        except OSError:
            sub.problem = "a symbolic link that leads nowhere: not opened"
            return
    if not stat.S_ISREG(st.st_mode):
        sub.problem = f"{_kind(st.st_mode)}{' behind a symbolic link' if link else ''}: not opened"
        return
    if link and folder is not None and not _inside(os.path.realpath(path), folder):
        sub.problem = "a symbolic link that leads out of the submissions folder: not opened"
        return
    if st.st_size > MAX_NOTEBOOK_BYTES:
        sub.problem = f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MB: not read"
        return
    try:
        # O_NONBLOCK: should the file be swapped for a FIFO after the check, open does not hang.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        sub.problem = f"cannot be opened ({e.strerror})"
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            sub.problem = "not a regular file: not read"
            return
        data, chunks, total = b"", [], 0
        while total <= MAX_NOTEBOOK_BYTES:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        data = b"".join(chunks)
    except OSError as e:
        sub.problem = f"cannot be read ({e.strerror})"
        return
    finally:
        os.close(fd)
    if len(data) > MAX_NOTEBOOK_BYTES:
        sub.problem = f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MB: not read"
        return
    try:
        sub.source = data.decode("utf-8")
    except UnicodeDecodeError:
        sub.problem = "not a readable notebook (not UTF-8 text)"


def _is_notebook_name(name: str) -> bool:
    return name.endswith(".ipynb")


def _inodes(folders) -> dict[tuple[int, int], str]:
    """``(st_dev, st_ino) -> path`` of every regular file under ``folders``."""
    out: dict[tuple[int, int], str] = {}
    for folder in folders:
        for root, _, files in os.walk(folder, followlinks=False):
            for name in files:
                p = os.path.join(root, name)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out.setdefault((st.st_dev, st.st_ino), p)
    return out


def collect(paths: list[str | os.PathLike], solutions=(), compare: bool = True) -> list[Submission]:
    """The notebooks named by ``paths`` (files as given, folders searched recursively), each
    read now or with the reason it was not.

    Hidden folders and checkpoint folders (``.ipynb_checkpoints``) are skipped; links to
    folders are not followed. A hard link to a file under one of the ``solutions`` folders
    is not graded (it is that file), and (``compare``) a notebook whose code is that of one
    of their notebooks up to whitespace and names is flagged. Where there are ``solutions``
    folders, a graded function that is a near-copy of theirs or of another submission's,
    after renaming and the other edits that keep a copy a copy, is flagged
    (:mod:`.fingerprint`). Raises ``FileNotFoundError`` for a
    path that does not exist and ``ValueError`` when nothing is found or a file given by
    name is not an ``.ipynb``.
    """
    found: list[Path] = []
    folders: dict[Path, str] = {}  # each notebook's submissions folder, as a real path
    for raw in paths:
        p = Path(raw)
        if not os.path.lexists(p):
            raise FileNotFoundError(
                f"submission path {display_name(p)!r} does not exist; check the name"
            )
        if p.is_dir():
            for root, dirs, files in os.walk(p, followlinks=False):
                rel = Path(root).relative_to(p).parts
                if any(part.startswith(".") for part in rel):
                    dirs[:] = []
                    continue
                dirs.sort(key=os.fsencode)
                for name in sorted(files, key=os.fsencode):
                    if _is_notebook_name(name):
                        found.append(Path(root) / name)
                        folders.setdefault(found[-1], os.path.realpath(p))
                for name in list(dirs):  # links to folders: listed as files by nobody
                    if _is_notebook_name(name) and os.path.islink(Path(root) / name):
                        found.append(Path(root) / name)
                        folders.setdefault(found[-1], os.path.realpath(p))
        elif not _is_notebook_name(p.name):
            raise ValueError(
                f"submission {display_name(p)!r} is not a notebook (.ipynb); pass notebooks "
                "or folders of notebooks"
            )
        else:
            found.append(p)
            folders.setdefault(p, os.path.realpath(p.parent))
    unique = list(dict.fromkeys(found))
    if not unique:
        raise ValueError(
            f"no .ipynb notebooks found in {', '.join(display_name(p) for p in paths)}"
        )
    solutions = [os.fspath(f) for f in solutions if os.path.isdir(f)]
    linked = _inodes(solutions)
    subs = []
    for path in unique:
        sub = Submission(path, display=display_name(path))
        _read(path, sub, folders.get(path))
        try:
            st = os.stat(path)
            hit = linked.get((st.st_dev, st.st_ino))
        except OSError:
            hit = None
        # (The solutions folder's own file, graded by name, is no link.)
        if hit is not None and os.path.realpath(hit) != os.path.realpath(path):
            sub.source, sub.problem = (
                None,
                "a hard link to a file of the solutions folder: not graded",
            )
            sub.flags.append(f"a hard link to {display_name(hit)}")
        subs.append(sub)
    _flag_duplicates(subs, _solution_shapes(solutions) if compare else {})
    if solutions:  # (the batch grader passes the course's own by default)
        flag_near_copies(subs, solutions)
    return subs


# More code than this is not compared (the grader refuses to grade it anyway).
_SHAPE_MAX_CHARS = 2**20


def code_shape(source: str) -> str | None:
    """A notebook's code cells with whitespace and names normalised: each name becomes
    ``n<k>`` by order of first use, and layout is dropped (comments, strings and numbers
    stay). ``None`` when it cannot be read."""
    try:
        cells = json.loads(source)["cells"]
        code = [c["source"] for c in cells if c.get("cell_type") == "code"]
        code = "\n".join("".join(c) if isinstance(c, list) else str(c) for c in code)
    except Exception:  # noqa: BLE001 - not a notebook: no shape
        return None
    if len(code) > _SHAPE_MAX_CHARS:
        return None
    names: dict[str, int] = {}
    out = []
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.NAME:
                out.append(f"n{names.setdefault(tok.string, len(names))}")
            elif tok.type == tokenize.COMMENT:
                out.append(" ".join(tok.string.split()))
            elif tok.type not in skip:
                out.append(tok.string)
    except (tokenize.TokenError, SyntaxError, ValueError):  # unfinished code: layout only
        return re.sub(r"\s+", "", code)
    return " ".join(out)


def _solution_shapes(folders) -> dict[str, str]:
    out: dict[str, str] = {}
    for folder in folders:
        for p in sorted(Path(folder).rglob("*.ipynb")):
            with contextlib.suppress(OSError, UnicodeDecodeError):
                shape = code_shape(p.read_text(encoding="utf-8"))
                if shape:
                    out.setdefault(hashlib.sha256(shape.encode()).hexdigest(), str(p))
    return out


def _flag_duplicates(subs: list[Submission], solutions: dict[str, str] = {}) -> None:  # noqa: B006
    """Flag submissions that are one file (two names, one real path), one text, or one code
    up to whitespace and names (:func:`code_shape`), among themselves or with a notebook
    of the solutions folders (``solutions``: shape digest -> path)."""
    by_path: dict[str, list[Submission]] = {}
    by_text: dict[str, list[Submission]] = {}
    by_shape: dict[str, list[Submission]] = {}
    for s in subs:
        if s.problem or s.source is None:
            continue
        by_path.setdefault(os.path.realpath(s.path), []).append(s)
        by_text.setdefault(hashlib.sha256(s.source.encode()).hexdigest(), []).append(s)
        shape = code_shape(s.source)
        if shape is not None:
            digest = hashlib.sha256(shape.encode()).hexdigest()
            by_shape.setdefault(digest, []).append(s)
            if digest in solutions:
                s.flags.append(
                    f"a near-copy of {display_name(solutions[digest])} (the same code up to "
                    "whitespace and names)"
                )
    for groups, what in ((by_path, "the same file as"), (by_text, "identical to")):
        for group in groups.values():
            for s in group if len(group) > 1 else ():
                others = [o.display for o in group if o is not s][:3]
                why = f"{what} {', '.join(others)}"
                if why not in s.flags:
                    s.flags.append(why)
    for group in by_shape.values():
        for s in group if len(group) > 1 else ():
            same = {hashlib.sha256(s.source.encode()).digest()}
            others = [
                o.display
                for o in group
                if o is not s and hashlib.sha256(o.source.encode()).digest() not in same
            ][:3]
            if others:  # (identical ones are flagged as such)
                s.flags.append(
                    f"a near-copy of {', '.join(others)} (the same code up to whitespace and names)"
                )


def _by_metadata(sub: Submission) -> str | None:
    try:
        meta = json.loads(sub.source or "")["metadata"]["specdec_course"]
        if isinstance(meta, dict) and meta.get("exercise") in exercises():
            return meta["exercise"]
    except Exception:  # noqa: BLE001 - unreadable notebooks fall back to the file name
        pass
    return None


def _by_name(sub: Submission) -> str | None:
    m = re.search(r"(?<![a-z0-9])(ex\d{2,})(?!\d)", sub.display.lower().rsplit("/", 1)[-1])
    return m.group(1) if m and m.group(1) in exercises() else None


def disagreement(sub: Submission, exercise: str | None) -> str:
    """A flag when the notebook's metadata names another exercise than the one it is graded
    as (its file name's, or ``--exercise``), else ``""``."""
    meta = _by_metadata(sub)
    if meta and exercise and meta != exercise:
        return f"its metadata says {meta}, but it is graded as {exercise} (its name or --exercise)"
    return ""


def exercise_of(sub: Submission | Path, override: str | None = None) -> tuple[str | None, str]:
    """Which exercise a notebook is: ``override``, else ``exNN`` in its file name, else its
    metadata.

    The exercise notebooks carry ``metadata.specdec_course.exercise``, so a copy renamed
    without ``exNN`` still says ``ex01`` there; where the name and the metadata disagree, the
    name wins (the metadata is the student's to edit) and :func:`disagreement` flags it.
    Returns ``(exercise, "")`` or ``(None, reason)``. ``sub`` may be a path (it is then read).
    """
    if not isinstance(sub, Submission):
        s = Submission(Path(sub), display=display_name(sub))
        _read(Path(sub), s)
        sub = s
    known = exercises()
    if override is not None:
        return override, ""
    by_name = _by_name(sub)
    if by_name:  # the name the hand-in has wins over metadata the student can edit
        return by_name, ""
    meta = _by_metadata(sub)
    if meta:
        return meta, ""
    name = sub.display.rsplit("/", 1)[-1]
    return None, (
        f"cannot tell which exercise {name!r} is (no 'exNN' in its name or metadata); "
        f"pass --exercise, one of {', '.join(known)}"
    )
