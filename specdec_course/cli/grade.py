"""``specdec-course grade``: grade a folder of submissions into a gradebook."""

from __future__ import annotations

import os
import time
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("grade", help="grade notebook submissions (files or folders)")
    p.add_argument("submissions", nargs="+")
    p.add_argument(
        "--out",
        default="grades.csv",
        help="gradebook CSV, one row per submission; per-check rows go to NAME.checks.csv",
    )
    p.add_argument("--junit", default=None, help="also write JUnit XML here")
    p.add_argument("--workers", type=int, default=None, help="parallel submissions")
    p.add_argument("--cell-timeout", type=float, default=60.0)
    p.add_argument("--notebook-timeout", type=float, default=300.0)
    p.add_argument(
        "--memory-mb",
        type=int,
        default=4096,
        help="memory cap per submission (all its processes together where a cgroup can be made)",
    )
    p.add_argument("--exercise", default=None, help="grade as this exercise (default: by name)")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the checks' cases (default: fresh; the gradebook records it)",
    )
    p.add_argument(
        "--sandbox",
        choices=("auto", "require", "off"),
        default="auto",
        help="bubblewrap sandbox per submission: auto (use it if it runs, else warn), "
        "require (fail without it), off",
    )
    p.set_defaults(run=run)


def run(args) -> int:
    """Grade, write the CSV (and JUnit XML), print the summary."""
    from ..grading import batch

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
            memory_mb=args.memory_mb,
            seed=args.seed,
            sandbox_mode=args.sandbox,
        )
    except RuntimeError as e:  # --sandbox require, and bubblewrap cannot run here
        raise ValueError(f"no sandbox: {e}") from e
    wall = time.monotonic() - t0
    batch.write_csv(results, out)
    batch.write_checks_csv(results, batch.checks_csv_path(out))
    if args.junit:
        batch.write_junit(results, args.junit)
    print(batch.format_summary(results, results.warnings))
    total = sum(r.points for r in results)
    full = sum(r.points == r.max_points and r.max_points > 0 for r in results)
    print(
        f"\n{len(results)} submissions graded in {wall:.1f} s "
        f"({args.workers or os.cpu_count() or 1} workers); {full} with full points; "
        f"{total:g} points in all; cases drawn with --seed {results.seed}. "
        f"CSV: {out} (per check: {batch.checks_csv_path(out)})"
        + (f", JUnit: {args.junit}" if args.junit else "")
    )
    return 0
