"""The batch grader's reports: the gradebook CSV, the per-check CSV, JUnit XML, the summary.

Everything a submission can influence (its file name, its exception messages) is text from
outside: control characters are escaped everywhere (``\\x1b``, ``\\n``: no terminal escape
codes, no fake rows, always valid XML), and in the CSVs a field that a spreadsheet would
read as a formula (``=``, ``+``, ``-``, ``@``, their full-width and small forms, after any
leading whitespace a spreadsheet trims, Unicode spaces included) gets a leading apostrophe.
Each file is written to a temporary file beside it and renamed into place, so a reader never
sees half of one; while a run grades, :mod:`.journal` appends each submission's rows
(:func:`gradebook_row`, :func:`check_rows`) as soon as it is graded. The gradebook's
``sandbox`` column and each JUnit suite's ``sandbox`` property say what the rows were graded
in: a gradebook made without a sandbox (``--sandbox off``) says so wherever it is read.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import tempfile
import unicodedata
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from .jobs import SubmissionResult

__all__ = [
    "check_rows",
    "checks_csv_path",
    "gradebook_row",
    "escape",
    "format_summary",
    "write_checks_csv",
    "write_csv",
    "write_junit",
]

CSV_FIELDS = [
    *("file", "exercise", "points", "max_points", "status", "message", "notes", "flags"),
    *("time_limited", "seed", "sandbox"),
]
CHECK_CSV_FIELDS = ["file", "exercise", "check", "points", "max_points", "status", "message"]
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def escape(text: object) -> str:
    """``text`` with every control, format or separator character written as an escape
    (``\\n``, ``\\x1b``, ``\\u202e``); surrogates from undecodable names likewise."""
    s = text if isinstance(text, str) else str(text)
    out = []
    for ch in s:
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp") and ch != " ":
            code = ord(ch)
            if ch == "\n":
                out.append("\\n")
            elif ch == "\t":
                out.append("\\t")
            elif ch == "\r":
                out.append("\\r")
            elif code < 0x100:
                out.append(f"\\x{code:02x}")
            else:
                out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def _formula_like(s: str) -> bool:
    # Spreadsheets trim leading whitespace (any Unicode space: no-break, ideographic...)
    # before they look for a formula, and read full-width and small forms of = + - @ (and
    # the minus sign) as the ASCII ones.
    i = 0
    while i < len(s) and (s[i].isspace() or unicodedata.category(s[i]) in ("Zs", "Cf")):
        i += 1
    if i == len(s):
        return False
    ch = unicodedata.normalize("NFKC", s[i])[:1]
    return ch in _FORMULA or s[i] in ("\u2212", "\u2796", "\u2795")


def _cell(text: object) -> str:
    s = escape(text)
    return "'" + s if s.startswith(_FORMULA) or _formula_like(s) else s


def _atomic_write(path: str | os.PathLike, write: Callable[[io.TextIOBase], None]) -> None:
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def gradebook_row(r: SubmissionResult, sandbox: str = "") -> list[str]:
    """The gradebook's row of ``r`` (:data:`CSV_FIELDS`), graded in ``sandbox``."""
    return [
        _cell(r.file),
        _cell(r.exercise or ""),
        f"{r.points:g}",
        f"{r.max_points:g}",
        _cell(r.status),
        _cell(r.first_problem),
        _cell("; ".join(r.notes) if r.checks else ""),
        _cell("; ".join(r.flags)),
        _cell("; ".join(r.time_limited)),
        "" if r.seed is None else str(r.seed),
        _cell(sandbox),
    ]


def write_csv(
    results: list[SubmissionResult], path: str | os.PathLike, sandbox: str | None = None
) -> None:
    """The gradebook: one row per submission and exercise.

    Columns: file, exercise, points, max_points, status ("passed" or the first non-passing
    check's status), message (the first problem, prefixed by its check id), notes (what
    happened to the notebook's cells), flags (copy detection, for the instructor),
    time_limited (each check decided by a time limit: it timed out, was re-run alone, and
    what the re-run gave), seed (of the run's cases: ``--seed`` reproduces them) and sandbox
    (what the kernels ran in: "bubblewrap", or a warning that there was none; ``sandbox``,
    by default the run's own, ``results.sandbox``). A notebook whose exercise is unknown
    gets status "unknown exercise".
    """
    where = getattr(results, "sandbox", "") if sandbox is None else sandbox

    def write(f):
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in results:
            w.writerow(gradebook_row(r, where))

    _atomic_write(path, write)


def checks_csv_path(path: str | os.PathLike) -> Path:
    """Where the per-check CSV goes: ``grades.csv`` -> ``grades.checks.csv``."""
    p = Path(path)
    return p.with_name(p.stem + ".checks" + (p.suffix or ".csv"))


def check_rows(r: SubmissionResult) -> list[list]:
    """The per-check rows of ``r`` (:data:`CHECK_CSV_FIELDS`)."""
    if not r.checks:
        return [[_cell(r.file), "", "", 0, 0, "unknown exercise", _cell(r.first_problem)]]
    return [
        [
            _cell(r.file),
            _cell(r.exercise),
            _cell(c.id),
            f"{c.points:g}",
            f"{c.max_points:g}",
            _cell(c.status),
            "" if c.status == "passed" else _cell(c.message),
        ]
        for c in r.checks
    ]


def write_checks_csv(results: list[SubmissionResult], path: str | os.PathLike) -> None:
    """One row per submission and check: file, exercise, check, points, max_points, status,
    message. A notebook whose exercise is unknown gets one row with status "unknown exercise".
    """

    def write(f):
        w = csv.writer(f)
        w.writerow(CHECK_CSV_FIELDS)
        for r in results:
            w.writerows(check_rows(r))

    _atomic_write(path, write)


def write_junit(results: list[SubmissionResult], path: str | os.PathLike) -> None:
    """JUnit XML: one test suite per submission, one test case per check; each suite's
    ``sandbox`` property says what its kernels ran in (``results.sandbox``), and a ``flag``
    property holds each of its flags (near-copies among them)."""
    where = getattr(results, "sandbox", "")
    root = ET.Element("testsuites", name="specdec-grader")
    for r in results:
        file = escape(r.file)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=file,
            tests=str(max(1, len(r.checks))),
            failures=str(sum(c.status == "failed" for c in r.checks)),
            errors=str(
                sum(c.status not in ("passed", "failed") for c in r.checks) + (0 if r.checks else 1)
            ),
            time=f"{r.seconds:.3f}",
        )
        if where or r.flags:
            props = ET.SubElement(suite, "properties")
            if where:
                ET.SubElement(props, "property", name="sandbox", value=escape(where))
            for flag in r.flags:  # copy detection and the like, for the instructor
                ET.SubElement(props, "property", name="flag", value=escape(flag))
        if not r.checks:
            tc = ET.SubElement(suite, "testcase", classname=file, name="exercise")
            ET.SubElement(tc, "error", message=escape(r.first_problem))
        for c in r.checks:
            tc = ET.SubElement(
                suite,
                "testcase",
                classname=f"{file}.{escape(r.exercise)}",
                name=escape(c.id),
                time=f"{c.seconds:.3f}",
            )
            props = ET.SubElement(tc, "properties")
            for entry in r.time_limited:
                if entry.split(":", 1)[0] == c.id:
                    ET.SubElement(props, "property", name="time_limited", value=escape(entry))
            # The instructor's copy of the report: the hint included.
            text = "\n".join(escape(line) for line in c.report(hint=True).split("\n"))
            if c.status == "failed":
                ET.SubElement(tc, "failure", message=escape(c.message), type=c.status).text = text
            elif c.status != "passed":
                ET.SubElement(tc, "error", message=escape(c.message), type=c.status).text = text

    def write(f):
        f.write(ET.tostring(root, encoding="unicode", xml_declaration=True))

    _atomic_write(path, write)


def format_summary(results: list[SubmissionResult], warnings: list[str] = ()) -> str:
    """The terminal table: one line per submission with points, status and the first
    problem, then ``warnings`` (no sandbox, say) in a box that cannot be missed."""
    rows = [("file", "exercise", "points", "status", "first problem")]
    for r in results:
        problem = escape(r.first_problem)
        if r.flags:
            problem = f"[flagged] {problem}" if problem else "[flagged: " + escape(r.flags[0]) + "]"
        rows.append(
            (
                escape(r.file),
                escape(r.exercise or "?"),
                f"{r.points:g}/{r.max_points:g}",
                escape(r.status),
                problem if len(problem) <= 90 else problem[:87] + "...",
            )
        )
    widths = [max(len(row[k]) for row in rows) for k in range(4)]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(row[k].ljust(widths[k]) for k in range(4)) + "  " + row[4])
        if n == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 13)
    if warnings:
        bar = "!" * 78
        lines += ["", bar] + [f"!! WARNING: {escape(w)}" for w in warnings] + [bar]
    return "\n".join(lines)
