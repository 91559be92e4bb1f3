"""The ``specdec-course`` command: open | prepare-data | train | generate | bench | grade | export.

The edge of the package: the only place that parses arguments. Each subcommand is a small
module here with ``add_parser(subparsers)`` and ``run(args)``; it turns the arguments into
calls of the domain modules and prints what they return. Domain modules never import
``cli``. A subcommand's module imports nothing heavy (torch, transformers, the benches) until
its ``run``: parsing, ``--help`` and argument errors answer before torch is imported
(tests/test_cli_fast.py checks that none of them imports it).
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("open", "prepare_data", "train", "generate", "bench", "grade", "export")
# The module of each command; two carry a suffix so that no file name in the package means two
# things (``specdec_course.train`` is the training loop, ``specdec_course.bench`` the benches).
_MODULES = {"train": "train_command", "bench": "bench_command", "open": "open_command"}


class HelpFormatter(argparse.HelpFormatter):
    """Every option's default after its help; descriptions wrapped paragraph by paragraph.

    Like ``argparse.ArgumentDefaultsHelpFormatter``, except that a default of ``None`` or
    ``False`` (an unset option, a flag) is not printed: the help text says what unset means.
    In a description, paragraphs are separated by blank lines and lines that start with two
    spaces (a list) are kept as written.
    """

    def _get_help_string(self, action):
        text = action.help or ""
        unset = action.default is None or action.default is False
        positional = not action.option_strings and action.nargs not in ("?", "*")
        if "%(default)" in text or unset or action.default is argparse.SUPPRESS or positional:
            return text
        return text + " (default: %(default)s)"

    def _fill_text(self, text, width, indent):
        out = []
        for para in text.split("\n\n"):
            if para.startswith("  ") or "\n  " in para:
                out.append("\n".join(indent + line for line in para.split("\n")))
            else:
                out.append(super()._fill_text(para, width, indent))
        return "\n\n".join(out)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that formats its help with :class:`HelpFormatter`; subcommands'
    parsers are made of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def set_threads(n: int) -> None:
    """``devices.set_threads(n)``, imported when a command runs (it imports torch)."""
    from ..devices import set_threads as _set

    _set(n)


def build_parser() -> argparse.ArgumentParser:
    """The ``specdec-course`` parser with every subcommand's options."""
    ap = Parser(
        prog="specdec-course",
        description="Speculative Decoding from Scratch: course tools. "
        "Run `specdec-course COMMAND --help` for a command's options.",
    )
    sub = ap.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{_MODULES.get(name, name)}").add_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the command in ``argv`` (default: ``sys.argv``); returns its exit status (2 for bad
    input, with the error on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"specdec-course {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
