"""No assertion on a live wall-clock measurement, in any notebook or test.

A learner presses Run All with a browser and a video call open; CI shares its two cores with
another notebook. A timing asserted live fails there for no fault of the code. So every
``assert`` that reads a value measured by a clock in the same run fails this scan, unless the
value comes from a stored record (``bench.load_*``), or the assert line says why it holds at
any speed with a ``# load-independent: <reason>`` comment (a sum of parts bounded by the
whole, a count of tokens, a hang guard many times its deadline).

The scan follows values in the order the code runs (cell after cell in a notebook, statement
after statement in a test function): a clock read (``time.perf_counter()``, ``timeit``...), a
call to a live measurement helper (``bench.measure_speedup``, ``bench.forward_costs``,
``bench.time_forward``, any ``measure_*``/``time_*``...), a call given ``timings=``, or a time
field (``.seconds``, ``["target_s"]``...) read from anything but a record taints what it is
assigned to, and whatever is computed from a tainted value is tainted in turn.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(
    p for d in ("lessons", "exercises", "solutions") for p in (ROOT / d).glob("*.ipynb")
)
TESTS = sorted((ROOT / "tests").glob("*.py"))

CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
          "process_time_ns", "thread_time", "thread_time_ns", "time", "time_ns", "timeit",
          "repeat", "default_timer"}  # fmt: skip
BARE_CLOCKS = {"perf_counter", "monotonic", "process_time", "thread_time", "default_timer"}
# The bench's helpers that time work in this run (measure_alpha counts; it is not here).
LIVE_HELPER = re.compile(
    r"^(measure_(speedup|batch|block|dynamic|eagle|hf|hf_race)|time_\w+|forward_costs"
    r"|batch_call_costs|profile_methods|run_verifier_sweep|run_gpu_check|paired)$"
)
# Fields of a measurement that are counts, not times: reading them is load-independent.
COUNT_FIELD = re.compile(
    r"alpha|tokens_per|^k$|^best_k$|accepted|calls$|emitted|units|rounds|^diff|identical|^[BKV]$"
    r"|bytes|status|points|prompts|repeats|max_new_tokens|sizes$|^warm$|steps$"
)
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
RECORD = re.compile(r"^load_\w*(results|record)\w*$|^load_(hf|eagle|beyond|speedup|verifier)")
PRAGMA = re.compile(r"#\s*load-independent:\s*\S.{8,}")

TAINT, RECORDED, PLAIN, VERDICT = "tainted", "record", "plain", "verdict"


def _call_name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)


def _reads_clock(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        if f.value.id in {"time", "timeit"} and f.attr in CLOCKS:
            return True
    if isinstance(f, ast.Name) and f.id in BARE_CLOCKS:
        return True
    # devices.clock(dev)() and clock() where clock came from devices.clock
    return isinstance(f, ast.Call) and _call_name(f) == "clock"


class Scan:
    """Taint analysis over one straight-line namespace (a notebook, or one test function)."""

    def __init__(self, lines: list[str], where: str):
        self.lines, self.where = lines, where
        self.state: dict[str, str] = {}
        self.live_functions: set[str] = set()
        self.found: list[str] = []

    # -- what an expression is -------------------------------------------------------------
    def kind(self, node: ast.AST | None) -> str:
        if node is None:
            return PLAIN
        if _field(node) and COUNT_FIELD.search(_field(node)):
            return PLAIN
        kinds = set()
        for n in _walk(node):
            if isinstance(n, ast.Call):
                name = _call_name(n)
                if _reads_clock(n) or (name and LIVE_HELPER.match(name)):
                    return TAINT
                if name in self.live_functions:
                    return TAINT
                if any(k.arg == "timings" and not _is_false(k.value) for k in n.keywords):
                    return TAINT
                if name and RECORD.match(name):
                    kinds.add(RECORDED)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                st = self.state.get(n.id, PLAIN)
                kinds.add(TAINT if st == VERDICT else st)
        if TAINT in kinds:
            return TAINT
        if RECORDED in kinds:
            return RECORDED
        # A time field read from anything that is not a record: measured in this run.
        if any(_field(n) == "seconds" for n in _walk(node)):
            return TAINT
        return PLAIN

    # -- statements --------------------------------------------------------------------------
    def assign(self, target: ast.AST, kind: str, whole: bool = True) -> None:
        if isinstance(target, ast.Name):
            self.state[target.id] = kind if whole else _worse(self.state.get(target.id), kind)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.assign(t, kind, whole)
        elif isinstance(target, ast.Starred):
            self.assign(target.value, kind, whole)
        elif isinstance(target, (ast.Subscript, ast.Attribute)):
            base = target
            while isinstance(base, (ast.Subscript, ast.Attribute)):
                base = base.value
            self.assign(base, kind, whole=False)  # a part of it changed

    def run(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.stmt(stmt)

    def stmt(self, s: ast.stmt) -> None:
        if isinstance(s, ast.Assign):
            k = VERDICT if self.judges_a_time(s.value) else self.kind(s.value)
            if all(isinstance(t, ast.Tuple) for t in s.targets) and isinstance(s.value, ast.Tuple):
                for t in s.targets:
                    for part, v in zip(t.elts, s.value.elts, strict=False):
                        self.assign(part, self.kind(v))
                return
            for t in s.targets:
                self.assign(t, k)
        elif isinstance(s, (ast.AugAssign, ast.AnnAssign)):
            k = self.kind(s.value)
            self.assign(s.target, k, whole=not isinstance(s, ast.AugAssign))
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            self.assign(s.target, self.kind(s.iter))
            for _ in range(2):  # a value carried round the loop
                self.run(s.body)
            self.run(s.orelse)
        elif isinstance(s, (ast.While, ast.If)):
            for _ in range(2 if isinstance(s, ast.While) else 1):
                self.run(s.body)
            self.run(s.orelse)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            for item in s.items:
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, self.kind(item.context_expr))
            self.run(s.body)
        elif isinstance(s, ast.Try):
            for block in (s.body, *(h.body for h in s.handlers), s.orelse, s.finalbody):
                self.run(block)
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = Scan(self.lines, self.where)
            inner.state, inner.live_functions = dict(self.state), set(self.live_functions)
            for a in s.args.args + s.args.kwonlyargs:
                inner.state.pop(a.arg, None)
            inner.run(s.body)
            self.found += inner.found
            returns = [n.value for n in ast.walk(s) if isinstance(n, ast.Return)]
            if any(inner.kind(r) == TAINT for r in returns) or any(
                isinstance(n, ast.Call) and _reads_clock(n) for n in ast.walk(s)
            ):
                self.live_functions.add(s.name)
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            f = s.value.func  # x.append(tainted), x.update(...): x now holds it
            if isinstance(f, ast.Attribute) and self.kind(s.value) == TAINT:
                self.assign(f.value, TAINT, whole=False)
        elif isinstance(s, ast.Assert):
            if self.judges_a_time(s.test) and not self.excused(s):
                line = self.lines[s.lineno - 1].strip()
                self.found.append(f"{self.where}, line {s.lineno}: {line}")

    def judges_a_time(self, test: ast.AST) -> bool:
        """An ordering (<, >=...) of a live time against anything but 0, or a name that holds
        such a verdict. Equality, identity and membership check a measurement's shape."""
        for _ in range(2):  # comprehension variables take the kind of what they run over
            for n in ast.walk(test):
                if isinstance(n, ast.comprehension):
                    self.assign(n.target, self.kind(n.iter))
        for n in _walk(test):
            if isinstance(n, ast.Name) and self.state.get(n.id) == VERDICT:
                return True
            if isinstance(n, ast.Compare) and any(isinstance(o, ORDERING) for o in n.ops):
                sides = [n.left, *n.comparators]
                if (
                    any(self.kind(x) == TAINT for x in sides)
                    and not all(self.kind(x) == TAINT or _is_zero(x) for x in sides)
                    or sum(self.kind(x) == TAINT for x in sides) > 1
                ):
                    return True
        return False

    def excused(self, s: ast.Assert) -> bool:
        end = getattr(s, "end_lineno", s.lineno)
        above = self.lines[s.lineno - 2].strip() if s.lineno > 1 else ""
        said = [above] if above.startswith("#") else []  # a comment line just above it
        return any(PRAGMA.search(x) for x in said + self.lines[s.lineno - 1 : end])


def _field(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value if isinstance(node.slice.value, str) else None
    return None


def _walk(node: ast.AST):
    """ast.walk, not entering a count field (``r["alpha"]``, ``st.accepted``)."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if _field(n) and COUNT_FIELD.search(_field(n)):
            continue
        todo.extend(ast.iter_child_nodes(n))


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)


def _is_false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (None, False)


def _worse(old: str | None, new: str) -> str:
    order = [PLAIN, RECORDED, TAINT, VERDICT]
    return max(old or PLAIN, new, key=order.index)


def _code(cell_source: str) -> str:
    """A cell's Python: IPython magics and shell lines commented out."""
    return "\n".join(
        "#" + ln if ln.lstrip().startswith(("%", "!")) else ln for ln in cell_source.splitlines()
    )


def scan_notebook(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    scan = Scan([], "")
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        src = _code("".join(cell["source"]))
        scan.lines, scan.where = src.splitlines(), f"{path.name} cell {i}"
        scan.run(ast.parse(src).body)
    return scan.found


def scan_source(src: str, where: str) -> list[str]:
    """A test module: its top level, then each function as its own namespace."""
    tree, lines = ast.parse(src), src.splitlines()
    top = Scan(lines, where)
    top.run([s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.ClassDef))])
    found = list(top.found)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = Scan(lines, where)
            fn.live_functions = set(top.live_functions)
            fn.run(node.body)
            found += fn.found
    return sorted(set(found))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_notebook_asserts_a_live_timing(path):
    assert scan_notebook(path) == []


@pytest.mark.parametrize("path", TESTS, ids=lambda p: p.name)
def test_no_test_asserts_a_live_timing(path):
    assert scan_source(path.read_text(encoding="utf-8"), path.name) == []


# -- the scanner itself, on planted examples -----------------------------------------------


def _notebook(tmp_path, *cells: str) -> Path:
    nb = {
        "cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": [],
                   "execution_count": None} for c in cells],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    }  # fmt: skip
    path = tmp_path / "planted.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def test_the_scan_finds_a_planted_live_timing_assert_cells_later(tmp_path):
    path = _notebook(
        tmp_path,
        "import time\nt0 = time.perf_counter()\nwork()\nsecs = time.perf_counter() - t0",
        "per_token = secs / 200\nprint(per_token)",
        "assert per_token < 0.01, 'fast enough'",
    )
    assert scan_notebook(path) == [
        "planted.ipynb cell 2, line 1: assert per_token < 0.01, 'fast enough'"
    ]


@pytest.mark.parametrize(
    "cell",
    [
        'costs = bench.forward_costs(target, draft)\nassert costs["target_rel"][3] < 2.0',
        "live = bench.measure_speedup(t, {}, p)\nrows = live['methods']['draft']\n"
        "assert all(0.3 < r['measured_speedup'] < 5 for r in rows)",
        "step = bench.time_forward(target, 1)\nassert step < 1e-3",
        "out, st = speculative_generate_batch(t, d, p, 6, timings=True)\n"
        "assert st.seconds['target'] < 1",
        "res = train_heads(t)\nassert res.seconds < 60",
        "d = {}\nfor m in ms:\n    t0 = timeit.default_timer()\n"
        "    d[m] = timeit.default_timer() - t0\n"
        "assert d['a'] < d['b']",
        "rec = bench.load_speedup_results()\nt0 = time.monotonic()\n"
        "assert rec['plain_token_s'] < time.monotonic() - t0",
        "def timed(f):\n    t0 = time.perf_counter()\n    f()\n"
        "    return time.perf_counter() - t0\n"
        "assert timed(g) < 1",
        "xs = []\nxs.append(time.process_time())\nassert xs[0] > 1",
        "t0 = time.perf_counter()\nfast = time.perf_counter() - t0 < 1\nassert fast",
    ],
)
def test_the_scan_finds_each_kind_of_live_timing(tmp_path, cell):
    assert len(scan_notebook(_notebook(tmp_path, cell))) == 1, cell


@pytest.mark.parametrize(
    "cell",
    [
        'rec = bench.load_speedup_results()\nassert rec["forward_costs"]["target_rel"][2] > 1.1',
        "stored = bench.load_speedup_results()\nfor res in stored['results']:\n"
        "    for r in res['methods']['draft']:\n        assert r['measured_speedup'] > 1",
        "out, st = speculative_generate(t, d, p, 20, k=4)\nassert st.target_calls <= 20",
        "t0 = time.perf_counter()\nx = 1\nassert x == 1",
        "wall = time.perf_counter()\n"
        "assert sum(parts) <= wall  # load-independent: parts of the whole",
        "costs = [0.02, 0.05]\nassert costs[0] < costs[1]",
    ],
)
def test_the_scan_lets_records_counts_and_excused_bounds_pass(tmp_path, cell):
    assert scan_notebook(_notebook(tmp_path, cell)) == [], cell


def test_the_scan_reads_test_functions_one_at_a_time():
    src = (
        "def test_a():\n    t0 = time.perf_counter()\n    x = time.perf_counter() - t0\n"
        "    assert x < 5\n\n"
        "def test_b():\n    x = 3\n    assert x < 5\n"
    )
    assert scan_source(src, "t.py") == ["t.py, line 4: assert x < 5"]
