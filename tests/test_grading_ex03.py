"""Exercise 03's checks: a correct solution earns every point, each typical mistake loses them.

The exercise is lesson 03's cached attention varied: a batch whose rows hold caches of
different lengths (stale keys past the shorter rows). The mistakes below
include lesson 03's own single-length cell, which must not pass as is.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import report_text

from specdec_grader import checks_for, run_check

# ----------------------------------------------------------------------------- a solution


def cached_attention(q, k, v, K, V, lengths):
    """Cached attention for rows of different cache lengths; returns (y, lengths + T_new)."""
    B, _, T_new, hs = q.shape
    for b in range(B):  # each row writes at its own length, in place
        n = int(lengths[b])
        K[b, :, n : n + T_new] = k[b]
        V[b, :, n : n + T_new] = v[b]
    end = int(lengths.max()) + T_new  # the longest row; shorter rows mask the rest
    att = q @ K[:, :, :end].transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T_new, end)
    # Row b's new token i sits at position lengths[b] + i and sees positions 0 .. that.
    last = lengths[:, None, None] + torch.arange(T_new)[None, :, None]  # (B, T_new, 1)
    allowed = torch.arange(end)[None, None, :] <= last  # (B, T_new, end)
    att = att.masked_fill(~allowed[:, None], float("-inf")).softmax(dim=-1)
    return att @ V[:, :, :end], lengths + T_new


def measure_alpha(target, draft, x, lengths, temperature):
    with torch.no_grad():
        lp, lq = target(x).double(), draft(x).double()
    text = torch.arange(x.shape[1])[None, :] < lengths[:, None]
    if temperature == 0:
        return (lp.argmax(-1) == lq.argmax(-1))[text].double().mean().item()
    p, q = F.softmax(lp / temperature, -1), F.softmax(lq / temperature, -1)
    return torch.minimum(p, q).sum(-1)[text].mean().item()


def lesson_03_alpha(target, draft, x, lengths, temperature):
    # Lesson 03's cells (sections 6 and 7): the mean over every position of the windows.
    with torch.no_grad():
        lp, lq = target(x).double(), draft(x).double()
    if temperature == 0:
        return (lp.argmax(-1) == lq.argmax(-1)).double().mean().item()
    p, q = F.softmax(lp / temperature, -1), F.softmax(lq / temperature, -1)
    return torch.minimum(p, q).sum(-1).mean().item()


def alpha_row_means(target, draft, x, lengths, temperature):
    rows = [
        measure_alpha(target, draft, x[n : n + 1, :m], torch.tensor([m]), temperature)
        for n, m in enumerate(lengths.tolist())
    ]
    return sum(rows) / len(rows)


# ----------------------------------------------------------------------------- mistakes


def attention_one_length(q, k, v, K, V, lengths):
    # Lesson 03's cell, with the longest row's length for every row: the shorter rows write
    # at the wrong place and see stale keys.
    n = int(lengths.max())
    T_new, hs = q.shape[2], q.shape[3]
    end = n + T_new
    K[:, :, n:end] = k
    V[:, :, n:end] = v
    att = q @ K[:, :, :end].transpose(-2, -1) / math.sqrt(hs)
    allowed = torch.arange(end) <= (n + torch.arange(T_new))[:, None]
    return att.masked_fill(~allowed, float("-inf")).softmax(-1) @ V[:, :, :end], lengths + T_new


def attention_shared_mask(q, k, v, K, V, lengths):
    # Writes each row at its own length, but masks by the longest row: stale keys leak in.
    B, _, T_new, hs = q.shape
    for b in range(B):
        n = int(lengths[b])
        K[b, :, n : n + T_new] = k[b]
        V[b, :, n : n + T_new] = v[b]
    n = int(lengths.max())
    end = n + T_new
    att = q @ K[:, :, :end].transpose(-2, -1) / math.sqrt(hs)
    allowed = torch.arange(end) <= (n + torch.arange(T_new))[:, None]
    return att.masked_fill(~allowed, float("-inf")).softmax(-1) @ V[:, :, :end], lengths + T_new


def attention_unshifted_mask(q, k, v, K, V, lengths):
    # is_causal aligns the mask top-left: wrong with a cache.
    B, _, T_new, _ = q.shape
    for b in range(B):
        n = int(lengths[b])
        K[b, :, n : n + T_new] = k[b]
        V[b, :, n : n + T_new] = v[b]
    end = int(lengths.max()) + T_new
    y = F.scaled_dot_product_attention(q, K[:, :, :end], V[:, :, :end], is_causal=True)
    return y, lengths + T_new


def attention_no_scale(q, k, v, K, V, lengths):
    y, new = cached_attention(q * math.sqrt(q.shape[-1]), k, v, K, V, lengths)
    return y, new


def attention_wrong_length(q, k, v, K, V, lengths):
    y, new = cached_attention(q, k, v, K, V, lengths)
    return y, new - 1


def alpha_is_tv(target, draft, x, lengths, temperature):
    return 1 - measure_alpha(target, draft, x, lengths, temperature)


def alpha_ignores_temperature(target, draft, x, lengths, temperature):
    return measure_alpha(target, draft, x, lengths, 1.0)


def stub(*args):
    raise NotImplementedError


# ----------------------------------------------------------------------------- tests


def test_exercise_03_has_two_checks_worth_ten_points():
    specs = checks_for("ex03")
    assert [s.id for s in specs] == ["ex03.cached_attention", "ex03.measure_alpha"]
    assert sum(s.points for s in specs) == 10


def test_solution_earns_every_point():
    for r in (
        run_check("ex03.cached_attention", cached_attention),
        run_check("ex03.measure_alpha", measure_alpha),
    ):
        assert r.status == "passed", r.report()
        assert r.points == r.max_points


@pytest.mark.parametrize(
    "wrong",
    [
        attention_one_length,
        attention_shared_mask,
        attention_unshifted_mask,
        attention_no_scale,
        attention_wrong_length,
    ],
)
def test_wrong_cached_attention_fails(wrong):
    r = run_check("ex03.cached_attention", wrong)
    assert r.status == "failed" and r.points == 0, r.report()


def test_unshifted_mask_is_explained():
    r = run_check("ex03.cached_attention", attention_unshifted_mask)
    assert "mask" in report_text(r)


@pytest.mark.parametrize(
    "wrong, says",
    [
        (alpha_is_tv, "TV distance"),
        (alpha_ignores_temperature, "temperature"),
        (lesson_03_alpha, "averaged over the padding"),
        (alpha_row_means, "each row, then the rows"),
    ],
)
def test_wrong_alpha_fails_with_a_diagnosis(wrong, says):
    r = run_check("ex03.measure_alpha", wrong)
    assert r.status == "failed" and says in report_text(r), r.report()


def test_untouched_stubs_are_not_attempted():
    assert run_check("ex03.cached_attention", stub).status == "not attempted"
    assert run_check("ex03.measure_alpha", stub).status == "not attempted"


# ----------------------------------------------------------------------------- the notebooks


@pytest.fixture(scope="module")
def graded_notebooks(tmp_path_factory):
    import copy
    from pathlib import Path

    import nbformat

    from specdec_grader.judge import batch

    root = Path(__file__).resolve().parent.parent
    folder = tmp_path_factory.mktemp("ex03_submissions")
    # The solution is graded in the shared class (test_grading_batch asserts its full marks).
    solved = nbformat.read(root / "solutions" / "ex03_char_lm.ipynb", as_version=4)
    untouched = nbformat.read(root / "exercises" / "ex03_char_lm.ipynb", as_version=4)
    nbformat.write(untouched, folder / "ex03_untouched.ipynb")
    # The classic mistake, made in the notebook: a causal mask that ignores the cache offset.
    wrong = copy.deepcopy(solved)
    cell = next(c for c in wrong.cells if c.source.startswith("def cached_attention"))
    old = "last = lengths[:, None, None] + torch.arange(T_new)[None, :, None]"
    assert old in cell.source
    cell.source = cell.source.replace(old, "last = torch.arange(T_new)[None, :, None]")
    nbformat.write(wrong, folder / "ex03_unshifted_mask.ipynb")
    results = batch.grade(
        [folder], workers=2, cell_timeout=30, notebook_timeout=120, memory_mb=0, progress=False
    )
    return {Path(r.file).stem: r for r in results}


def test_the_batch_grader_gives_the_untouched_exercise_zero_as_not_attempted(graded_notebooks):
    r = graded_notebooks["ex03_untouched"]
    assert r.points == 0 and {c.status for c in r.checks} == {"not attempted"}, r


def test_the_batch_grader_finds_an_unshifted_mask_in_a_notebook(graded_notebooks):
    r = graded_notebooks["ex03_unshifted_mask"]
    by_id = {c.id: c for c in r.checks}
    assert by_id["ex03.cached_attention"].status == "failed"
    assert by_id["ex03.measure_alpha"].status == "passed"
    assert r.points == 4  # measure_alpha's
