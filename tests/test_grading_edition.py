"""The student edition (issue 43): nothing a submission can import answers a check for it.

In a real sandboxed kernel, withheld as the exercise is graded, every module of the course
package is imported and every public callable (functions, classes, and the functions of
those classes) is called on the checks' own inputs: ex01's residual and step, ex02's expected
tokens, ex10's block weights and thresholds. None may return the checked quantity. scipy's
statistics (the one third-party package a notebook uses that implements a rule some check
grades: ex01's p-value, allowed on purpose) are surveyed too; transformers (the ``[hf]``
extra), vLLM, FlashInfer and SGLang cannot be imported at all. Every module the sandbox can
import has a reason in :data:`specdec_grader.judge.edition.STUDENT_EDITION`.

A positive control runs the same survey outside the sandbox on the package's modules that
do hold the rules, and must find them.
"""

from __future__ import annotations

import time

import pytest
import torch
from graded_class import MODE

from specdec_grader.judge import edition, ex01, ex02, ex10, sandbox
from specdec_grader.judge.core import public_implementations
from specdec_grader.judge.session import Session

pytestmark = pytest.mark.skipif(sandbox.plan(MODE).mode != "bwrap", reason="needs bubblewrap")

# Run in the kernel (and, for the control, here): imports every module under the roots and
# calls every public callable on each case's argument lists, each call under 2 s of CPU.
SURVEY = r'''
import importlib, inspect, math, pkgutil, signal


class _Late(BaseException):
    pass


def _late(signum, frame):
    raise _Late()


def _modules(roots):
    found, failed = [], {}
    for root in roots:
        names = [root]
        try:
            mod = importlib.import_module(root)
            path = getattr(mod, "__path__", None) or []
            names += [i.name for i in pkgutil.walk_packages(path, root + ".")]
        except BaseException as e:
            failed[root] = type(e).__name__
            continue
        for name in names:
            last = name.rsplit(".", 1)[-1]
            if last == "__main__" or name.startswith("specdec_grader.judge") or ".tests" in name:
                continue  # (a package's own test suite is not a tool)
            try:
                found.append(importlib.import_module(name))
            except BaseException as e:
                failed[name] = type(e).__name__
    return found, failed


def _callables(mod):
    for name, obj in sorted(vars(mod).items()):
        if name.startswith("_") or not callable(obj):
            continue
        if getattr(obj, "__module__", None) != mod.__name__:
            continue  # each callable once, where it is defined
        yield f"{mod.__name__}.{name}", obj
        if inspect.isclass(obj):
            for attr, fn in sorted(vars(obj).items()):
                if not attr.startswith("_") and isinstance(fn, (staticmethod, classmethod)):
                    yield f"{mod.__name__}.{name}.{attr}", getattr(obj, attr)
                elif not attr.startswith("_") and inspect.isfunction(fn):
                    yield f"{mod.__name__}.{name}.{attr}", fn


def _timed(fn, args, kwargs):
    old = signal.signal(signal.SIGVTALRM, _late)
    signal.setitimer(signal.ITIMER_VIRTUAL, 2.0)
    try:
        return fn(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, old)


def _tensors(out):
    import numpy as np
    import torch

    items = list(out) if isinstance(out, (tuple, list)) else [out]
    for x in items:
        if isinstance(x, np.ndarray) and x.dtype.kind in "fiub":
            x = torch.from_numpy(np.ascontiguousarray(x))
        if isinstance(x, torch.Tensor) and not x.is_complex():
            yield x.detach().double()


def _same_tensor(out, expected):
    for t in _tensors(out):
        for e in expected:
            if t.numel() == e.numel() and t.numel() > 1:
                if torch.allclose(t.reshape(e.shape), e.double(), atol=1e-9, rtol=0):
                    return True
    return False


def _same_number(out, expected):
    import numpy as np
    import torch

    if isinstance(out, torch.Tensor) and out.numel() == 1:
        out = out.item()
    if isinstance(out, np.generic):
        out = out.item()
    if isinstance(out, bool) or not isinstance(out, (int, float)):
        return False
    return math.isfinite(out) and abs(out - expected) <= 1e-9 * max(1.0, abs(expected))


def _pair(out):
    import torch

    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        return None
    tok, acc = out
    try:
        tok = int(tok.item() if isinstance(tok, torch.Tensor) else tok)
        acc = bool(acc.item() if isinstance(acc, torch.Tensor) else acc)
    except BaseException:
        return None
    return tok, acc


def _same_law(fn, args, law, n):
    import torch

    V = law.numel() // 2
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(2 * V, dtype=torch.float64)
    for i in range(n):
        pair = _pair(_timed(fn, args, {"generator": g}))
        if pair is None or not 0 <= pair[0] < V:
            return False
        counts[pair[0] + (0 if pair[1] else V)] += 1
    return float((counts / n - law).abs().sum() / 2) < 0.04


def survey(roots, cases, n_law=1500):
    """``{"modules", "failed", "callables", "hits"}``: ``hits`` lists ``[callable, case]``
    for every callable that returned a case's expected value on its arguments."""
    import torch

    torch.manual_seed(0)
    mods, failed = _modules(roots)
    seen, hits, n = set(), [], 0
    for mod in mods:
        for name, fn in _callables(mod):
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            n += 1
            for case in cases:
                for args in case["args"]:
                    try:
                        if case["kind"] == "law":
                            out = _timed(fn, args, {"generator": torch.Generator().manual_seed(1)})
                            law = case["expected"]
                            ok = _pair(out) is not None and _same_law(fn, args, law, n_law)
                        else:
                            out = _timed(fn, args, {})
                            ok = (
                                _same_number(out, case["expected"])
                                if case["kind"] == "number"
                                else _same_tensor(out, case["expected"])
                            )
                    except BaseException:
                        ok = False
                    if ok:
                        hits.append([name, case["label"]])
                        break
    return {"modules": [m.__name__ for m in mods], "failed": failed, "callables": n, "hits": hits}
'''

ROOTS = ["specdec_course", "specdec_grader", "scipy.stats"]
HIDDEN = sorted(edition.HIDDEN_PACKAGES)


def _ex01_cases() -> list[dict]:
    cases, rand = ex01._residual_cases()
    out = []
    for label, p, q in [cases[0], cases[1], cases[5]]:  # the residual differs from p and q
        exp = ex01._reference_residual(p, q)
        assert not torch.allclose(exp, p) and not torch.allclose(exp, q)
        out.append({"label": f"ex01 residual: {label}", "kind": "tensor", "args": [[p, q]],
                    "expected": [exp]})  # fmt: skip
    p, q = ex01._t(ex01.P5), ex01._t(ex01.Q5)
    out.append({"label": "ex01 step: the law of (token, accepted)", "kind": "law",
                "args": [[p, q]], "expected": ex01._joint_law(p, q)})  # fmt: skip
    return out


def _ex02_cases() -> list[dict]:
    out = []
    for alphas in ([0.9, 0.5, 0.2], [0.8, 0.7, 0.6, 0.5, 0.4], [0.95, 0.3]):
        exp = ex02.reference_expected_tokens(alphas)
        out.append({"label": f"ex02 expected tokens {alphas}", "kind": "number",
                    "args": [[alphas], [torch.tensor(alphas, dtype=torch.float64)]],
                    "expected": exp})  # fmt: skip
    return out


def _ex10_cases() -> list[dict]:
    g = torch.Generator().manual_seed(5)
    out = []
    for V, k in ((6, 3), (11, 4)):
        p, q, draft = ex10.random_block(g, V, k)
        weights, h = ex10.reference_thresholds(p, q, draft)
        # The check's argument order, and the package's batched one (draft ids, q, p).
        args = [[p, q, draft], [draft[None], q[None], p[None]], [draft, q, p]]
        out.append({"label": f"ex10 weights and thresholds, V={V}, k={k}", "kind": "tensor",
                    "args": args, "expected": [weights, h]})  # fmt: skip
    return out


CASES = {"ex01": _ex01_cases, "ex02": _ex02_cases, "ex10": _ex10_cases}


def _kernel(exercise: str) -> Session:
    s = Session(
        sandbox.plan(MODE),
        tag=f"specdec-edition-{time.monotonic_ns()}",
        memory_mb=2000,
        limits={"as": 2000 * 2**20, "cpu": 900, "nproc": 256, "fsize": 2**24, "nofile": 256},
        notebook_name="edition.ipynb",
        notebook_text="",
        withhold=(exercise, public_implementations(exercise)),
    )
    s.start()
    return s


def _survey_in_sandbox(exercise: str, roots: list[str]) -> dict:
    s = _kernel(exercise)
    try:
        reply = s.run_cell("import torch\n" + SURVEY, 60.0)
        assert reply["ok"], reply
        return s.call({"name": "survey"}, (roots, CASES[exercise]()), {}, timeout=500.0)
    finally:
        s.close()


@pytest.fixture(scope="module")
def surveys():
    return {ex: _survey_in_sandbox(ex, ROOTS) for ex in CASES}


def test_the_survey_finds_the_rules_where_they_are_not_withheld():
    # The control: outside the sandbox, the package's own modules answer the checks.
    ns: dict = {}
    exec(compile("import torch\n" + SURVEY, "survey", "exec"), ns)
    roots = ["specdec_course.sampling", "specdec_course.block_verifier"]
    cases = [*_ex01_cases(), *_ex10_cases()]
    got = {tuple(h) for h in ns["survey"](roots, cases, n_law=1500)["hits"]}
    names = {n for n, _ in got}
    assert "specdec_course.sampling.residual_distribution" in names, got
    assert "specdec_course.sampling.speculative_sample" in names, got
    assert "specdec_course.block_verifier.block_thresholds" in names, got
    # ex02's list of alphas: a closed form for one alpha cannot take it.
    ns2 = ns["survey"](["specdec_course.theory"], _ex02_cases())
    assert ns2["callables"] > 3


@pytest.mark.parametrize("exercise", sorted(CASES))
def test_nothing_importable_in_the_sandbox_reproduces_a_checked_quantity(surveys, exercise):
    result = surveys[exercise]
    assert result["callables"] > 500, result["callables"]  # the package and scipy.stats
    assert "specdec_course.sampling" in result["modules"]
    assert result["hits"] == [], result["hits"]


def test_the_sandbox_imports_exactly_the_listed_modules(surveys):
    # The survey walks the package as the sandbox shows it: every module it finds is listed,
    # and every listed module is found and imports.
    result = surveys["ex01"]
    mine = {m for m in result["modules"] if m.startswith(("specdec_course", "specdec_grader"))}
    assert mine == set(edition.STUDENT_EDITION) - {"specdec_grader.student_side.__main__"}
    assert not [m for m in result["failed"] if m.startswith(("specdec_course", "specdec_grader"))]
    assert all(reason for reason in edition.STUDENT_EDITION.values())


def _package_modules() -> set[str]:
    out = set()
    for root in edition.package_dirs().values():  # the course's and the grader's
        for path in root.rglob("*.py"):
            parts = path.relative_to(root.parent).with_suffix("").parts
            out.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def test_every_module_of_the_package_is_listed_or_left_out_with_a_reason():
    # A module added to the package is in no sandbox until someone lists it with its reason.
    def left_out(m):
        return any(m == p or m.startswith(p + ".") for p in edition.LEFT_OUT)

    modules = _package_modules()
    undecided = sorted(m for m in modules if m not in edition.STUDENT_EDITION and not left_out(m))
    assert not undecided, f"list these in edition.STUDENT_EDITION or LEFT_OUT: {undecided}"
    assert set(edition.STUDENT_EDITION) <= modules  # no entry for a module that is gone
    assert not [m for m in edition.STUDENT_EDITION if left_out(m)]
    assert all(edition.LEFT_OUT.values())
    assert edition.covers("specdec_grader.judge.ex01") is None
    assert edition.covers("specdec_course.cli") is None


def test_the_tree_holds_the_listed_modules_and_imports_without_the_rest(tmp_path):
    # The plain tree, imported in a fresh interpreter that sees only it: every listed module
    # imports (none needs what is left out), and the judge, the command line and the real
    # LLM are not there.
    import subprocess
    import sys

    tree = edition.build_tree()
    files = {p.relative_to(tree) for p in tree.rglob("*.py")}
    assert len(files) == len(edition.STUDENT_EDITION)
    assert {p.name for p in tree.iterdir()} == {"specdec_course", "specdec_grader"}
    assert not (tree / "specdec_grader" / "judge").exists()
    assert not (tree / "specdec_grader" / "cli.py").exists()
    assert not (tree / "specdec_course" / "cli").exists()
    code = (
        f"import sys; sys.path.insert(0, {str(tree)!r}); import importlib\n"
        # (an editable install's finder maps the package's names to the checkout: not here)
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]\n"
        f"for m in {sorted(m for m in edition.STUDENT_EDITION if not m.endswith('__main__'))!r}:\n"
        "    importlib.import_module(m)\n"
        "import specdec_course, specdec_grader\n"
        f"assert specdec_course.__file__.startswith({str(tree)!r})\n"
        f"assert specdec_grader.__file__.startswith({str(tree)!r})\n"
        "for gone in ('specdec_grader.judge', 'specdec_grader.cli', 'specdec_course.cli', "
        "'specdec_course.llm'):\n"
        "    try:\n"
        "        importlib.import_module(gone)\n"
        "    except ImportError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit(gone + ' imported')\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_hf_extra_and_other_rule_holders_are_not_importable_in_the_sandbox():
    s = _kernel("ex01")
    try:
        for name in HIDDEN:
            reply = s.run_cell(f"import {name}\n{name}.__version__\n", 30.0)
            assert not reply["ok"], name
        reply = s.run_cell(
            "from transformers.generation.utils import _speculative_sampling\n", 30.0
        )
        assert not reply["ok"]
    finally:
        s.close()
