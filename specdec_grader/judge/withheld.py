"""The course's own implementations of what an exercise asks for, kept out of its sandbox.

The package a graded notebook imports holds, besides the lessons' tools, the course's own
version of most exercises: ``sampling.residual_distribution`` is exercise 01's
``residual_distribution``, ``kernels.rejection.race_kernel`` does exercise 05's race. The
kernel runs beside student code, so nothing it reports can tell the student's function from
the package's: code built at run time (``builtins.__dict__['ex' + 'ec']``, a base64 string)
can find the kernel's agent through a traceback's frames or ``gc`` and patch its call path,
so that a graded call is answered by the package's function while ``describe`` still shows
the student's stub. A source scan cannot follow such code, and a pattern list only says
which spellings it knows. What closes it is that the answer is not there to be had: while
an exercise is graded, the student edition its sandbox shows (:func:`.edition.build_tree`)
holds, in place of each module that holds such a function, a rewritten copy in which that
function's body is one ``raise WithheldError``, compiled from the copy, so neither the
source nor the bytecode of the real function is in the sandbox by any route. Every other
name of the module stays, so the lessons' imports in the exercise notebooks work as before;
a function that calls a withheld one raises too.

The judge keeps the real modules: it computes every expected value with its own copy, from
its own inputs, and scores the value the call returned, which can then only come from code
the notebook brought. A ``WithheldError`` that reaches the judge (from a call or a cell)
names the function and flags the submission.

Each exercise module of the judge lists its functions in ``PUBLIC_IMPLEMENTATIONS``
(dotted paths of top-level functions of the package, or of methods of its top-level classes:
``specdec_course.decoding.dynamic.HeuristicK.next_k``). Without bubblewrap there is no tree
to show, and the kernel can read the package (and the judge side) from disk:
:func:`.sandbox.plan` warns about that mode already.
"""

from __future__ import annotations

import ast
import atexit
import os
import re
import shutil
import tempfile
from pathlib import Path

__all__ = [
    "ERROR",
    "HIDDEN_PACKAGES",
    "hidden_package_options",
    "module_file",
    "named_in",
    "rewrite",
    "split",
]

# Third-party packages that hold a second implementation of a graded rule, hidden from every
# sandbox (not importable there; nothing an exercise needs): name -> why.
HIDDEN_PACKAGES = {
    "transformers": "its generation utilities hold _speculative_sampling (ex01's step)",
    "vllm": "its rejection sampler is ex01's rule and ex05's race",
    "flashinfer": "its chain_speculative_sampling is ex01's rule",
    "sglang": "its speculative samplers are ex01's rule",
    "llama_cpp": "its LlamaPromptLookupDecoding copies as ex11's lookup_copy does",
}

ERROR = "WithheldError"  # the type of what a withheld function raises
_SAID = re.compile(r"(specdec_course(?:\.\w+)+) is withheld while (ex\d{2,}) is graded")

_folder: str | None = None


def package_dirs() -> dict[str, Path]:
    """The folder of each package the student edition copies from: the course's and the
    grader's (whose student side and inline feedback a kernel imports)."""
    import specdec_course

    return {
        "specdec_course": Path(specdec_course.__file__).resolve().parent,
        "specdec_grader": Path(__file__).resolve().parents[1],  # this module's package
    }


def module_file(module: str) -> Path:
    """The source file of ``specdec_course.X.Y`` (or ``specdec_grader.X.Y``) on this machine,
    without importing it."""
    parts = module.split(".")
    roots = package_dirs()
    if parts[0] not in roots or not all(p.isidentifier() for p in parts):
        raise ValueError(f"not a module of the course package or the grader: {module!r}")
    base = roots[parts[0]].joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    raise ValueError(f"the course package has no module {module!r}")


def split(path: str) -> tuple[str, str]:
    """``(module, name)`` of a dotted path: ``name`` is a top-level function or
    ``Class.method``. Raises ``ValueError`` when no prefix of ``path`` is a module."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:i])
        try:
            module_file(module)
        except ValueError:
            continue
        if len(parts) - i <= 2:
            return module, ".".join(parts[i:])
        break
    raise ValueError(f"not a function or method of the course package: {path!r}")


def _message(path: str, exercise: str) -> str:
    return (
        f"{path} is withheld while {exercise} is graded: it is the course's own version of "
        "what the exercise asks you to write, so your notebook must not use it"
    )


def rewrite(source: str, module: str, names: set[str], exercise: str) -> str:
    """``source`` of ``module`` with the body of each top-level function or method
    (``Class.method``) in ``names`` replaced by a raise of ``WithheldError`` (decorators and
    signature kept, every other line as it was, so that tracebacks and Triton's source
    reading still match).

    Raises ``ValueError`` when a name is not a top-level function or a method of a
    top-level class of the module."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    found = {}
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, defs) and node.name in names:
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, defs) and f"{node.name}.{sub.name}" in names:
                    found[f"{node.name}.{sub.name}"] = sub
    missing = sorted(set(names) - set(found))
    if missing:
        raise ValueError(f"{module} has no top-level function or method {', '.join(missing)}")
    for name, node in sorted(found.items(), key=lambda kv: kv[1].lineno, reverse=True):
        first, last = node.body[0].lineno, node.end_lineno
        if first == node.lineno:  # `def f(): return x` on one line: no body line to replace
            raise ValueError(f"{module}.{name}: a one-line def cannot be withheld")
        indent = re.match(r"\s*", lines[first - 1]).group(0)
        stub = f"{indent}raise {ERROR}({_message(f'{module}.{name}', exercise)!r})\n"
        lines[first - 1 : last] = [stub]
    lines.append(
        f"\n\nclass {ERROR}(RuntimeError):\n"
        '    """Raised by the course\'s own version of what an exercise asks for, in the '
        'sandbox that grades it."""\n'
    )
    return "".join(lines)


def named_in(error: object) -> tuple[str, str] | None:
    """``(function, exercise)`` when ``error`` (an exception as plain data, from the kernel)
    is, or wraps, a withheld function's ``WithheldError``; else ``None``."""
    if not isinstance(error, dict):
        return None
    m = _SAID.search(str(error.get("message", ""))[:2000])
    return (m.group(1), m.group(2)) if m else None


def _scratch() -> str:
    global _folder
    if _folder is None:
        _folder = tempfile.mkdtemp(prefix="specdec-withheld-")
        atexit.register(shutil.rmtree, _folder, True)
    return _folder


def hidden_package_options(packages=None) -> list[str]:
    """bwrap options that show each installed package of ``packages`` (default
    :data:`HIDDEN_PACKAGES`) as a read-only folder whose ``__init__.py`` raises
    ``ImportError``: the sandbox cannot import it, nor read its files."""
    import importlib.util

    opts: list[str] = []
    for name in sorted(HIDDEN_PACKAGES if packages is None else packages):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        stub = Path(_scratch()) / f"hidden-{name}.py"
        if not stub.exists():
            stub.write_text(
                f"raise ImportError({name + ' is not available while a notebook is graded'!r})\n"
            )
            os.chmod(stub, 0o644)
        folders = list(spec.submodule_search_locations or [])
        for folder in folders:
            real = os.path.realpath(folder)
            opts += ["--tmpfs", real, "--ro-bind", str(stub), f"{real}/__init__.py"]
            opts += ["--remount-ro", real]
        if not folders and spec.origin and os.path.isfile(spec.origin):  # a one-file module
            opts += ["--ro-bind", str(stub), os.path.realpath(spec.origin)]
    return opts
