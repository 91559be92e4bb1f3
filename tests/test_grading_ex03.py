"""Exercise 03's checks: a correct solution earns every point, each typical mistake loses them."""

import math

import pytest
import torch
import torch.nn.functional as F

from specdec_course.grading import checks_for, run_check

# ----------------------------------------------------------------------------- a solution


def cached_attention(q, k, v, K, V, length):
    T_new, hs = q.shape[2], q.shape[3]
    end = length + T_new
    K[:, :, length:end] = k
    V[:, :, length:end] = v
    att = q @ K[:, :, :end].transpose(-2, -1) / math.sqrt(hs)
    allowed = torch.arange(end) <= (length + torch.arange(T_new))[:, None]
    att = att.masked_fill(~allowed, float("-inf")).softmax(-1)
    return att @ V[:, :, :end], end


def crop(K, V, length, n):
    if not 0 <= n <= length:
        raise ValueError("n out of range")
    return n


def measure_alpha(target, draft, x, temperature):
    with torch.no_grad():
        lp, lq = target(x).double(), draft(x).double()
    if temperature == 0:
        return (lp.argmax(-1) == lq.argmax(-1)).double().mean().item()
    p, q = F.softmax(lp / temperature, -1), F.softmax(lq / temperature, -1)
    return torch.minimum(p, q).sum(-1).mean().item()


# ----------------------------------------------------------------------------- mistakes


def attention_unshifted_mask(q, k, v, K, V, length):
    # is_causal on a T_new x end score matrix aligns the mask top-left: wrong with a cache.
    end = length + q.shape[2]
    K[:, :, length:end] = k
    V[:, :, length:end] = v
    return F.scaled_dot_product_attention(q, K[:, :, :end], V[:, :, :end], is_causal=True), end


def attention_new_tensors(q, k, v, K, V, length):
    # Concatenates instead of writing into the buffers: the caller's cache stays empty.
    Kc = torch.cat([K[:, :, :length], k], dim=2)
    Vc = torch.cat([V[:, :, :length], v], dim=2)
    end = Kc.shape[2]
    allowed = torch.arange(end) <= (length + torch.arange(q.shape[2]))[:, None]
    return F.scaled_dot_product_attention(q, Kc, Vc, attn_mask=allowed), end


def attention_no_scale(q, k, v, K, V, length):
    end = length + q.shape[2]
    K[:, :, length:end] = k
    V[:, :, length:end] = v
    att = q @ K[:, :, :end].transpose(-2, -1)
    allowed = torch.arange(end) <= (length + torch.arange(q.shape[2]))[:, None]
    return att.masked_fill(~allowed, float("-inf")).softmax(-1) @ V[:, :, :end], end


def attention_wrong_length(q, k, v, K, V, length):
    y, end = cached_attention(q, k, v, K, V, length)
    return y, end - 1


def crop_zeroing(K, V, length, n):
    K[:, :, n:] = 0
    V[:, :, n:] = 0
    return n


def crop_unchecked(K, V, length, n):
    return n


def alpha_is_tv(target, draft, x, temperature):
    return 1 - measure_alpha(target, draft, x, temperature)


def alpha_ignores_temperature(target, draft, x, temperature):
    return measure_alpha(target, draft, x, 1.0)


def stub(*args):
    raise NotImplementedError


# ----------------------------------------------------------------------------- tests


def test_exercise_03_has_three_checks_worth_ten_points():
    specs = checks_for("ex03")
    assert [s.id for s in specs] == ["ex03.cached_attention", "ex03.crop", "ex03.measure_alpha"]
    assert sum(s.points for s in specs) == 10


def test_solution_earns_every_point():
    for r in (
        run_check("ex03.cached_attention", cached_attention),
        run_check("ex03.crop", cached_attention, crop),
        run_check("ex03.measure_alpha", measure_alpha),
    ):
        assert r.status == "passed", r.report()
        assert r.points == r.max_points


@pytest.mark.parametrize(
    "wrong",
    [attention_unshifted_mask, attention_new_tensors, attention_no_scale, attention_wrong_length],
)
def test_wrong_cached_attention_fails(wrong):
    r = run_check("ex03.cached_attention", wrong)
    assert r.status == "failed" and r.points == 0, r.report()


def test_unshifted_mask_is_explained():
    r = run_check("ex03.cached_attention", attention_unshifted_mask)
    assert "mask" in r.report()


@pytest.mark.parametrize("wrong", [crop_zeroing, crop_unchecked])
def test_wrong_crop_fails(wrong):
    r = run_check("ex03.crop", cached_attention, wrong)
    assert r.status == "failed" and r.points == 0, r.report()


@pytest.mark.parametrize(
    "wrong, says", [(alpha_is_tv, "total variation"), (alpha_ignores_temperature, "temperature")]
)
def test_wrong_alpha_fails_with_a_diagnosis(wrong, says):
    r = run_check("ex03.measure_alpha", wrong)
    assert r.status == "failed" and says in r.report(), r.report()


def test_untouched_stubs_are_not_attempted():
    assert run_check("ex03.cached_attention", stub).status == "not attempted"
    assert run_check("ex03.crop", cached_attention, stub).status == "not attempted"
    assert run_check("ex03.measure_alpha", stub).status == "not attempted"


# ----------------------------------------------------------------------------- the notebooks


@pytest.fixture(scope="module")
def graded_notebooks(tmp_path_factory):
    import copy
    from pathlib import Path

    import nbformat

    from specdec_course.grading import batch

    root = Path(__file__).resolve().parent.parent
    folder = tmp_path_factory.mktemp("ex03_submissions")
    solved = nbformat.read(root / "solutions" / "ex03_char_lm.ipynb", as_version=4)
    nbformat.write(solved, folder / "ex03_solved.ipynb")
    untouched = nbformat.read(root / "exercises" / "ex03_char_lm.ipynb", as_version=4)
    nbformat.write(untouched, folder / "ex03_untouched.ipynb")
    # The classic mistake, made in the notebook: a causal mask that ignores the cache offset.
    wrong = copy.deepcopy(solved)
    cell = next(c for c in wrong.cells if c.source.startswith("def cached_attention"))
    assert "(length + torch.arange(T_new))" in cell.source
    cell.source = cell.source.replace("(length + torch.arange(T_new))", "torch.arange(T_new)")
    nbformat.write(wrong, folder / "ex03_unshifted_mask.ipynb")
    results = batch.grade(
        [folder], workers=2, cell_timeout=30, notebook_timeout=120, memory_mb=0, progress=False
    )
    return {Path(r.file).stem: r for r in results}


def test_the_batch_grader_gives_the_solution_notebook_full_marks(graded_notebooks):
    r = graded_notebooks["ex03_solved"]
    assert r.status == "passed" and r.points == r.max_points == 10, r


def test_the_batch_grader_gives_the_untouched_exercise_zero_as_not_attempted(graded_notebooks):
    r = graded_notebooks["ex03_untouched"]
    assert r.points == 0 and {c.status for c in r.checks} == {"not attempted"}, r


def test_the_batch_grader_finds_an_unshifted_mask_in_a_notebook(graded_notebooks):
    r = graded_notebooks["ex03_unshifted_mask"]
    by_id = {c.id: c for c in r.checks}
    assert by_id["ex03.cached_attention"].status == "failed"
    assert by_id["ex03.crop"].status == "failed"  # its check steps through cached_attention
    assert by_id["ex03.measure_alpha"].status == "passed"
    assert r.points == 4
