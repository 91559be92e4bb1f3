"""Exercise 05 takes real Triton only (issue 43).

The notebook's ``race_kernel`` must compile with Triton's own compiler for an NVIDIA H100
(``GPUTarget("cuda", 90, 32)``) before it runs under the interpreter: the interpreter alone
runs any Python it is handed (a ``break`` in a loop, torch reached through
``tl.extra.modules``, which is the interpreter's ``sys.modules``). The source check is the
second line: every step of a ``tl.`` path is Triton's own.
"""

from __future__ import annotations

import copy
import json

import nbformat
import pytest
from graded_class import MODE
from nbformat.v4 import new_notebook

from specdec_course.grading.judge import batch
from specdec_course.grading.judge.kernel_source import Refused, is_stub, kernel_cell
from specdec_course.paths import REPO_ROOT

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


@pytest.mark.skipif(MODE != "auto", reason="needs the sandbox with a cgroup")
def test_a_kernel_only_the_interpreter_runs_earns_nothing(tmp_path):
    # The solution, plus a `break` that the interpreter runs as Python (it changes nothing)
    # and that Triton's compiler refuses: 10/10 before, 0 now.
    def add_break(src: str) -> str:
        return src.replace(
            "    tl.store(token_ptr + b, best_idx)",
            "    for _i in range(1):\n        break\n    tl.store(token_ptr + b, best_idx)",
        )

    nbformat.write(_kernel_only(add_break), tmp_path / "ex05_break.ipynb")
    (r,) = batch.grade(
        [tmp_path], workers=1, seed=7, memory_mb=3000, cell_timeout=30,
        notebook_timeout=120, sandbox_mode=MODE, progress=False,
    )  # fmt: skip
    (check,) = r.checks
    assert check.points == 0 and check.status == "failed", check
    assert "does not compile with Triton" in check.message
