"""Exercise 05 takes real Triton only (issues 43 and 54).

The notebook's ``race_kernel`` must compile with Triton's own compiler for an NVIDIA H100
(``GPUTarget("cuda", 90, 32)``), once for every specialisation the graded cases launched
(their ``BLOCK_V``, the types and the divisibility of each argument, as Triton's launcher
keys its cache): the interpreter alone runs any Python it is handed (a ``break`` in a
loop, torch reached through ``tl.extra.modules``, which is the interpreter's
``sys.modules``), and a ``tl.constexpr`` branch is compiled only for the block sizes a
compile is asked for. The source check is the second line: every step of a ``tl.`` path
is Triton's own.
"""

from __future__ import annotations

import copy
import json

import nbformat
import pytest
import torch
from graded_class import MODE
from nbformat.v4 import new_notebook

from specdec_course.paths import REPO_ROOT
from specdec_grader.judge import batch, ex05
from specdec_grader.judge.kernel_source import (
    Refused,
    compile_cell,
    is_stub,
    kernel_cell,
    record_launch,
)
from specdec_grader.student_side.helpers import make_race_inputs

HEAD = "def race_kernel(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V: tl.constexpr):\n"


def _nb(body: str) -> str:
    cell = {"cell_type": "code", "source": "@triton.jit\n" + HEAD + body}
    return json.dumps({"cells": [cell]})


@pytest.mark.parametrize(
    "path",
    ["tl.extra.modules.get('builtins')", "tl.float32.modules", "tl.extra.modules['torch']"],
)
def test_every_step_of_a_tl_path_is_triton(path):
    with pytest.raises(Refused, match="not Triton's language"):
        kernel_cell(_nb(f"    x = {path}\n"))


def test_the_stub_is_told_from_a_kernel_that_does_not_compile():
    stub = (REPO_ROOT / "exercises" / "ex05_triton_race.ipynb").read_text()
    solved = (REPO_ROOT / "solutions" / "ex05_triton_race.ipynb").read_text()
    assert is_stub(stub) and not is_stub(solved)
    assert not is_stub(_nb("    if K < 0:\n        raise NotImplementedError\n"))


def _kernel_only(edit) -> nbformat.NotebookNode:
    nb = nbformat.read(REPO_ROOT / "solutions" / "ex05_triton_race.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    kernel = copy.deepcopy(next(c for c in code if "def race_kernel" in c.source))
    kernel.source = edit(kernel.source)
    out = new_notebook(cells=[copy.deepcopy(code[0]), copy.deepcopy(code[1]), kernel])
    out.metadata = copy.deepcopy(nb.metadata)
    return out


def add_break(src: str) -> str:
    """The solution, plus a `break` that the interpreter runs as Python (it changes nothing)
    and that Triton's compiler refuses."""
    return src.replace(
        "    tl.store(token_ptr + b, best_idx)",
        "    for _i in range(1):\n        break\n    tl.store(token_ptr + b, best_idx)",
    )


def honest_at_64_only(src: str) -> str:
    """The constexpr-branch attack (issue 54): the solution where BLOCK_V is 64, the block
    size the compile gate once compiled, and elsewhere the solution plus a `break` (which
    the interpreter runs, so every case passes, and which no GPU compiler takes)."""
    head, body = src.split("BLOCK_V: tl.constexpr):\n", 1)
    inner = "\n".join("    " + line if line else line for line in body.splitlines())
    store = "        tl.store(token_ptr + b, best_idx)"
    broken = inner.replace(store, "        for _i in range(1):\n            break\n" + store)
    return f"{head}BLOCK_V: tl.constexpr):\n    if BLOCK_V == 64:\n{inner}\n    else:\n{broken}\n"


def _launches() -> list[dict]:
    """The graded cases' launches, made as the check makes them (from its own values)."""
    out = []
    for seed, (name, B, K, V, block_v, zero_tail) in enumerate(ex05.CASES):
        pos, p, q, e = make_race_inputs(B, K, V, seed, zero_tail)
        token = torch.full((B,), -1, dtype=torch.int64)
        out.append(record_launch(name, (token, pos, p, q, e, K, V), {"BLOCK_V": block_v}))
    return out


def test_the_gate_compiles_what_the_cases_launch_and_names_what_fails():
    text = nbformat.writes(_kernel_only(honest_at_64_only))
    launches = _launches()
    assert sorted({x["kwargs"]["BLOCK_V"] for x in launches}) == [8, 16, 64, 128, 256, 1024]
    # The old gate's one specialisation (BLOCK_V = 64) compiles: it is the honest branch.
    exec(compile_cell(text, [x for x in launches if x["kwargs"]["BLOCK_V"] == 64]), {})
    # Every launched one is compiled, and the first that fails is named with its case.
    with pytest.raises(RuntimeError) as err:
        exec(compile_cell(text, launches), {})
    first = str(err.value).splitlines()[0]
    assert first.startswith("race_kernel[BLOCK_V=16, K: i32, V: i32 (divisible by 16)"), first
    assert "(launched by the case 'V = 16 in one tile of 16, 8 rows, K = 4')" in first
    assert "UnsupportedLanguageConstruct" in str(err.value)


def test_a_constexpr_parameter_is_compiled_with_each_value_launched():
    cell = compile_cell(
        nbformat.writes(_kernel_only(lambda s: s.replace(", K, V,", ", K: tl.constexpr, V,"))),
        _launches(),
    )
    for K in {c[2] for c in ex05.CASES}:
        assert f"'K': {K}" in cell
    assert "'K': 'constexpr'" in cell and "'V': 'i32'" in cell


@pytest.mark.skipif(MODE != "auto", reason="needs the sandbox with a cgroup")
def test_kernels_only_the_interpreter_runs_earn_nothing(tmp_path):
    # Both pass every case under the interpreter. The `break`: 10/10 before issue 43, 0 now.
    # The constexpr branch: 10/10 before issue 54 (the gate compiled BLOCK_V = 64 only).
    nbformat.write(_kernel_only(add_break), tmp_path / "ex05_break.ipynb")
    nbformat.write(_kernel_only(honest_at_64_only), tmp_path / "ex05_constexpr_branch.ipynb")
    run = batch.grade(
        [tmp_path], workers=1, seed=7, memory_mb=3000, cell_timeout=30,
        notebook_timeout=120, sandbox_mode=MODE, progress=False,
    )  # fmt: skip
    by = {r.file.rsplit("/", 1)[-1]: r for r in run}
    for name in ("ex05_break.ipynb", "ex05_constexpr_branch.ipynb"):
        (check,) = by[name].checks
        assert check.points == 0 and check.status == "failed", check
        assert "does not compile with Triton" in check.message
        assert all(c.passed for c in check.cases[:-1]), check  # the interpreter's cases
    message = by["ex05_constexpr_branch.ipynb"].checks[0].message
    assert "race_kernel[BLOCK_V=16, " in message and "UnsupportedLanguageConstruct" in message
