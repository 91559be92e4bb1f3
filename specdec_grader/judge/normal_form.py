"""The normal form of a graded function, which the copy check fingerprints (:mod:`.fingerprint`).

Docstrings, bare constants and ``pass`` are dropped; constant expressions folded (``2 * 3``
is ``6``); dead code dropped (``if False:`` and ``while False:`` blocks, an ``if True:``'s
``else``, assignments to a name nothing reads); the independent statements of each block
put in one order (the smallest first, by their text with names set aside), so that
swapping them changes nothing. :func:`tokens` then reads the tree as one token per syntax
node (as JPlag tokenises), an identifier as ``ID:name`` for the fingerprint to rename.
"""

from __future__ import annotations

import ast
import operator

__all__ = ["independent", "normalise", "reads", "tokens", "touches"]

_MAX_TOKENS = 20000
_FOLD = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}  # fmt: skip
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}


def _fold(node: ast.AST) -> ast.AST:
    """Constant expressions folded (numbers only, small results)."""
    for name, value in ast.iter_fields(node):
        if isinstance(value, list):
            setattr(node, name, [_fold(v) if isinstance(v, ast.AST) else v for v in value])
        elif isinstance(value, ast.AST):
            setattr(node, name, _fold(value))
    num = (int, float, complex, bool)
    try:
        if (
            isinstance(node, ast.BinOp)
            and type(node.op) in _FOLD
            and isinstance(node.left, ast.Constant)
            and isinstance(node.right, ast.Constant)
            and isinstance(node.left.value, num)
            and isinstance(node.right.value, num)
            and not (isinstance(node.op, ast.Pow) and abs(node.right.value) > 64)
        ):
            return ast.copy_location(
                ast.Constant(_FOLD[type(node.op)](node.left.value, node.right.value)), node
            )
        if (
            isinstance(node, ast.UnaryOp)
            and type(node.op) in _UNARY
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, num)
        ):
            return ast.copy_location(ast.Constant(_UNARY[type(node.op)](node.operand.value)), node)
        if (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.left, ast.Constant)
            and isinstance(node.comparators[0], ast.Constant)
            and isinstance(node.left.value, num)
            and isinstance(node.comparators[0].value, num)
        ):
            ops = {ast.Lt: operator.lt, ast.Gt: operator.gt, ast.LtE: operator.le,
                   ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne}  # fmt: skip
            op = ops.get(type(node.ops[0]))
            if op is not None:
                value = op(node.left.value, node.comparators[0].value)
                return ast.copy_location(ast.Constant(value), node)
    except (ArithmeticError, ValueError, TypeError, OverflowError):
        pass
    return node


def _truth(test: ast.expr) -> bool | None:
    if isinstance(test, ast.Constant):
        try:
            return bool(test.value)
        except Exception:  # noqa: BLE001 - an odd constant: not dead code
            return None
    return None


def reads(nodes) -> set[str]:
    return {
        n.id
        for top in nodes
        for n in ast.walk(top)
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Load, ast.Del))
    }


def _clean(body: list[ast.stmt], read: set[str]) -> list[ast.stmt]:
    """``body`` without docstrings, bare constants, ``pass``, dead branches and assignments
    to names that nothing in the function reads."""
    out: list[ast.stmt] = []
    for s in body:
        if isinstance(s, ast.Pass) or (
            isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
        ):
            continue
        if isinstance(s, (ast.If, ast.While)):
            truth = _truth(s.test)
            if truth is False:
                out += _clean(s.orelse, read)
                continue
            if truth is True and isinstance(s, ast.If):
                out += _clean(s.body, read)
                continue
        if isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            if all(isinstance(t, ast.Name) and t.id not in read for t in targets):
                continue
        for attr in ("body", "orelse", "finalbody"):
            inner = getattr(s, attr, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                setattr(s, attr, _clean(inner, read) or [ast.Pass()])
        for h in getattr(s, "handlers", None) or ():
            h.body = _clean(h.body, read) or [ast.Pass()]
        out.append(s)
    return out


_FLOW = (ast.Return, ast.Raise, ast.Break, ast.Continue, ast.Yield, ast.YieldFrom, ast.Await)


def touches(stmt: ast.stmt) -> tuple[set[str], set[str]]:
    """``(reads, writes)`` of a statement by name: a subscript or attribute stored to writes
    its base name; a statement that leaves the block (``return``, ``break``...) writes
    ``"<flow>"``, which orders it against every other."""
    reads, writes = set(), set()
    for n in ast.walk(stmt):
        if isinstance(n, ast.Name):
            (writes if isinstance(n.ctx, (ast.Store, ast.Del)) else reads).add(n.id)
        elif isinstance(n, (ast.Subscript, ast.Attribute)) and isinstance(n.ctx, ast.Store):
            base = n.value
            while isinstance(base, (ast.Subscript, ast.Attribute)):
                base = base.value
            if isinstance(base, ast.Name):
                writes.add(base.id)
        elif isinstance(n, _FLOW):
            writes.add("<flow>")
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            reads.add(n.target.id)
    return reads, writes


def independent(a: ast.stmt, b: ast.stmt) -> bool:
    """Neither statement writes a name the other reads or writes, and neither leaves."""
    (ra, wa), (rb, wb) = touches(a), touches(b)
    return not (wa & (rb | wb) or wb & ra or "<flow>" in wa | wb)


def _key(stmt: ast.stmt) -> str:
    toks: list = []
    tokens(stmt, (0, 0), toks)
    names: dict[str, str] = {}
    return " ".join(
        names.setdefault(t, f"v{len(names)}") if t.startswith("ID:") else t for t, _ in toks
    )


def _canonical_order(body: list[ast.stmt]) -> list[ast.stmt]:
    """``body`` in one order whatever order its independent statements came in: the
    smallest (by :func:`_key`) of the statements whose predecessors are placed, first."""
    if len(body) < 2 or len(body) > 200:
        return body
    keys = [_key(s) for s in body]
    rw = [touches(s) for s in body]

    def apart(i: int, j: int) -> bool:
        (ra, wa), (rb, wb) = rw[i], rw[j]
        return not (wa & (rb | wb) or wb & ra or "<flow>" in wa | wb)

    before = [{i for i in range(j) if not apart(i, j)} for j in range(len(body))]
    placed: list[int] = []
    left = set(range(len(body)))
    while left:
        ready = [j for j in left if before[j] <= set(placed)]
        j = min(ready, key=lambda j: (keys[j], j))
        placed.append(j)
        left.remove(j)
    return [body[j] for j in placed]


def _reorder(node: ast.AST) -> None:
    for sub in ast.walk(node):
        for attr in ("body", "orelse", "finalbody"):
            inner = getattr(sub, attr, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                setattr(sub, attr, _canonical_order(inner))


def normalise(node: ast.AST) -> ast.AST:
    node = _fold(node)
    for _ in range(4):  # an assignment read only by a dropped one is dead too
        read = reads([node])
        for sub in ast.walk(node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                sub.body = _clean(sub.body, read) or [ast.Pass()]
                if not isinstance(sub, ast.ClassDef):
                    sub.decorator_list = []
                    sub.returns = None
                    for a in (*sub.args.posonlyargs, *sub.args.args, *sub.args.kwonlyargs):
                        a.annotation = None
    _reorder(node)
    return node


def tokens(node: ast.AST, line, out: list) -> None:
    """One token per node: its type, and for a leaf its text (an identifier as ``ID:name``,
    renamed later); ``line`` is ``(cell, line)`` of the nearest node with one."""
    if isinstance(node, (ast.expr_context,)):
        return
    line = (line[0], getattr(node, "lineno", line[1])) if isinstance(line, tuple) else line
    if isinstance(node, ast.Name):
        out.append(("ID:" + node.id, line))
        return
    if isinstance(node, ast.arg):
        out.append(("ID:" + node.arg, line))
        return
    if isinstance(node, ast.Constant):
        out.append((f"C:{type(node.value).__name__}:{str(node.value)[:30]}", line))
        return
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        out.append((type(node).__name__, line))
        out.append(("ID:" + node.name, line))
    else:
        out.append((type(node).__name__, line))
    if isinstance(node, ast.Attribute):
        tokens(node.value, line, out)
        out.append(("." + node.attr, line))
        return
    if isinstance(node, ast.keyword):
        out.append(("kw:" + str(node.arg), line))
    for child in ast.iter_child_nodes(node):
        tokens(child, line, out)
        if len(out) > _MAX_TOKENS:
            return
