"""Feedback never hands out the answer: hints and diagnoses name the idea, not the code.

A failed check prints its diagnosis; the fuller hint only with ``hint=True``. Neither may
quote a line of a solution: no hint of any registered check, and no string in an exercise's
check module, holds code of the kind that solves an exercise (an assignment, a ``return``,
a tensor call, a closed form). The patterns are a tripwire, not a proof; a reviewer reads
new hints too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import specdec_grader as grading

GRADING = Path(grading.__file__).parent

# Shapes of code that, in a hint or a message, would be (part of) a solution.
CODE = [
    r"\breturn\s+[\w.]+\s*[(/*+-]",  # return expr(...), return a / b
    r"\b\w+\s*=\s*\w+\.\w+\(",  # x = obj.method(...)
    r"torch\.\w+\(",
    r"F\.\w+\(",
    r"\.(clamp|clamp_min|sum|argmax|softmax|copy_|crop|masked_fill|cat|sf)\(",
    r"\*\*\s*\(?\w",  # a power: alpha ** (gamma + 1), 0.8**k
    r"range\(",
    r"lambda\b",
]
_CODE = re.compile("|".join(CODE))


def _all_specs():
    return [s for ex in grading.exercises() for s in grading.checks_for(ex)]


@pytest.mark.parametrize("spec", _all_specs(), ids=lambda s: s.id)
def test_every_check_has_a_hint_that_holds_no_code(spec):
    assert spec.hint, f"{spec.id} has no hint"
    hit = _CODE.search(spec.hint)
    assert hit is None, f"{spec.id}'s hint quotes code ({hit.group(0)!r}): {spec.hint}"


def _strings(path: Path):
    """The string literals of a module outside its docstrings (what it can print)."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docs.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            yield node.lineno, text
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docs:
                yield node.lineno, node.value


JUDGE = GRADING / "judge"  # the checks and their messages
CHECK_MODULES = sorted(JUDGE.glob("ex[0-9][0-9].py")) + sorted(JUDGE.glob("ex[0-9][0-9]/*.py"))
# Without them the parametrized test below would pass vacuously (it once did: the checks moved).
assert len(CHECK_MODULES) >= 10, f"no check modules under {JUDGE}"


@pytest.mark.parametrize("path", CHECK_MODULES, ids=lambda p: str(p.relative_to(JUDGE)))
def test_no_message_of_an_exercise_quotes_solution_code(path):
    # Messages are long prose strings; short literals (names, labels, shapes) are left out.
    bad = [
        (line, s)
        for line, s in _strings(path)
        if len(s) > 40 and " " in s and _CODE.search(s) and not s.startswith(("ex0", "%"))
    ]
    assert not bad, "\n".join(f"{path.name}:{line}: {s!r}" for line, s in bad)


def test_a_failed_report_offers_the_hint_and_prints_it_only_on_request():
    res = grading.run_check("ex01.residual_distribution", lambda p, q: p)
    assert res.status == "failed" and res.message
    plain, full = res.report(), res.report(hint=True)
    flat, flat_full = " ".join(plain.split()), " ".join(full.split())  # reports wrap prose
    message = " ".join(res.message.split())
    assert message in flat and "hint=True" in plain and "hint:" not in plain
    assert message in flat_full and f"hint: {' '.join(res.hint.split())}" in flat_full
    # wrapped for a notebook's output: no line of the hint runs past 88 characters
    lines = full.splitlines()
    hint = lines[next(i for i, ln in enumerate(lines) if ln.startswith("  hint: ")) :]
    assert len(hint) > 1 and all(len(ln) <= 88 for ln in hint), full
    table = grading.grade_namespace("ex01", {"residual_distribution": lambda p, q: p})
    assert "hint=True" in table.report() and "hint:" in table.report(hint=True)
