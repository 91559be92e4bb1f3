"""The ``specdec-course`` command: prepare-data | train | generate | bench | grade.

The edge of the package: the only place that parses arguments. Each subcommand is a small
module here with ``add_parser(subparsers)`` and ``run(args)``; it turns the arguments into
calls of the domain modules and prints what they return. Domain modules never import
``cli``. A subcommand's module is imported only when it runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("prepare_data", "train", "generate", "bench", "grade")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="specdec-course", description="Speculative Decoding from Scratch: course tools."
    )
    sub = ap.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"specdec-course {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
