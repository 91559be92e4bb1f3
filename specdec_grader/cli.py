"""``specdec-grader``: grade a folder of submissions into a gradebook.

The grader's edge, and the only module of the grader that parses arguments (``python -m
specdec_grader`` runs it too). ``specdec-course grade ...`` hands its arguments to this
command in a new process (:mod:`specdec_course.cli.grade`): the course never imports the
grader.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from specdec_course.cli import Parser

# The exit status when no sandbox runs here (``--sandbox off`` grades anyway); it is
# ``sandbox.NO_SANDBOX_EXIT``, written here too so that --help imports no judge module.
NO_SANDBOX_EXIT = 3


def build_parser() -> argparse.ArgumentParser:
    """The ``specdec-grader`` parser."""
    p = Parser(
        prog="specdec-grader",
        description="Grade a class: every notebook runs in its own sandboxed kernel "
        "(bubblewrap), and the checks are judged outside it. Writes the gradebook (one row "
        "per submission), a per-check CSV beside it and, with --junit, JUnit XML. By "
        "default a pool of local workers grades; --scheduler sends one task per submission "
        "to a Dask cluster instead.\n\n"
        "No sandbox, no grading: where bubblewrap (or, for auto, a cgroup) cannot run, grade "
        "refuses before it runs any notebook, says what is missing and how to install it "
        f"(apt-get install bubblewrap), and exits with status {NO_SANDBOX_EXIT}; --sandbox "
        "off grades notebooks you trust without one, and the gradebook's sandbox column says "
        "so.\n\n"
        "Each row is on disk as soon as its submission is graded (OUT, OUT's per-check CSV, "
        "and a journal OUT.journal); if the grader is killed, the same command run again "
        "grades only what is missing, with the same seed, and removes the journal when the "
        "gradebook is complete.",
    )
    p.add_argument("submissions", nargs="+", help="notebooks, or folders searched for them")
    p.add_argument(
        "--out",
        default="grades.csv",
        help="gradebook CSV, one row per submission; per-check rows go to NAME.checks.csv",
    )
    p.add_argument("--junit", default=None, help="also write JUnit XML here")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="submissions graded at once on this machine (default: the number of CPUs)",
    )
    p.add_argument(
        "--scheduler",
        default=None,
        help="grade on a Dask cluster instead of local workers: tcp://HOST:8786 (a running "
        "scheduler; every worker needs this package and bubblewrap) or local:N (a local "
        "cluster of N workers)",
    )
    p.add_argument(
        "--cell-timeout",
        type=float,
        default=60.0,
        help="CPU seconds per cell and check (a cell past it is interrupted and costs only itself)",
    )
    p.add_argument(
        "--notebook-timeout",
        type=float,
        default=300.0,
        help="CPU seconds for all of a notebook's cells (past it: the exercise scores 0)",
    )
    p.add_argument(
        "--cell-wall",
        type=float,
        default=120.0,
        help="wall-clock seconds per cell, sleeping included (past it: the exercise scores 0)",
    )
    p.add_argument(
        "--notebook-wall",
        type=float,
        default=600.0,
        help="wall-clock seconds for all of a submission's grading: cells, replays and checks "
        "(past it: the exercise scores 0, and the worker goes on)",
    )
    p.add_argument(
        "--memory-mb",
        type=int,
        default=2048,
        help="memory cap per submission: all its processes together where a cgroup can be "
        "made (RLIMIT_AS per process otherwise), and the judge's own work on it (past it: the "
        "exercise scores 0); the process count is capped at 256",
    )
    p.add_argument("--exercise", default=None, help="grade as this exercise (default: by name)")
    p.add_argument(
        "--solutions",
        action="append",
        default=None,
        metavar="DIR",
        help="a folder of solutions (repeatable): a hard link to one of its files is not "
        "graded, a near-copy of one of its notebooks is flagged (default: the course's "
        "solutions/, for hard links only)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the checks' cases (default: fresh; the gradebook records it)",
    )
    p.add_argument(
        "--sandbox",
        choices=("auto", "require", "weak", "off"),
        default="auto",
        help="bubblewrap sandbox per submission: auto (bubblewrap and a cgroup per submission, "
        f"else refuse with exit status {NO_SANDBOX_EXIT}), require (the same), weak "
        "(bubblewrap, even where no cgroup caps a submission's processes together), off (no "
        "sandbox: only for notebooks you trust; the gradebook says so)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Grade the submissions in ``argv`` (default: ``sys.argv``); returns the exit status (2
    for bad input, with the error on stderr; 3 where no sandbox can run)."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"specdec-grader: error: {e}", file=sys.stderr)
        return 2


def run(args) -> int:
    """Grade, write the CSV (and JUnit XML), print the summary."""
    from .judge import batch

    out = Path(args.out)
    if not out.parent.exists():
        raise FileNotFoundError(f"--out folder {str(out.parent)!r} does not exist; create it")
    t0 = time.monotonic()
    try:
        results = batch.grade(
            args.submissions,
            exercise=args.exercise,
            workers=args.workers,
            cell_timeout=args.cell_timeout,
            notebook_timeout=args.notebook_timeout,
            cell_wall=args.cell_wall,
            notebook_wall=args.notebook_wall,
            memory_mb=args.memory_mb,
            seed=args.seed,
            sandbox_mode=args.sandbox,
            scheduler=args.scheduler,
            solutions=args.solutions,
            journal=out,
        )
    except batch.NoSandbox as e:
        print(f"specdec-grader: {e}", file=sys.stderr)
        return NO_SANDBOX_EXIT
    except RuntimeError as e:  # an unreachable cluster
        raise ValueError(str(e)) from e
    wall = time.monotonic() - t0
    where = (
        f"Dask: {args.scheduler}"
        if args.scheduler
        else f"{args.workers or os.cpu_count() or 1} workers"
    )
    batch.write_csv(results, out)
    batch.write_checks_csv(results, batch.checks_csv_path(out))
    if args.junit:
        batch.write_junit(results, args.junit)
    results.journal.remove()  # the gradebook is complete
    print(batch.format_summary(results, results.warnings))
    total = sum(r.points for r in results)
    full = sum(r.points == r.max_points and r.max_points > 0 for r in results)
    print(
        f"\n{len(results)} submissions graded in {wall:.1f} s "
        f"({where}); {full} with full points; "
        f"{total:g} points in all; cases drawn with --seed {results.seed}"
        + (f"; {results.resumed} rows resumed from an interrupted run" if results.resumed else "")
        + ". "
        f"CSV: {out} (per check: {batch.checks_csv_path(out)})"
        + (f", JUnit: {args.junit}" if args.junit else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
