"""Obfuscations of a graded function that keep it a copy (for the copy check's tests):
renamed locals, deleted docstrings and comments, dead code added, independent statements
swapped. Each takes and returns a function's source."""

from __future__ import annotations

import ast

from specdec_grader.judge.normal_form import independent


def _defs(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def rename_locals(source: str) -> str:
    tree = ast.parse(source)
    for fn in _defs(tree):
        stored = {
            n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
        new = {name: f"tmp_{k}_{name[::-1]}" for k, name in enumerate(sorted(stored))}
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and n.id in new:
                n.id = new[n.id]
    return ast.unparse(tree)


def drop_docstrings(source: str) -> str:
    tree = ast.parse(source)
    for fn in ast.walk(tree):
        body = getattr(fn, "body", None)
        if isinstance(fn, (ast.FunctionDef, ast.ClassDef)) and body:
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                fn.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)  # comments go too


def add_dead_code(source: str) -> str:
    tree = ast.parse(source)
    for fn in _defs(tree):
        dead = ast.parse(
            "unused_total = 0\nif False:\n    unused_total = unused_total + 1\n"
            "scratch = [0] * 3\nwhile 0:\n    scratch.append(1)\n"
        ).body
        fn.body = dead[:2] + fn.body[:1] + dead[2:] + fn.body[1:]
    return ast.unparse(ast.fix_missing_locations(tree))


def reorder(source: str) -> str:
    """Swap every pair of adjacent independent statements (neither reads or writes what the
    other writes, neither leaves the block: ``normal_form.independent``); ``""`` if there
    is none to swap."""
    tree = ast.parse(source)
    swapped = 0
    for block in ast.walk(tree):
        body = getattr(block, "body", None)
        if not isinstance(body, list) or not body or not isinstance(body[0], ast.stmt):
            continue
        i = 0
        while i + 1 < len(body):
            a, b = body[i], body[i + 1]
            docs = any(
                isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) for s in (a, b)
            )
            if not docs and independent(a, b):
                body[i], body[i + 1] = b, a
                swapped += 1
                i += 2
            else:
                i += 1
    return ast.unparse(tree) if swapped else ""


def everything(source: str) -> str:
    out = reorder(source) or source
    return add_dead_code(rename_locals(drop_docstrings(out)))


OBFUSCATIONS = {
    "renamed locals": rename_locals,
    "deleted docstrings": drop_docstrings,
    "dead code added": add_dead_code,
    "independent statements reordered": reorder,
    "all four": everything,
}
