"""Copy detection on a notebook's source, by the judge (best effort; the instructor judges).

The course package holds the reference implementation of every exercise, and the kernel
must import the package to run the notebook, so a student can hand in the reference itself.
This module reads the code cells (their Python syntax tree, never running them) and finds:

- **forwarders**: a needed name bound to the package's own object, by ``import``, by
  assignment (``f = sampling.residual_distribution``, a ``lambda``, ``functools.partial``,
  ``types.FunctionType(ref.__code__, ...)``, ``copy.copy``), by a ``def`` that only returns a
  call to the package or calls the package's function of the same name, by a ``def`` that
  refers anywhere in its body (or through a helper ``def`` of the notebook) to one of the
  package's own versions of what the exercise asks for (its ``PUBLIC_IMPLEMENTATIONS``, a
  method's class included), or by a class that subclasses the package's. Such a check
  scores 0, with the reason;
- **flags** for the instructor (points unchanged): code that reads the course's
  ``solutions/`` (or finds the repository through ``specdec_course.__file__``), or that
  patches attributes of imported modules (``torch.Tensor.abs = ...``);
- **tampering** (flagged, and the submission scores 0): code that reaches into the grader
  (its judge side, which the sandbox does not even hold, or its kernel side's internals,
  by import, attribute, ``setattr`` or a string naming them), that inspects the interpreter
  (``gc.get_objects``, ``sys._getframe``, ``inspect.stack``, a traceback's frames), or that
  runs or imports code built at run time (``exec``, ``eval``, ``import_module(x + y)``,
  ``getattr`` of a computed name on the package or ``builtins``, ``builtins.__dict__[...]``,
  ``vars(builtins)``). The
  kernel runs beside such code, so no answer it sends can be told from the student's own.

It is a syntax check, not a proof: a computed name on an object it cannot follow escapes
it, and a correct function may trip it (the sandbox, which holds none of the package's
versions of the exercise, is what keeps such code from scoring). The gradebook says what was found.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass, field

from .reading import dead as _dead
from .reading import live_walk as _live_walk
from .reading import parse as _parse

__all__ = ["Findings", "scan"]

PACKAGE = "specdec_course"
GRADER = "specdec_grader"
_ROOTS = (PACKAGE, GRADER)  # a reference to the grader is followed as one to the course's


def _below(path: str) -> bool:  # inside the course's package or the grader's
    return "." in path and path.split(".")[0] in _ROOTS


# What a notebook may use of the grader: inline feedback and exercise 05's launcher and inputs.
_GRADER_PUBLIC = {
    GRADER,
    f"{GRADER}.check",
    f"{GRADER}.when_implemented",
    f"{GRADER}.ex05_notebook",
    f"{GRADER}.ex05_notebook.launch_race",
    f"{GRADER}.ex05_notebook.make_race_inputs",
    f"{GRADER}.ex05_notebook.reference_race",
}
_FRAME_ATTRS = {"tb_frame", "tb_next", "f_back", "f_globals", "f_locals", "gi_frame", "cr_frame"}
_DYNAMIC = {"exec", "eval", "compile", "__import__", "importlib.import_module", "import_module"}
_SOLUTIONS = re.compile(r"(^|[/\\])solutions([/\\]|$)")
_INTROSPECTION = {
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
    "sys._getframe",
    "sys._current_frames",
    "inspect.stack",
    "inspect.currentframe",
    "inspect.getouterframes",
    "sys.settrace",
    "sys.setprofile",
}
_CONTAINERS = (ast.Dict, ast.List, ast.Tuple, ast.Set)
_CLONERS = {
    "functools.partial",
    "functools.wraps",
    "types.FunctionType",
    "types.MethodType",
    "copy.copy",
    "copy.deepcopy",
}


@dataclass
class Findings:
    """What :func:`scan` found: forwarders by needed name, and flags for the notebook."""

    forwarders: dict[str, str] = field(default_factory=dict)  # name -> why
    flags: list[str] = field(default_factory=list)
    tampering: list[str] = field(default_factory=list)  # flags that cost every point

    def flag(self, why: str) -> None:
        if why not in self.flags and len(self.flags) < 20:
            self.flags.append(why)

    def tamper(self, why: str) -> None:
        """A flag for code that reaches for the grader or the interpreter's insides: the
        kernel runs beside it, so nothing it returns can be told from the student's own
        work; the submission scores 0 and the instructor decides."""
        self.flag(why)
        if why not in self.tampering and len(self.tampering) < 20:
            self.tampering.append(why)


class _Names:
    """What the notebook's top-level names refer to: package objects and imported modules."""

    def __init__(self):
        self.package: dict[str, str] = {}  # local name -> dotted path in the package
        self.modules: dict[str, str] = {}  # local name -> any imported module or object path

    def dotted(self, node: ast.AST) -> str | None:
        """``a.b.c`` as a path through what ``a`` names, or None."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Call):  # __import__("specdec_course.x"), import_module(...)
            f = self.dotted(node.func) or (node.func.id if isinstance(node.func, ast.Name) else "")
            if f.split(".")[-1] in ("__import__", "import_module") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    base = arg.value if f.endswith("import_module") else arg.value.split(".")[0]
                    return ".".join([base, *reversed(parts)])
            if f == "getattr" and len(node.args) >= 2:
                obj, attr = self.dotted(node.args[0]), node.args[1]
                if obj and isinstance(attr, ast.Constant) and isinstance(attr.value, str):
                    return ".".join([obj, attr.value, *reversed(parts)])
            return None
        if not isinstance(node, ast.Name):
            return None
        base = self.package.get(node.id) or self.modules.get(node.id)
        if base is None:
            return None
        return ".".join([base, *reversed(parts)])

    def package_ref(self, node: ast.AST) -> str | None:
        path = self.dotted(node)
        return path if path and path.split(".")[0] in _ROOTS else None

    def refs_in(self, node: ast.AST) -> list[str]:
        """Every package path named anywhere inside ``node``."""
        out = []
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Attribute, ast.Name, ast.Call)):
                p = self.package_ref(sub)
                if p and p not in _ROOTS and p not in out:
                    out.append(p)
        return out


def _unread(found: Findings, n: int, why: str) -> None:
    # A cell the scan cannot read is said, never skipped in silence. One Python cannot
    # compile does not run either (a flag); one too deep for the scan may run in a kernel
    # whose recursion limit was raised: what it does cannot be seen, so it costs the points.
    if why == "syntax":
        found.flag(f"code cell {n} does not parse (a syntax error): the copy scan skipped it")
    else:
        found.tamper(f"code cell {n} is nested too deeply for the copy scan to read")


def _top_statements(body: list[ast.stmt]):
    # Module-level statements, including those inside if / try / with / for at top level
    # (a definition inside `with when_implemented():` still defines the name).
    for node in body:
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for attr in ("body", "orelse", "finalbody"):
            if _dead(node, attr):
                continue
            inner = getattr(node, attr, None)
            if isinstance(inner, list):
                yield from _top_statements([n for n in inner if isinstance(n, ast.stmt)])
        for handler in getattr(node, "handlers", None) or ():
            yield from _top_statements(handler.body)


def _bind_import(names: _Names, local: str, target: str) -> None:
    if target.split(".")[0] in _ROOTS:
        names.package[local] = target
        names.modules.pop(local, None)
    else:
        names.modules[local] = target
        names.package.pop(local, None)


def _record_import(node: ast.stmt, names: _Names, bindings: dict) -> None:
    if isinstance(node, ast.Import):
        for a in node.names:
            local = a.asname or a.name.split(".")[0]
            target = a.name if a.asname else a.name.split(".")[0]
            _bind_import(names, local, target)
            bindings[local] = ("import", target)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for a in node.names:
            local = a.asname or a.name
            target = f"{node.module}.{a.name}"
            _bind_import(names, local, target)
            bindings[local] = ("import", target)


def _canonical(path: str) -> str | None:
    """``module.qualname`` of the package object at ``path`` (a re-export resolved to where
    it is defined), or None for a module, a constant or a path that names nothing. Imports
    only the course's own modules (the judge has them loaded already)."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:  # noqa: BLE001 - not a module: try a shorter prefix
            continue
        try:
            for p in parts[i:]:
                obj = getattr(obj, p)
        except AttributeError:
            return None
        module, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if not (isinstance(module, str) and isinstance(qual, str)):
            return None  # a module, a constant
        return f"{module}.{qual}"
    return None


def _answer_in(node: ast.AST, names: _Names, answers: tuple[str, ...], tainted: dict) -> str | None:
    """Why ``node`` refers to an answer-bearing object of the package, or None: one of
    ``answers`` (or the class of one of its methods), or a notebook name already found to."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and sub.id in tainted:
            return f"uses {sub.id}, which {tainted[sub.id]}"
    if not answers:
        return None
    for ref in names.refs_in(node):
        if not _below(ref):
            continue
        name = _canonical(ref)
        if name and (name in answers or any(a.startswith(name + ".") for a in answers)):
            return f"uses the package's own {ref}, its version of what the exercise asks for"
    return None


def _forwarding_def(node, names: _Names) -> str | None:
    """Why a ``def`` only forwards to the package, or None."""
    body = [
        s
        for s in node.body
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        and not isinstance(s, ast.Pass)
    ]
    for deco in node.decorator_list:
        for ref in names.refs_in(deco):
            return f"is decorated with the package's {ref}"
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            ref = names.package_ref(sub.func)
            if ref and ref.split(".")[-1] == node.name:
                return f"calls the package's own {ref}"
    if len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Call):
        ref = names.package_ref(body[0].value.func)
        if ref:
            return f"only returns the package's {ref}(...)"
    return None


def _forwarding_value(value: ast.AST, names: _Names) -> str | None:
    ref = names.package_ref(value)
    if ref:
        return f"is the package's {ref}"
    if isinstance(value, ast.Lambda):
        refs = names.refs_in(value.body)
        return f"is a lambda around the package's {refs[0]}" if refs else None
    if isinstance(value, ast.Call):
        f = names.dotted(value.func) or ""
        refs = names.refs_in(value)
        if refs and (f in _CLONERS or f.split(".")[-1] in ("partial", "FunctionType", "copy")):
            return f"is {f.split('.')[-1]}(...) of the package's {refs[0]}"
    refs = names.refs_in(value)
    return f"is built from the package's {refs[0]}" if refs else None


def _grader_flags(node: ast.AST, names: _Names, found: Findings) -> None:
    """Flags for code that reaches for the grader itself: its judge side (which the sandbox
    does not hold: importing it fails there, and says so here), its kernel side's agent and
    probes, or code built at run time (which this scan cannot follow)."""
    paths: list[str] = []
    if isinstance(node, (ast.Attribute, ast.Name)):
        paths = [names.package_ref(node) or ""]
    elif isinstance(node, ast.Import):
        paths = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        paths = [f"{node.module}.{a.name}" for a in node.names]
    for path in paths:
        if path.startswith(GRADER + ".") and path not in _GRADER_PUBLIC:
            found.tamper(f"reaches into the grader ({path})")
    if isinstance(node, ast.Attribute) and node.attr in _FRAME_ATTRS:
        found.tamper(f"inspects the interpreter (.{node.attr})")
    if isinstance(node, (ast.Attribute, ast.Name)) and names.dotted(node) == "sys.modules":
        found.tamper("inspects the interpreter (sys.modules)")
    if isinstance(node, ast.Name) and node.id == "__builtins__":
        found.tamper("reaches for the builtins by name (__builtins__)")
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and not isinstance(node.args[1], ast.Constant)
        and (
            (names.dotted(node.args[0]) or "") in ("builtins", "sys", "importlib")
            or names.package_ref(node.args[0])
        )
    ):
        found.tamper(f"runs code built at run time (getattr({names.dotted(node.args[0])}, ...))")
    if isinstance(node, ast.Attribute) and node.attr == "__dict__":
        base = names.dotted(node.value) or ""
        if base == "builtins" or names.package_ref(node.value):
            found.tamper(f"runs code built at run time ({base}.__dict__)")
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "vars"
        and node.args
    ):
        base = names.dotted(node.args[0]) or ""
        if base == "builtins" or names.package_ref(node.args[0]):
            found.tamper(f"runs code built at run time (vars({base}))")
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if re.search(r"grading\.(judge|student_side|kernel)|_Agent\b|\bprobes\b", node.value):
            found.tamper("names the grader's internals in a string")
    if isinstance(node, ast.Call):
        f = names.dotted(node.func) or (node.func.id if isinstance(node.func, ast.Name) else "")
        if f in _DYNAMIC and not (
            node.args and isinstance(node.args[0], ast.Constant) and f not in ("exec", "eval")
        ):
            found.flag(f"runs or imports code built at run time ({f})")


def _notebook_flags(tree: ast.Module, names: _Names, found: Findings) -> None:
    for node in _live_walk(tree):
        _grader_flags(node, names, found)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _SOLUTIONS.search(node.value):
                found.flag("reads the course's solutions/ folder")
        elif isinstance(node, ast.Attribute) and node.attr == "__file__":
            if names.package_ref(node.value):
                found.flag("finds the course's files through specdec_course.__file__")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute):
                    path = names.dotted(t)
                    if path and path.startswith(GRADER):
                        found.tamper(f"patches {path}")
                    elif path:
                        found.flag(f"patches {path}")
        elif isinstance(node, ast.Call):
            f = names.dotted(node.func) or ""
            if f in ("setattr", "builtins.setattr") or (
                isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
            ):
                path = names.dotted(node.args[0]) if node.args else None
                if path and path.startswith(GRADER):
                    found.tamper(f"patches {path}")
                elif path:
                    found.flag(f"patches {path}")
            elif f in _INTROSPECTION:
                found.tamper(f"inspects the interpreter ({f})")
            ref = names.package_ref(node.func)
            if ref and ref.startswith(PACKAGE + ".paths"):
                found.flag("finds the course's files through specdec_course.paths")


def _taint(tainted: dict[str, str], name: str, why: str | None) -> None:
    if why:
        tainted[name] = why if why.startswith("uses the package") else "uses the package's answer"
    else:
        tainted.pop(name, None)


def scan(
    cells: list[str], needs: set[str] | list[str], answers: tuple[str, ...] | list[str] = ()
) -> Findings:
    """Scan the code ``cells`` (in order) for copies of the package's objects bound to the
    ``needs`` names, and for flags. ``answers``: the package's own versions of what the
    exercise asks for (dotted paths of functions and methods): a ``def`` or class that
    refers to one anywhere is a forwarder. A cell that does not parse is flagged (a syntax
    error), or counts as tampering (nested too deeply to read). Never raises, but may run
    long on a huge notebook: the judge runs it bounded (:mod:`.scan_bounds`)."""
    found = Findings()
    names = _Names()
    bindings: dict[str, tuple[str, object]] = {}
    needs = set(needs)
    answers = tuple(answers)
    tainted: dict[str, str] = {}  # notebook names whose code uses an answer
    for n, source in enumerate(cells, 1):
        tree = _parse(source if isinstance(source, str) else "")
        if isinstance(tree, str):
            _unread(found, n, tree)
            continue
        try:
            for node in _top_statements(tree.body):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    _record_import(node, names, bindings)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    why = _answer_in(node, names, answers, tainted)
                    _taint(tainted, node.name, why)
                    bindings[node.name] = ("def", _forwarding_def(node, names) or why)
                    names.package.pop(node.name, None)
                elif isinstance(node, ast.ClassDef):
                    refs = [r for b in node.bases for r in names.refs_in(b)]
                    why = _answer_in(node, names, answers, tainted)
                    _taint(tainted, node.name, why)
                    why = f"subclasses the package's {refs[0]}" if refs else why
                    bindings[node.name] = ("class", why)
                    names.package.pop(node.name, None)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    why = _forwarding_value(node.value, names)
                    used = _answer_in(node.value, names, answers, tainted)
                    why = why or used
                    ref = names.package_ref(node.value)
                    for t in targets:
                        if isinstance(t, ast.Name):
                            _taint(tainted, t.id, used)
                            bindings[t.id] = ("assign", why)
                            held = names.refs_in(node.value)
                            if ref:
                                names.package[t.id] = ref
                            elif held and isinstance(node.value, _CONTAINERS):
                                names.package[t.id] = held[0]  # {"f": sampling.f}, [..]
                            else:
                                names.package.pop(t.id, None)
            _notebook_flags(tree, names, found)
        except RecursionError:
            _unread(found, n, "depth")
    for name in sorted(needs):
        kind, why = bindings.get(name, ("", None))
        if kind == "import" and isinstance(why, str) and _below(why):
            found.forwarders[name] = f"is imported from the package ({why})"
        elif kind in ("def", "class", "assign") and why:
            found.forwarders[name] = str(why)
    for name, why in found.forwarders.items():
        found.flag(f"{name} {why}")
    return found
