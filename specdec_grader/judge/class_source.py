"""A student's ``nn.Module`` class, taken out of the notebook's source by the judge (ex06's
``MedusaHead``), to be defined in a fresh kernel (:mod:`.fresh`).

The cell the judge writes holds the notebook's top-level imports of ``torch``, ``math`` and
``numpy`` (nothing else of the notebook's) and the last top-level ``class`` of that name. So
no other cell of the notebook runs where the class is probed: a cell that replaced a probe
through ``os.sys.modules``, or patched ``torch``, is not there. Defining the class runs
nothing of the student's either: the class statement may hold a docstring, methods and plain
constants only; its base is ``nn.Module``; no decorators, metaclass, or defaults and
annotations other than constants and names. Its methods run when the probe calls them, and
all they can do is compute the answers the judge then checks against its own.
"""

from __future__ import annotations

import ast

from .kernel_source import Refused, _code_cells

__all__ = ["class_cell"]

_IMPORT_ROOTS = {"torch", "math", "numpy"}
_HEADER = "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n"


def _transform(source: str) -> str:
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)  # magics become Python
    except Exception:  # noqa: BLE001 - IPython missing or a cell it cannot transform
        return source


def _plain(node: ast.expr | None) -> bool:
    """A constant, a name or a dotted name (``torch.Tensor``), ``X | None``, ``X[Y]``."""
    if node is None or isinstance(node, (ast.Constant, ast.Name)):
        return True
    if isinstance(node, ast.Attribute):
        return _plain(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _plain(node.left) and _plain(node.right)
    if isinstance(node, ast.Subscript):
        return _plain(node.value) and _plain(node.slice)
    if isinstance(node, ast.Tuple):
        return all(_plain(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.operand, ast.Constant)
    return False


def _is_module_base(node: ast.expr) -> bool:
    text = ast.unparse(node)
    return text in ("nn.Module", "torch.nn.Module", "Module")


def _check(cls: ast.ClassDef) -> None:
    name = cls.name
    if cls.decorator_list or cls.keywords:
        raise Refused(f"class {name} has a decorator or a metaclass: leave them out")
    if len(cls.bases) != 1 or not _is_module_base(cls.bases[0]):
        raise Refused(f"class {name} must derive from nn.Module (and nothing else)")
    for i, stmt in enumerate(cls.body):
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the docstring
        if isinstance(stmt, ast.Pass):
            continue
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and _plain(stmt.value):
            if isinstance(stmt, ast.AnnAssign) and not _plain(stmt.annotation):
                raise Refused(f"class {name}: annotate with a type's name only")
            continue
        if isinstance(stmt, ast.FunctionDef):
            a = stmt.args
            if stmt.decorator_list:
                raise Refused(f"{name}.{stmt.name} has a decorator: leave it out")
            if not all(_plain(d) for d in (*a.defaults, *a.kw_defaults)):
                raise Refused(f"{name}.{stmt.name}'s defaults must be plain values")
            args = (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
            if not all(_plain(x.annotation) for x in args if x is not None):
                raise Refused(f"{name}.{stmt.name}: annotate with a type's name only")
            if not _plain(stmt.returns):
                raise Refused(f"{name}.{stmt.name}: annotate with a type's name only")
            continue
        raise Refused(
            f"class {name} holds a {type(stmt).__name__} outside its methods: the grader "
            "defines the class on its own, so keep to a docstring, methods and constants"
        )


def _imports(tree: ast.Module) -> list[str]:
    out = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            if all(a.name.split(".")[0] in _IMPORT_ROOTS for a in node.names):
                out.append(ast.unparse(node))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").split(".")[0] in _IMPORT_ROOTS:
                if all(a.name != "*" for a in node.names):
                    out.append(ast.unparse(node))
    return out


def class_cell(notebook_text: str, name: str) -> str:
    """The source of a cell that defines the notebook's last top-level ``class name`` after
    the notebook's imports of ``torch``, ``math`` and ``numpy``.

    Raises :class:`.kernel_source.Refused` (with the reason) when there is no such class,
    a later statement rebinds the name, or the class statement would run code of its own."""
    found: ast.ClassDef | None = None
    imports: list[str] = []
    for source in _code_cells(notebook_text):
        try:
            tree = ast.parse(_transform(source))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        imports += _imports(tree)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                found = node
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                found = None
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    found = None
    if found is None:
        raise Refused(
            f"no `class {name}(nn.Module):` at the top level of a code cell: the grader "
            "takes the class from the notebook's source"
        )
    try:
        _check(found)
        body = ast.unparse(found)
    except (RecursionError, MemoryError):
        raise Refused(
            f"class {name} nests an expression too deep for the grader to read it: split it "
            "into shorter statements"
        ) from None
    lines = [_HEADER, *dict.fromkeys(imports), "", body, ""]
    return "\n".join(lines)
