"""Exercise 05's Triton kernel, taken out of the notebook's source by the judge.

The kernel process that ran the notebook says nothing the judge can trust about a Triton
kernel: its code can replace the launcher, the ``JITFunction`` class or anything else that
the launch goes through. So the judge reads the ``@triton.jit def race_kernel`` out of the
notebook's syntax tree itself, refuses a body that names anything but ``tl.*`` (or
``triton.*``), its own parameters and locals, other ``@triton.jit`` functions of the
notebook (checked the same way) and a few builtins (``range``, ``min``, ``max``...), and
writes the source of a cell that defines it after ``import triton, triton.language as tl``
only. That cell runs in a fresh kernel in which no student cell has run, so the launch,
the ``JITFunction`` check and the kernel's output there are the grader's own.

What ``tl.*`` names is checked against the installed ``triton.language``: an attribute path
may go through its submodules (``tl.math.div_rn``) but never reach a module outside it or
an object that is not Triton's; of ``triton.*`` only ``cdiv``, ``next_power_of_2`` and
``language``; no attribute of anything starts with ``_``, and a tensor's NumPy buffers
(``.handle``, ``.data``, under the interpreter) are out of reach.
"""

from __future__ import annotations

import ast
import copy
import json
from types import ModuleType

__all__ = [
    "Refused", "compile_cell", "describe", "is_stub", "kernel_cell", "record_launch",
    "specialisation",
]  # fmt: skip

NAME = "race_kernel"
_BUILTINS = {
    "range", "min", "max", "abs", "int", "float", "bool", "len", "print",
    "NotImplementedError", "True", "False", "None",
}  # fmt: skip
_ROOTS = {"tl": "triton.language", "triton": "triton"}
_TRITON_TOP = {"cdiv", "next_power_of_2", "language"}  # what a kernel may use of `triton.`
_FORBIDDEN = (
    ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.ClassDef, ast.FunctionDef,
    ast.AsyncFunctionDef, ast.Lambda, ast.Await, ast.Yield, ast.YieldFrom, ast.With,
    ast.AsyncWith, ast.Try, ast.Delete, ast.ListComp, ast.SetComp, ast.DictComp,
    ast.GeneratorExp,
)  # fmt: skip
_VALUE_ATTRS_DENIED = {"handle", "data"}  # the interpreter's NumPy buffers behind a tensor
_HEADER = (
    "import os\n"
    'os.environ["TRITON_INTERPRET"] = "1"  # CPU tensors, as the exercise runs it\n'
    "import triton\n"
    "import triton.language as tl\n"
)


class Refused(ValueError):
    """The notebook's ``race_kernel`` cannot be run on its own; the text says why."""


def _code_cells(notebook_text: str) -> list[str]:
    try:
        nb = json.loads(notebook_text)
        cells = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
        return [
            c["source"] if isinstance(c["source"], str) else "".join(c["source"]) for c in cells
        ]
    except (ValueError, TypeError, KeyError, AttributeError):
        return []


def _is_jit(deco: ast.expr) -> bool:
    if isinstance(deco, ast.Call):
        deco = deco.func
    if isinstance(deco, ast.Name):
        return deco.id == "jit"
    return (
        isinstance(deco, ast.Attribute)
        and deco.attr == "jit"
        and (isinstance(deco.value, ast.Name) and deco.value.id == "triton")
    )


def _jit_defs(cells: list[str]) -> dict[str, ast.FunctionDef]:
    """The notebook's top-level ``@triton.jit`` functions by name (the last definition)."""
    found: dict[str, ast.FunctionDef] = {}
    for source in cells:
        try:
            from IPython.core.inputtransformer2 import TransformerManager

            source = TransformerManager().transform_cell(source)  # magics become Python
        except Exception:  # noqa: BLE001 - IPython missing or a cell it cannot transform
            pass
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                if node.decorator_list and all(_is_jit(d) for d in node.decorator_list):
                    found[node.name] = node
                else:
                    found.pop(node.name, None)  # a plain def of that name replaces it
    return found


def _triton_path_ok(root: str, attrs: list[str]) -> bool:
    """``tl.a.b`` goes through ``triton.language``'s submodules to an object of Triton's."""
    import importlib

    if root == "triton" and (not attrs or attrs[0] not in _TRITON_TOP):
        return False
    try:
        obj = importlib.import_module(_ROOTS[root])
    except ImportError:
        return False
    base = _ROOTS[root]
    for k, attr in enumerate(attrs):
        obj = getattr(obj, attr, None)
        if obj is None:
            return False
        if isinstance(obj, ModuleType):
            if not obj.__name__.startswith(base):
                return False
            continue
        # Every step past the modules is Triton's own too (`tl.extra.modules` is the
        # interpreter's sys.modules, whose `.get` must not pass), but for a plain value at
        # the end of the path (a dtype's bit width).
        if k == len(attrs) - 1 and isinstance(obj, (bool, int, float, str)):
            return True
        owner = getattr(obj, "__module__", None) or type(obj).__module__
        if not (isinstance(owner, str) and owner.split(".")[0] == "triton"):
            return False
    return not isinstance(obj, ModuleType)


def _check(node: ast.FunctionDef, jit: dict[str, ast.FunctionDef]) -> list[str]:
    """Why ``node`` cannot run on its own (empty: it can); the jit helpers it calls."""
    a = node.args
    params = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if a.vararg or a.kwarg:
        raise Refused(f"{node.name} takes *args or **kwargs: give every parameter a name")
    for x in (*a.posonlyargs, *a.args, *a.kwonlyargs):
        ann = x.annotation
        if ann is not None and not (
            isinstance(ann, ast.Attribute) and ann.attr == "constexpr"
            and isinstance(ann.value, ast.Name) and ann.value.id in _ROOTS
        ):  # fmt: skip
            raise Refused(f"{node.name}'s parameter {x.arg} has an annotation other than "
                          "tl.constexpr")  # fmt: skip
    for d in (*a.defaults, *a.kw_defaults):
        if d is not None and not isinstance(d, ast.Constant):
            raise Refused(f"{node.name}'s defaults must be plain numbers")
    stored = {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
    }
    helpers = []
    inner = {  # attributes that are part of a longer path (`tl.math` in `tl.math.div_rn`)
        id(n.value) for stmt in node.body for n in ast.walk(stmt) if isinstance(n, ast.Attribute)
    }
    for sub in (n for stmt in node.body for n in ast.walk(stmt)):
        if isinstance(sub, _FORBIDDEN):
            raise Refused(
                f"{node.name} holds a {type(sub).__name__}: a Triton kernel's body is tl.* "
                "operations, loops and arithmetic"
            )
        if isinstance(sub, ast.Attribute):
            if sub.attr.startswith("_") or sub.attr in _VALUE_ATTRS_DENIED:
                raise Refused(f"{node.name} reads .{sub.attr}: a Triton kernel has no use for it")
            attrs, base = [], sub
            while isinstance(base, ast.Attribute):
                attrs.append(base.attr)
                base = base.value
            if id(sub) in inner:
                continue
            if isinstance(base, ast.Name) and base.id in _ROOTS and base.id not in stored:
                if not _triton_path_ok(base.id, attrs[::-1]):
                    path = ".".join([base.id, *attrs[::-1]])
                    raise Refused(f"{node.name} uses {path}, which is not Triton's language")
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            n = sub.id
            if n in params or n in stored or n in _BUILTINS or n in _ROOTS:
                continue
            if n in jit:
                helpers.append(n)
                continue
            raise Refused(
                f"{node.name} uses {n}, defined outside it: the grader runs the kernel on its "
                "own (with `triton` and `tl` only), so pass it in or define it inside"
            )
    return helpers


COMPILE_TIMEOUT_S = 180


def is_stub(notebook_text: str) -> bool:
    """The notebook's ``race_kernel`` raises ``NotImplementedError`` unconditionally (a
    statement of its body, not of a branch): the untouched stub, which compiles nowhere."""
    node = _jit_defs(_code_cells(notebook_text)).get(NAME)
    for stmt in node.body if node is not None else ():
        exc = stmt.exc if isinstance(stmt, ast.Raise) else None
        exc = exc.func if isinstance(exc, ast.Call) else exc
        if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
            return True
    return False


def specialisation(value) -> tuple[str, object]:
    """What Triton's launcher keys its cache on for one argument ``value``, for an NVIDIA
    GPU: ``("*fp32", "D")`` for a tensor (its element type, and ``"D"`` where its address is
    a multiple of 16), ``("i32", "D")`` for an int (``"D"``: divisible by 16),
    ``("constexpr", 1)`` for the int 1, ``("constexpr", v)`` for a ``constexpr`` value.

    Computed with Triton's own ``native_specialize_impl`` (the function its launcher calls)
    and the CUDA backend, from a value the judge made: nothing of the submission's."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import native_specialize_impl

    kind, attr = native_specialize_impl(CUDABackend, value, False, True, True)[:2]
    return str(kind), attr


def record_launch(label: str, args: tuple, kwargs: dict) -> dict:
    """One launch of the kernel as the judge made it (``kernel[grid](*args, **kwargs)``):
    every argument's :func:`specialisation`, ``kwargs`` (the ``constexpr`` values, by name)
    kept as they are. ``label`` names the case that launched it."""
    return {
        "label": label,
        "args": [
            [*specialisation(a), a if isinstance(a, (bool, int, float)) else None] for a in args
        ],
        "kwargs": {k: v for k, v in kwargs.items()},
    }


def _bind(node: ast.FunctionDef, launch: dict) -> tuple[dict, dict, list] | None:
    """``(signature, constexprs, attrs)`` of ``launch`` on the kernel ``node`` as Triton's
    launcher binds them: a ``tl.constexpr`` parameter takes the value passed (or its
    default); any other takes the argument's specialisation (an int 1 becomes a constant).
    None where the launch does not bind (the interpreter raised on it already)."""
    a = node.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    defaults = dict(zip([x.arg for x in (*a.posonlyargs, *a.args)][::-1], a.defaults[::-1]))
    defaults.update({x.arg: d for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    args, kwargs = launch["args"], launch["kwargs"]
    if len(args) > len(a.posonlyargs) + len(a.args):
        return None
    signature, constexprs, attrs = {}, {}, []
    for i, x in enumerate(params):
        if i < len(args):
            spec, value = tuple(args[i][:2]), args[i][2]
        elif x.arg in kwargs:
            spec = specialisation(kwargs[x.arg])
            value = kwargs[x.arg]
        elif isinstance(defaults.get(x.arg), ast.Constant):
            value = defaults[x.arg].value
            spec = specialisation(value)
        else:
            return None
        if x.annotation is not None:  # tl.constexpr (the only annotation allowed)
            if value is None:
                return None  # a tensor passed as a constexpr: the launch fails anyway
            signature[x.arg], constexprs[x.arg] = "constexpr", value
        elif spec[0] == "constexpr":
            signature[x.arg], constexprs[x.arg] = "constexpr", spec[1]
        else:
            signature[x.arg] = spec[0]
            if spec[1]:
                attrs.append([i, spec[1]])
    return signature, constexprs, attrs


def describe(signature: dict, constexprs: dict, attrs: list) -> str:
    """A specialisation in words: ``BLOCK_V=16, K: i32, V: i32 (divisible by 16), ...``."""
    names = list(signature)
    aligned = {names[i] for i, _ in attrs}
    parts = [f"{k}={constexprs[k]!r}" for k in names if signature[k] == "constexpr"]
    for k in names:
        if signature[k] != "constexpr" and not signature[k].startswith("*"):
            parts.append(f"{k}: {signature[k]}" + (" (divisible by 16)" if k in aligned else ""))
    ptrs = [f"{k}: {signature[k]}" for k in names if signature[k].startswith("*")]
    return ", ".join(parts + ptrs)


def compile_cell(notebook_text: str, launches: list[dict]) -> str:
    """The source of a cell that compiles the notebook's ``race_kernel`` (and its helpers)
    with Triton's own compiler for an NVIDIA H100 (``GPUTarget("cuda", 90, 32)``), once for
    every distinct specialisation among ``launches`` (:func:`record_launch`: the judge's
    own cases, as launched). It raises ``RuntimeError`` naming the first specialisation that
    does not compile, with the compiler's message (code that only the interpreter runs, or
    a ``tl.constexpr`` branch that no other launch took).

    Raises :class:`Refused` as :func:`kernel_cell` does."""
    source = kernel_cell(notebook_text)[len(_HEADER) :]
    node = _jit_defs(_code_cells(notebook_text))[NAME]
    jobs, seen = [], set()
    for launch in launches:
        bound = _bind(node, launch)
        if bound is None:
            continue
        key = describe(*bound)
        if key in seen:
            continue
        seen.add(key)
        signature, constexprs, attrs = bound
        name = f"{NAME}[{key}] (launched by the case '{launch['label']}')"
        jobs.append((name, signature, constexprs, attrs))
    full = "import triton\nimport triton.language as tl\n" + source
    return (
        "from specdec_course.kernels.compile import compile_source_variants\n"
        f"compile_source_variants({full!r}, {NAME!r}, {jobs!r}, "
        f"arch=90, warp_size=32, timeout={COMPILE_TIMEOUT_S})\n"
    )


def kernel_cell(notebook_text: str) -> str:
    """The source of a cell that defines the notebook's ``race_kernel`` (and the
    ``@triton.jit`` helpers it calls) after ``import triton, triton.language as tl``.

    Raises :class:`Refused` when the notebook has no top-level ``@triton.jit def
    race_kernel`` or its code names anything but Triton's language, its own variables and
    a few builtins."""
    jit = _jit_defs(_code_cells(notebook_text))
    if NAME not in jit:
        raise Refused(
            f"no `@triton.jit def {NAME}(...)` at the top level of a code cell: the grader "
            "takes the kernel from the notebook's source"
        )
    order, todo = [], [NAME]
    while todo:
        name = todo.pop()
        if name in order:
            continue
        order.append(name)
        if len(order) > 20:
            raise Refused(f"{NAME} calls more than 20 other kernels")
        todo += _check(jit[name], jit)
    parts = [_HEADER]
    for name in reversed(order):  # helpers first
        node = jit[name]
        clean = copy.copy(node)
        clean.decorator_list = [ast.Attribute(ast.Name("triton", ast.Load()), "jit", ast.Load())]
        clean.returns = None
        parts.append(ast.unparse(ast.fix_missing_locations(clean)) + "\n")
    return "\n\n".join(parts)
