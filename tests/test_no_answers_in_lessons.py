"""No lesson cell computes a graded function of an exercise (DESIGN: "A lesson never shows the
code an exercise asks for: an exercise is a variation that the lesson's code fails").

The graded functions of exercise NN are those whose body in ``exercises/exNN_*.ipynb`` is a
stub (``raise NotImplementedError``); their answers are the same-named functions of
``solutions/exNN_*.ipynb``. Both sides are AST-normalised: every identifier a cell chooses
(variables, arguments, function names) becomes ``_``, docstrings and annotations go, and
attribute names (the API called: ``.crop``, ``.softmax``) and constants stay. A lesson cell
answers a graded function when some run of consecutive statements in it, at any depth,
normalises to the function's body (or to the body without its final ``return``, inlined),
or to it with one statement changed (a rename of the
loop's bound, an extra slice), the "nearly verbatim" copy a learner would paste. Bodies
smaller than ``MIN_NODES`` AST nodes (``return a + b``) are too generic to own.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
MIN_NODES = 12  # a body smaller than this is a phrase, not an answer


class _Anon(ast.NodeTransformer):
    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id="_", ctx=node.ctx), node)

    def visit_arg(self, node):
        node.arg, node.annotation, node.type_comment = "_", None, None
        return node

    def _fn(self, node):
        node.name, node.returns, node.decorator_list = "_", None, []
        node.body = _strip_docstring(node.body)
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _fn

    def visit_AnnAssign(self, node):
        self.generic_visit(node)
        if node.value is None:
            return None
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)

    def visit_keyword(self, node):  # keyword names are the callee's API: kept
        self.generic_visit(node)
        return node


def _strip_docstring(body):
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(getattr(body[0], "value", None), ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    return body or [ast.Pass()]


def _norm(stmt: ast.stmt) -> str:
    return ast.dump(_Anon().visit(ast.parse(ast.unparse(stmt)).body[0]), annotate_fields=False)


def _size(stmts) -> int:
    return sum(1 for s in stmts for _ in ast.walk(s))


def _parse_cell(source: str) -> ast.Module | None:
    # IPython magics and shell lines are not Python: blank them out, keep line numbers.
    lines = ["" if l.lstrip().startswith(("%", "!")) else l for l in source.split("\n")]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _stub(fn) -> bool:
    return any(
        isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n) for n in ast.walk(fn)
    )


def graded_bodies(stub_nb: Path, solution_nb: Path) -> dict[str, list[str]]:
    """{qualified name: normalised body statements} of the graded functions' answers."""
    stubs, answers = {}, {}
    for path, into in ((stub_nb, stubs), (solution_nb, answers)):
        for cell in nbformat.read(path, as_version=4).cells:
            tree = cell.cell_type == "code" and _parse_cell(cell.source)
            if not tree:
                continue
            for cls in [None, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
                scope = tree.body if cls is None else cls.body
                for fn in scope:
                    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        into[f"{cls.name}.{fn.name}" if cls else fn.name] = fn
    out = {}
    for name, fn in stubs.items():
        if _stub(fn) and name in answers:
            body = _strip_docstring(answers[name].body)
            if _size(body) >= MIN_NODES:
                out[name] = [_norm(s) for s in body]
    return out


def _statement_lists(tree: ast.AST):
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                yield stmts


def _matches(window: list[str], body: list[str]) -> bool:
    if window == body:
        return True
    if len(body) < 3:  # a near match needs enough statements for one change to be minor
        return False
    changed = sum(a != b for a, b in zip(window, body))
    if changed != 1:
        return False
    # The one changed statement must still be mostly the same code.
    a, b = next((a, b) for a, b in zip(window, body) if a != b)
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= 0.85


def answers_in(source: str, bodies: dict[str, list[str]]) -> list[str]:
    """The graded functions whose (normalised) body some statement run of ``source`` is."""
    tree = _parse_cell(source)
    if tree is None:
        return []
    found = []
    lists = [[_norm(s) for s in stmts] for stmts in _statement_lists(tree)]
    for name, body in bodies.items():
        # The computation counts without its final ``return`` too (a cell inlines it).
        shapes = [body] + ([body[:-1]] if len(body) > 1 and body[-1].startswith("Return(") else [])
        shapes = [shape for shape in shapes if _dumped_size(shape) >= MIN_NODES]
        if any(_hit(stmts, shape) for stmts in lists for shape in shapes):
            found.append(name)
    return found


def _dumped_size(stmts: list[str]) -> int:
    return sum(s.count("(") for s in stmts)  # each node of ast.dump opens one parenthesis


def _hit(stmts: list[str], body: list[str]) -> bool:
    n = len(body)
    return any(_matches(stmts[i : i + n], body) for i in range(len(stmts) - n + 1))


def _exercises():
    for stub in sorted((ROOT / "exercises").glob("ex*.ipynb")):
        yield stub, ROOT / "solutions" / stub.name


ALL_BODIES = {
    f"{stub.stem}.{name}": body
    for stub, sol in _exercises()
    for name, body in graded_bodies(stub, sol).items()
}


def test_graded_functions_found():
    # Every exercise contributes its graded functions (a parse that found none would make the
    # scan below vacuous).
    exercises = {name.split(".")[0] for name in ALL_BODIES}
    assert exercises == {stub.stem for stub, _ in _exercises()}, sorted(exercises)
    assert "ex02_acceptance.expected_tokens" in ALL_BODIES
    assert "ex04_rollback.speculative_step" in ALL_BODIES


@pytest.mark.parametrize("lesson", sorted((ROOT / "lessons").glob("*.ipynb")), ids=lambda p: p.stem)
def test_no_lesson_cell_answers_an_exercise(lesson):
    hits = []
    for i, cell in enumerate(nbformat.read(lesson, as_version=4).cells):
        if cell.cell_type == "code":
            hits += [f"cell {i}: {name}" for name in answers_in(cell.source, ALL_BODIES)]
    assert not hits, (
        f"{lesson.name} computes graded functions of an exercise ({'; '.join(hits)}): call the "
        "package's function in the lesson, show another variant, or make the exercise a "
        "variation the lesson's code fails"
    )


PLANTED_EXPECTED_TOKENS = '''
def tokens_per_call(rates):
    """Renamed, re-documented: still ex02's answer."""
    out, alive = 1.0, 1.0
    for r in rates:
        alive *= r
        out += alive
    return out
'''

PLANTED_SLICED = """
for trial in range(3):
    def depth_tokens(rates, k):
        out, alive = 1.0, 1.0
        for r in rates[:k]:  # one statement changed: still the answer
            alive *= r
            out += alive
        return out
"""

UNRELATED = """
def tokens_per_call(rates):
    return sum(math.prod(rates[:i]) for i in range(len(rates) + 1))
"""


def test_planted_answers_are_caught():
    assert "ex02_acceptance.expected_tokens" in answers_in(PLANTED_EXPECTED_TOKENS, ALL_BODIES)
    assert "ex02_acceptance.expected_tokens" in answers_in(PLANTED_SLICED, ALL_BODIES)
    # Inlined at module level, no def around it, with a magic line in the cell.
    inlined = (
        "%matplotlib inline\n"
        + "\n".join(l[4:] for l in PLANTED_EXPECTED_TOKENS.split("\n")[3:-2])
        + "\nprint(out)\n"
    )
    assert "ex02_acceptance.expected_tokens" in answers_in(
        inlined.replace("rates", "xs"), ALL_BODIES
    )
    # A different way to compute the same number is not the exercise's code.
    assert answers_in(UNRELATED, ALL_BODIES) == []
