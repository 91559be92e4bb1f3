"""Reading a code cell's syntax for the copy scan (:mod:`.copying`): its tree, or why it
has none, and its branches that can run (``if False:`` holds dead code, not a forwarder)."""

from __future__ import annotations

import ast

__all__ = ["dead", "live_walk", "parse"]


def parse(source: str) -> ast.Module | str:
    """The cell's tree, or why it has none: ``"syntax"`` (Python cannot run it either) or
    ``"depth"`` (too deep or too large for the scan, which the kernel may still run)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        source = TransformerManager().transform_cell(source)  # magics become Python
    except Exception:  # noqa: BLE001 - IPython missing or a cell it cannot transform
        pass
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return "syntax"
    except (RecursionError, MemoryError):
        return "depth"


def dead(node: ast.AST, attr: str) -> bool:
    # The branch of an `if` / `while` on a constant that never runs (`if False:`).
    test = getattr(node, "test", None)
    if not isinstance(node, (ast.If, ast.While)) or not isinstance(test, ast.Constant):
        return False
    return bool(test.value) == (attr == "orelse")


def live_walk(tree: ast.AST):
    """``ast.walk`` less the branches that never run."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for attr, value in ast.iter_fields(node):
            if dead(node, attr):
                continue
            items = value if isinstance(value, list) else [value]
            todo += [v for v in items if isinstance(v, ast.AST)]
