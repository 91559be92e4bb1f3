"""The batch grader's reports: the gradebook CSV, the per-check CSV, JUnit XML, the summary."""

from __future__ import annotations

import csv
import os
import xml.etree.ElementTree as ET
from pathlib import Path

from .jobs import SubmissionResult

__all__ = ["checks_csv_path", "format_summary", "write_checks_csv", "write_csv", "write_junit"]

CSV_FIELDS = ["file", "exercise", "points", "max_points", "status", "message"]
CHECK_CSV_FIELDS = ["file", "exercise", "check", "points", "max_points", "status", "message"]


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
            w.writerow(
                [
                    r.file,
                    r.exercise or "",
                    f"{r.points:g}",
                    f"{r.max_points:g}",
                    r.status,
                    r.first_problem,
                ]
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
                w.writerow([r.file, "", "", 0, 0, "unknown exercise", r.first_problem])
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
            ET.SubElement(tc, "error", message=r.first_problem)
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
        problem = r.first_problem
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
