"""Exercise 05's checks: a correct race kernel earns every point, each typical mistake loses them.

The kernels below run under the Triton interpreter on CPU tensors. They use only triton
builtins (and tl.max's own combiner through tl.reduce) rather than tl.max / tl.argmax, which
are library @triton.jit helpers: torch may have imported triton in compiled mode earlier in
this process, and the interpreter cannot call such helpers then (see specdec_course.kernels).
"""

from __future__ import annotations

import os

import specdec_course.kernels  # noqa: F401  (chooses the interpreter before the kernels below)

# The kernels below are decorated in interpreter mode (CPU tensors, also on a machine with a
# GPU); the switch is put back after them, so that other test modules are not affected.
_INTERPRET_BEFORE = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from helpers import report_text  # noqa: E402

from specdec_grader import checks_for, run_check  # noqa: E402

_max = tl.standard._elementwise_max
_min = tl.standard._elementwise_min


# ----------------------------------------------------------------------------- a solution


@triton.jit
def race_kernel(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    m = tl.load(pos_ptr + b)
    p_row = p_ptr + (b * (K + 1) + m) * V
    q_row = q_ptr + (b * K + m) * V
    e_row = e_ptr + b * V
    best = -1.0
    best_idx = 0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        ok = cols < V
        p = tl.load(p_row + cols, mask=ok, other=0.0)
        q = tl.load(q_row + cols, mask=ok, other=0.0)
        e = tl.load(e_row + cols, mask=ok, other=1.0)
        s = tl.where(ok, tl.maximum(p - q, 0.0) / e, -1.0)
        tile_best = tl.reduce(s, 0, _max)
        tile_idx = tl.reduce(tl.where(s == tile_best, cols, V), 0, _min)
        better = tile_best > best
        best = tl.where(better, tile_best, best)
        best_idx = tl.where(better, tile_idx, best_idx)
    tl.store(token_ptr + b, best_idx)


# ----------------------------------------------------------------------------- mistakes


@triton.jit
def race_forgets_tile_start(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    m = tl.load(pos_ptr + b)
    best = -1.0
    best_idx = 0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        ok = cols < V
        p = tl.load(p_ptr + (b * (K + 1) + m) * V + cols, mask=ok, other=0.0)
        q = tl.load(q_ptr + (b * K + m) * V + cols, mask=ok, other=0.0)
        e = tl.load(e_ptr + b * V + cols, mask=ok, other=1.0)
        s = tl.where(ok, tl.maximum(p - q, 0.0) / e, -1.0)
        tile_best = tl.reduce(s, 0, _max)
        local = tl.arange(0, BLOCK_V)
        tile_idx = tl.reduce(tl.where(s == tile_best, local, BLOCK_V), 0, _min)  # no + start
        better = tile_best > best
        best = tl.where(better, tile_best, best)
        best_idx = tl.where(better, tile_idx, best_idx)
    tl.store(token_ptr + b, best_idx)


@triton.jit
def race_at_position_zero(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    best = -1.0
    best_idx = 0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        ok = cols < V
        p = tl.load(p_ptr + b * (K + 1) * V + cols, mask=ok, other=0.0)  # ignores pos
        q = tl.load(q_ptr + b * K * V + cols, mask=ok, other=0.0)
        e = tl.load(e_ptr + b * V + cols, mask=ok, other=1.0)
        s = tl.where(ok, tl.maximum(p - q, 0.0) / e, -1.0)
        tile_best = tl.reduce(s, 0, _max)
        tile_idx = tl.reduce(tl.where(s == tile_best, cols, V), 0, _min)
        better = tile_best > best
        best = tl.where(better, tile_best, best)
        best_idx = tl.where(better, tile_idx, best_idx)
    tl.store(token_ptr + b, best_idx)


@triton.jit
def race_over_p(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    m = tl.load(pos_ptr + b)
    best = -1.0
    best_idx = 0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        ok = cols < V
        p = tl.load(p_ptr + (b * (K + 1) + m) * V + cols, mask=ok, other=0.0)
        e = tl.load(e_ptr + b * V + cols, mask=ok, other=1.0)
        s = tl.where(ok, p / e, -1.0)  # forgot the draft
        tile_best = tl.reduce(s, 0, _max)
        tile_idx = tl.reduce(tl.where(s == tile_best, cols, V), 0, _min)
        better = tile_best > best
        best = tl.where(better, tile_best, best)
        best_idx = tl.where(better, tile_idx, best_idx)
    tl.store(token_ptr + b, best_idx)


@triton.jit
def race_padding_wins(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    m = tl.load(pos_ptr + b)
    best = -1.0
    best_idx = 0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        ok = cols < V
        # other=1.0 everywhere and no masked score: a padding column scores 1 / 1 = 1.
        p = tl.load(p_ptr + (b * (K + 1) + m) * V + cols, mask=ok, other=1.0)
        q = tl.load(q_ptr + (b * K + m) * V + cols, mask=ok, other=0.0)
        e = tl.load(e_ptr + b * V + cols, mask=ok, other=1.0)
        s = tl.maximum(p - q, 0.0) / e
        tile_best = tl.reduce(s, 0, _max)
        tile_idx = tl.reduce(tl.where(s == tile_best, cols, V + BLOCK_V), 0, _min)
        better = tile_best > best
        best = tl.where(better, tile_best, best)
        best_idx = tl.where(better, tile_idx, best_idx)
    tl.store(token_ptr + b, best_idx)


@triton.jit
def race_first_tile_only(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    m = tl.load(pos_ptr + b)
    cols = tl.arange(0, BLOCK_V)
    ok = cols < V
    p = tl.load(p_ptr + (b * (K + 1) + m) * V + cols, mask=ok, other=0.0)
    q = tl.load(q_ptr + (b * K + m) * V + cols, mask=ok, other=0.0)
    e = tl.load(e_ptr + b * V + cols, mask=ok, other=1.0)
    s = tl.where(ok, tl.maximum(p - q, 0.0) / e, -1.0)
    best = tl.reduce(s, 0, _max)
    tl.store(token_ptr + b, tl.reduce(tl.where(s == best, cols, V), 0, _min))


@triton.jit
def race_stub(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)  # noqa: F841
    raise NotImplementedError("race_kernel: replace this line with your code")


def race_not_a_kernel(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V):
    return None


@triton.jit
def race_honest_at_64_only(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V: tl.constexpr):
    # A tl.constexpr branch (issue 54): the race where BLOCK_V is 64, the block size the
    # compile gate once used, and anything (here the argmax of p, which compiles) elsewhere.
    b = tl.program_id(0)
    m = tl.load(pos_ptr + b)
    best = -1.0
    best_idx = 0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        ok = cols < V
        p = tl.load(p_ptr + (b * (K + 1) + m) * V + cols, mask=ok, other=0.0)
        q = tl.load(q_ptr + (b * K + m) * V + cols, mask=ok, other=0.0)
        e = tl.load(e_ptr + b * V + cols, mask=ok, other=1.0)
        if BLOCK_V == 64:
            s = tl.where(ok, tl.maximum(p - q, 0.0) / e, -1.0)
        else:
            s = tl.where(ok, p + 0.0 * q * e, -1.0)
        tile_best = tl.reduce(s, 0, _max)
        tile_idx = tl.reduce(tl.where(s == tile_best, cols, V), 0, _min)
        better = tile_best > best
        best = tl.where(better, tile_best, best)
        best_idx = tl.where(better, tile_idx, best_idx)
    tl.store(token_ptr + b, best_idx)


if _INTERPRET_BEFORE is None:
    del os.environ["TRITON_INTERPRET"]
else:
    os.environ["TRITON_INTERPRET"] = _INTERPRET_BEFORE


# ----------------------------------------------------------------------------- tests


def test_exercise_05_grades_its_one_kernel_once_for_ten_points():
    specs = checks_for("ex05")
    assert [s.id for s in specs] == ["ex05.race_kernel"]
    assert sum(s.points for s in specs) == 10


def test_solution_earns_every_point():
    r = run_check("ex05.race_kernel", race_kernel)
    assert r.status == "passed", r.report()
    assert r.points == r.max_points


@pytest.mark.parametrize(
    "wrong, says",
    [
        (race_forgets_tile_start, "within their tile"),
        (race_at_position_zero, "position 0"),
        (race_over_p, "residual"),
        (race_padding_wins, "outside [0, V)"),
    ],
)
def test_wrong_kernels_fail_with_a_diagnosis(wrong, says):
    r = run_check("ex05.race_kernel", wrong)
    assert r.status == "failed" and r.points == 0, r.report()
    assert says in report_text(r), r.report()


def test_a_kernel_without_the_tile_loop_earns_nothing_and_is_told_why():
    r = run_check("ex05.race_kernel", race_first_tile_only)
    assert r.status == "failed" and r.points == 0, r.report()
    # The one-tile cases pass; the first case with several tiles is the one reported.
    assert [c.passed for c in r.cases[:2]] == [True, True], r.report()
    assert "several tiles" in report_text(r), r.report()


def test_untouched_stub_is_not_attempted_and_a_plain_function_is_an_error():
    assert run_check("ex05.race_kernel", race_stub).status == "not attempted"
    r = run_check("ex05.race_kernel", race_not_a_kernel)
    assert r.status == "error" and "@triton.jit" in report_text(r), r.report()


def test_lesson_05_does_not_show_the_race_loop_the_exercise_asks_for():
    # The lesson prints the package's race kernel without its tile loop (the running best
    # over tiles), neither in a code cell nor in an output.
    import json
    from pathlib import Path

    import specdec_course

    source = Path(specdec_course.kernels.rejection.__file__).read_text()
    loop = source[source.index("    for start in range(lo, hi, BLOCK_V):") :]
    loop_lines = [l.strip() for l in loop.split("    if SPLIT:")[0].splitlines() if l.strip()]
    assert len(loop_lines) > 20  # the loop as the package has it
    path = Path(__file__).resolve().parent.parent / "lessons" / "05_triton_verifier.ipynb"
    shown = []
    for cell in json.loads(path.read_text())["cells"]:
        shown.append("".join(cell["source"]))
        for out in cell.get("outputs", []):
            shown.append("".join(out.get("text", "")))
            shown.append("".join(out.get("data", {}).get("text/plain", "")))
    text = "\n".join(shown)
    printed = [l for l in loop_lines if l.startswith(("better_w", "idx_w", "tile_w", "arg_w"))]
    assert printed and not any(l in text for l in printed), "lesson 05 prints the race loop"


def test_a_constexpr_branch_that_compiles_is_caught_by_the_graded_cases():
    # Its other branch compiles (so the compile gate passes it): the interpreter runs the
    # cases with their own block sizes, so that branch is what is graded, and it is wrong.
    r = run_check("ex05.race_kernel", race_honest_at_64_only)
    assert r.status == "failed" and r.points == 0, r.report()
    by_case = {c.name: c.passed for c in r.cases}
    assert (
        by_case["V = 256 in 4 tiles of 64"]
        and not by_case["V = 65 in tiles of 16 (the last holds 1 id)"]
    )


def test_every_launch_of_the_graded_run_is_recorded_as_triton_keys_it():
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import native_specialize_impl

    from specdec_grader.judge import ex05

    launches: list = []
    cases = list(ex05._race_cases(race_kernel, launches))
    assert all(c.passed for c in cases)
    assert [x["label"] for x in launches] == [c.name for c in cases] == [c[0] for c in ex05.CASES]
    assert [x["kwargs"] for x in launches] == [{"BLOCK_V": c[4]} for c in ex05.CASES]
    for launch, (_, _, K, V, _, _) in zip(launches, ex05.CASES):
        kinds = [a[0] for a in launch["args"]]
        assert kinds == ["*i64", "*i64", "*fp32", "*fp32", "*fp32", "i32", "i32"]
        for (kind, attr, value), want in zip(launch["args"][5:], (K, V)):
            assert value == want
            assert (kind, attr) == native_specialize_impl(CUDABackend, want, False, True, True)
