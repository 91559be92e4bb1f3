"""``specdec-course grade``: the old spelling of ``specdec-grader``, passed through.

The grader is a package of its own (``specdec_grader``), which imports the course; the course
never imports it. So this command parses nothing: it replaces its own process with ``python
-m specdec_grader ARGS...`` (the same interpreter, every argument unchanged, ``--help``
included), so that scripts and workflows written for ``specdec-course grade`` keep working,
signals (a kill, Ctrl-C) reach the grader itself, and its exit status is the command's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

GRADER = "specdec_grader"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "grade",
        help="grade notebook submissions: runs `specdec-grader` (see `specdec-grader --help`)",
        description="The grader's own command is `specdec-grader`; `specdec-course grade "
        "ARGS...` runs `python -m specdec_grader ARGS...` with the same arguments.",
        add_help=False,  # --help goes through to the grader
        prefix_chars="\0",  # nothing here is an option: every argument goes through
    )
    p.add_argument(
        "args",
        nargs=argparse.REMAINDER,
        help="what `specdec-grader` takes: submissions and options (`specdec-grader --help`)",
    )
    p.set_defaults(run=run)


def command(args: list[str]) -> list[str]:
    """The command line that grades ``args``."""
    return [sys.executable, "-m", GRADER, *args]


def run(args) -> int:
    """Replace this process with the grader's command (never returns where it can start)."""
    if importlib.util.find_spec(GRADER) is None:  # finds the package; runs none of it
        raise ValueError(
            f"the grader ({GRADER}) is not installed beside this package: install the "
            "repository (pip install -e .), which ships both, and run `specdec-grader`"
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command(args.args))
    return 0  # not reached
