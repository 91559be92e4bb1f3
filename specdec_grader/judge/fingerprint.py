"""Near-copies of graded functions, found after the edits that keep a copy a copy.

A copy with its locals renamed, its docstrings deleted, dead code added or independent
statements swapped is still a copy. Each graded function of a notebook (its ``def`` or
``class``, with the notebook's own functions it calls) is read as a syntax tree and put in
its normal form (:mod:`.normal_form`: no docstrings, comments or dead code, constants
folded, independent statements in one order), then read as one token per syntax node. An
identifier is named by its order of first use within each k-gram, so renaming changes no
k-gram. The k-grams are fingerprinted by winnowing (Schleimer, Wilkerson and Aiken, 2003:
MOSS), and the fingerprints of the exercise's starter code (``exercises/``) are removed,
as MOSS removes a base file's.

Two versions of a function are near-copies when the fingerprints they share reach
:data:`THRESHOLD` of the smaller one's; the flag names both and the lines that match. It
is a flag for the instructor (points unchanged), on by default: the calibration is in
``tests/test_grading_fingerprint.py`` (three honest versions of every graded function,
none flagged; every obfuscation of the course's solutions flagged).
"""

from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass, field

from .normal_form import normalise, reads, tokens

__all__ = [
    "K", "THRESHOLD", "WINDOW", "Prints", "compare", "flag_near_copies", "graded_names",
    "notebook_prints", "prints",
]  # fmt: skip

K = 12  # tokens in a k-gram
WINDOW = 4  # k-grams per winnowing window: every shared run of K + WINDOW - 1 tokens is seen
THRESHOLD = 0.75  # shared fingerprints over the smaller set's: a near-copy at or above
MIN_PRINTS = 3  # a function this small (after the starter code's are removed) is not compared
_MAX_CODE = 2**20  # characters of code in a notebook: more is not read


@dataclass
class Prints:
    """One function's fingerprints: ``{hash: (first line, last line)}`` of its first
    k-gram with that hash, lines as ``(cell, line)``."""

    name: str
    where: dict[int, tuple] = field(default_factory=dict)


def _kgram_hash(window: list[str]) -> int:
    names: dict[str, str] = {}
    text = []
    for t in window:  # identifiers by their order of first use in this k-gram
        text.append(names.setdefault(t, f"v{len(names)}") if t.startswith("ID:") else t)
    return int.from_bytes(hashlib.blake2b("\x1f".join(text).encode(), digest_size=8).digest())


def prints(nodes: list[tuple[int, ast.AST]], name: str) -> Prints:
    """The winnowed fingerprints of ``nodes`` (``(cell, def or class)`` pairs, in order)."""
    toks: list = []
    for cell, node in nodes:
        tokens(normalise(node), (cell, getattr(node, "lineno", 1)), toks)
    hashes = [_kgram_hash([t for t, _ in toks[i : i + K]]) for i in range(len(toks) - K + 1)]
    out = Prints(name)
    last = -1
    for i in range(max(0, len(hashes) - WINDOW + 1)):
        win = hashes[i : i + WINDOW]
        j = i + max(k for k in range(len(win)) if win[k] == min(win))  # rightmost minimum
        if j != last:
            last = j
            out.where.setdefault(hashes[j], (toks[j][1], toks[j + K - 1][1]))
    return out


def _cells(notebook_text: str) -> list[str]:
    try:
        cells = json.loads(notebook_text)["cells"]
        code = [c["source"] for c in cells if c.get("cell_type") == "code"]
        return ["".join(c) if isinstance(c, list) else str(c) for c in code]
    except Exception:  # noqa: BLE001 - not a notebook: nothing to compare
        return []


def _defs(cells: list[str]) -> dict[str, tuple[int, ast.AST]]:
    """The notebook's top-level functions and classes by name (the last definition); none
    for more code than the grader grades (:mod:`.scan_bounds` refuses it)."""
    found: dict[str, tuple[int, ast.AST]] = {}
    if sum(len(c) for c in cells) > _MAX_CODE:
        return found
    for n, source in enumerate(cells, 1):
        lines = [("#" + x if x.lstrip().startswith(("%", "!")) else x) for x in source.split("\n")]
        try:
            tree = ast.parse("\n".join(lines))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[node.name] = (n, node)
    return found


def _unit(defs: dict, name: str) -> list[tuple[int, ast.AST]]:
    """``name``'s definition and the notebook's functions it calls, transitively."""
    order, todo = [], [name]
    while todo and len(order) < 20:
        n = todo.pop(0)
        if n in order or n not in defs:
            continue
        order.append(n)
        todo += sorted(reads([defs[n][1]]) & set(defs))
    return [defs[n] for n in order]


def notebook_prints(notebook_text: str, names, base: dict[str, set[int]] = {}) -> dict:  # noqa: B006
    """``{name: Prints}`` of the graded functions ``names`` the notebook defines, each
    without the fingerprints in ``base[name]`` (the starter code's). Never raises on a
    notebook it cannot read (it finds nothing there)."""
    defs = _defs(_cells(notebook_text))
    out = {}
    for name in names:
        if name not in defs:
            continue
        try:
            p = prints(_unit(defs, name), name)
        except RecursionError:
            continue
        for h in base.get(name, ()):
            p.where.pop(h, None)
        out[name] = p
    return out


def _ranges(spans: list[tuple]) -> str:
    """``cell 3 lines 2-7`` from ``((cell, first), (cell, last))`` spans, merged."""
    by_cell: dict[int, list[list[int]]] = {}
    for (c0, a), (_, b) in sorted(spans):
        runs = by_cell.setdefault(c0, [])
        if runs and a <= runs[-1][1] + 1:
            runs[-1][1] = max(runs[-1][1], b)
        else:
            runs.append([a, b])
    parts = []
    for cell, runs in sorted(by_cell.items()):
        text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs[:4])
        parts.append(f"code cell {cell} lines {text}")
    return " and ".join(parts[:3])


def compare(a: Prints, b: Prints) -> tuple[float, str, str]:
    """``(score, a's matched lines, b's matched lines)``: the fingerprints the two share over
    the smaller set's (0 where either has fewer than :data:`MIN_PRINTS`)."""
    if min(len(a.where), len(b.where)) < MIN_PRINTS:
        return 0.0, "", ""
    shared = a.where.keys() & b.where.keys()
    score = len(shared) / min(len(a.where), len(b.where))
    return score, _ranges([a.where[h] for h in shared]), _ranges([b.where[h] for h in shared])


def graded_names() -> list[str]:
    """Every name a check of any exercise grades (its ``needs``)."""
    from .core import checks_for, exercises

    return sorted({n for ex in exercises() for spec in checks_for(ex) for n in spec.needs})


def _starter(names) -> dict[str, set[int]]:
    """The fingerprints of the course's starter code (``exercises/``), by function name."""
    from specdec_course.paths import REPO_ROOT

    base: dict[str, set[int]] = {}
    for path in sorted((REPO_ROOT / "exercises").glob("*.ipynb")):
        try:
            found = notebook_prints(path.read_text(encoding="utf-8"), names)
        except (OSError, UnicodeDecodeError):
            continue
        for name, p in found.items():
            base.setdefault(name, set()).update(p.where)
    return base


def flag_near_copies(subs, solutions=(), limit: int = 6) -> None:
    """Flag every submission of ``subs`` (read by :mod:`.discovery`: ``source``, ``display``,
    ``flags``) whose version of a graded function is a near-copy of that function in a
    notebook of the ``solutions`` folders, or in another submission. Points are unchanged:
    the flag names the function, the other notebook, the score and the matching lines."""
    import os
    from pathlib import Path

    names = graded_names()
    base = _starter(names)
    refs = []  # (display, real path, {name: Prints})
    for folder in solutions:
        for path in sorted(Path(folder).rglob("*.ipynb")):
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            refs.append((str(path), os.path.realpath(path), notebook_prints(text, names, base)))
    mine = []
    for s in subs:
        if s.problem or s.source is None:
            mine.append({})
            continue
        mine.append(notebook_prints(s.source, names, base))
    pairs: list[tuple[int, str, float, str, str, str]] = []
    for i, s in enumerate(subs):
        real = os.path.realpath(s.path)
        for display, ref_real, theirs in refs:
            if ref_real == real:  # the solutions' own file, graded by name
                continue
            for name, p in mine[i].items():
                if name in theirs:
                    score, here, there = compare(p, theirs[name])
                    if score >= THRESHOLD:
                        pairs.append((i, display, score, name, here, there))
    for i in range(len(subs)):
        for j in range(i + 1, len(subs)):
            if subs[i].source == subs[j].source:  # flagged as identical already
                continue
            for name in sorted(mine[i].keys() & mine[j].keys()):  # (the same order every run)
                score, a, b = compare(mine[i][name], mine[j][name])
                if score >= THRESHOLD:
                    pairs.append((i, subs[j].display, score, name, a, b))
                    pairs.append((j, subs[i].display, score, name, b, a))
    count: dict[int, int] = {}
    for i, other, score, name, here, there in pairs:
        count[i] = count.get(i, 0) + 1
        if count[i] > limit:
            continue
        subs[i].flags.append(
            f"a near-copy of {other}'s {name} ({score:.0%} of the fingerprints shared once "
            f"names, docstrings, dead code and statement order are set aside: here {here}, "
            f"there {there})"
        )
