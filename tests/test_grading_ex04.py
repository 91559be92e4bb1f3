"""Exercise 04's checks: a correct solution earns every point, each classic off-by-one loses them.

The mistakes are the ones rollback invites: keeping the rejected draft in a cache, forgetting
that the draft model never fed its last draft after a full acceptance (its catch-up), and
dropping the bonus (or recovered) token. Each must fail with a message that names it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from helpers import report_text

from specdec_grader import checks_for, grade_namespace, run_check

# ----------------------------------------------------------------------------- a solution


def rollback(lengths, prefix_lens, num_accepted):
    if bool(((num_accepted < 0) | (num_accepted > lengths - prefix_lens)).any()):
        raise ValueError("num_accepted out of range")
    return prefix_lens + num_accepted


def commit_tokens(ids, n, token_ids, num_accepted, target_lengths, draft_lengths):
    B, k1 = token_ids.shape
    new_ids = torch.cat([ids, ids.new_full((B, k1), -1)], 1)
    cols = n[:, None] + torch.arange(k1)
    keep = torch.arange(k1) <= num_accepted[:, None]
    new_ids.scatter_(1, cols, torch.where(keep, token_ids, new_ids.gather(1, cols)))
    new_n = n + num_accepted + 1
    return new_ids, new_n, new_n - 1, torch.minimum(draft_lengths, new_n - 1)


def commit_row(ids, token_ids, num_accepted, target_cache, draft_cache):
    """One row's commit on real caches, through the batched commit_tokens (B = 1)."""
    out, n, tl, dl = commit_tokens(
        ids[None],
        torch.tensor([len(ids)]),
        token_ids,
        num_accepted,
        torch.tensor([target_cache.length]),
        torch.tensor([draft_cache.length]),
    )
    target_cache.crop(int(tl[0]))
    draft_cache.crop(int(dl[0]))
    return out[0, : int(n[0])]


def _softmax(logits):
    return logits.softmax(-1)


def _step(commit, catch_up=True, one_target_call=True, pending=True, raw=""):
    """speculative_step built on ``commit``, with a mistake switched on when asked. ``raw``:
    which distributions skip ``process`` ("qp": lesson 04's loop at temperature 1; "q": the
    drafts are sampled from the processed q but the plain softmax is reported; "p")."""

    def speculative_step(
        target, draft, ids, target_cache, draft_cache, k, verify, process, generator=None
    ):
        p_of = _softmax if "p" in raw else process
        feed = ids[draft_cache.length :] if catch_up else ids[-1:]
        drafts, qs = [], []
        for _ in range(k):
            logits = draft(feed[None], draft_cache)[0, -1]
            q = _softmax(logits) if raw == "qp" else process(logits)
            x = torch.multinomial(q, 1, generator=generator)
            drafts.append(x)
            qs.append(logits.softmax(-1) if raw == "q" else q)
            feed = x
        d = torch.cat(drafts)
        if not pending:  # scores the drafts only: p is one row short and shifted
            logits = target(d[None], target_cache)[0]
            p = p_of(torch.cat([logits[:1], logits]))
        elif one_target_call:
            p = p_of(target(torch.cat([ids[-1:], d])[None], target_cache)[0])
        else:
            p = torch.cat(
                [target(t[None, None], target_cache)[0] for t in torch.cat([ids[-1:], d])]
            )
            p = p_of(p)
        token_ids, num_accepted = verify(d[None], torch.stack(qs)[None], p[None])
        return commit(ids, token_ids, num_accepted, target_cache, draft_cache)

    return speculative_step


speculative_step = _step(commit_row)


# ----------------------------------------------------------------------------- mistakes


def rollback_keeps_rejected(lengths, prefix_lens, num_accepted):
    rollback(lengths, prefix_lens, num_accepted)
    return torch.minimum(lengths, prefix_lens + num_accepted + 1)


def rollback_unchecked(lengths, prefix_lens, num_accepted):
    return prefix_lens + num_accepted


def rollback_checks_row_0(lengths, prefix_lens, num_accepted):
    if not 0 <= int(num_accepted[0]) <= int(lengths[0] - prefix_lens[0]):
        raise ValueError("num_accepted out of range")
    return prefix_lens + num_accepted


def rollback_one_length(lengths, prefix_lens, num_accepted):
    # lesson 04's one-row rollback: one crop, one number for the cache
    rollback(lengths, prefix_lens, num_accepted)
    return torch.full_like(lengths, int(prefix_lens[0] + num_accepted[0]))


def rollback_in_place(lengths, prefix_lens, num_accepted):
    rollback(lengths, prefix_lens, num_accepted)
    lengths.copy_(prefix_lens + num_accepted)
    return lengths.clone()


def row_keeps_rejected(ids, token_ids, num_accepted, target_cache, draft_cache):
    # crop to n' instead of n' - 1: the target cache keeps the rejected draft
    a = int(num_accepted[0])
    new = torch.cat([ids, token_ids[0, : a + 1]])
    target_cache.crop(min(target_cache.length, len(new)))
    draft_cache.crop(min(draft_cache.length, len(new)))
    return new


def row_forgets_catch_up(ids, token_ids, num_accepted, target_cache, draft_cache):
    # as if the draft had fed its last draft: its cache claims n' - 1 after full acceptance
    a = int(num_accepted[0])
    new = torch.cat([ids, token_ids[0, : a + 1]])
    target_cache.crop(len(new) - 1)
    draft_cache.length = len(new) - 1
    return new


def row_crops_draft_like_target(ids, token_ids, num_accepted, target_cache, draft_cache):
    # the same, through crop: raises on full acceptance
    a = int(num_accepted[0])
    new = torch.cat([ids, token_ids[0, : a + 1]])
    target_cache.crop(len(new) - 1)
    draft_cache.crop(len(new) - 1)
    return new


def row_drops_bonus(ids, token_ids, num_accepted, target_cache, draft_cache):
    # after full acceptance only the k drafts are kept
    a = int(num_accepted[0])
    k = token_ids.shape[1] - 1
    new = torch.cat([ids, token_ids[0, : min(a + 1, k)]])
    target_cache.crop(min(target_cache.length, len(new) - 1))
    draft_cache.crop(min(draft_cache.length, len(new) - 1))
    return new


def commit_one_count(ids, n, token_ids, num_accepted, target_lengths, draft_lengths):
    # lesson 04's one-row commit: row 0's count for every row
    a = num_accepted[0].expand_as(num_accepted)
    return commit_tokens(ids, n, token_ids, a, target_lengths, draft_lengths)


def commit_one_crop(ids, n, token_ids, num_accepted, target_lengths, draft_lengths):
    # the counts right, but one crop per cache (the batch's shortest row)
    out, new_n, tl, dl = commit_tokens(
        ids, n, token_ids, num_accepted, target_lengths, draft_lengths
    )
    return out, new_n, tl.min().expand_as(tl), dl.min().expand_as(dl)


def commit_keeps_rejected(ids, n, token_ids, num_accepted, target_lengths, draft_lengths):
    out, new_n, tl, dl = commit_tokens(
        ids, n, token_ids, num_accepted, target_lengths, draft_lengths
    )
    return out, new_n, torch.minimum(target_lengths, new_n), torch.minimum(draft_lengths, new_n)


def commit_forgets_catch_up(ids, n, token_ids, num_accepted, target_lengths, draft_lengths):
    out, new_n, tl, dl = commit_tokens(
        ids, n, token_ids, num_accepted, target_lengths, draft_lengths
    )
    return out, new_n, tl, new_n - 1


def commit_drops_bonus(ids, n, token_ids, num_accepted, target_lengths, draft_lengths):
    out, new_n, tl, dl = commit_tokens(
        ids, n, token_ids, num_accepted, target_lengths, draft_lengths
    )
    return out, new_n - 1, tl - 1, torch.minimum(dl, new_n - 2)


def commit_keeps_placeholders(ids, n, token_ids, num_accepted, target_lengths, draft_lengths):
    out, new_n, tl, dl = commit_tokens(
        ids, n, token_ids, num_accepted, target_lengths, draft_lengths
    )
    out = out.clone()
    k1 = token_ids.shape[1]
    for b in range(len(n)):
        out[b, int(n[b]) : int(n[b]) + k1] = token_ids[b]
    return out, n + k1, n + k1 - 1, torch.minimum(draft_lengths, n + k1 - 1)


def commit_draft_two_behind(ids, n, token_ids, num_accepted, target_lengths, draft_lengths):
    out, new_n, tl, dl = commit_tokens(
        ids, n, token_ids, num_accepted, target_lengths, draft_lengths
    )
    return out, new_n, tl, new_n - 2


def stub(*args, **kwargs):
    raise NotImplementedError


# ----------------------------------------------------------------------------- tests


def test_exercise_04_has_three_checks_worth_ten_points():
    specs = checks_for("ex04")
    assert [s.id for s in specs] == ["ex04.rollback", "ex04.commit_tokens", "ex04.speculative_step"]
    assert sum(s.points for s in specs) == 10


def test_solution_earns_every_point():
    report = grade_namespace("ex04", globals())
    assert report.points == report.max_points == 10, report.report()


@pytest.mark.parametrize(
    "wrong, says",
    [
        (rollback_keeps_rejected, "kept the rejected draft"),
        (rollback_unchecked, "raise ValueError"),
        (rollback_checks_row_0, "every row must be checked"),
        (rollback_one_length, "lesson 04's one-row rollback"),
        (rollback_in_place, "changed the caller's tensors"),
    ],
)
def test_wrong_rollback_fails_with_a_diagnosis(wrong, says):
    r = run_check("ex04.rollback", wrong)
    assert r.status == "failed" and r.points == 0, r.report()
    assert says in report_text(r), r.report()


@pytest.mark.parametrize(
    "wrong, says",
    [
        (commit_one_count, "lesson 04's one-row commit"),
        (commit_one_crop, "lesson 04's one-row rollback"),
        (commit_keeps_rejected, "kept the rejected draft"),
        (commit_forgets_catch_up, "forgot the draft's catch-up"),
        (commit_drops_bonus, "dropped the verifier's new token"),
        (commit_keeps_placeholders, "placeholders"),
        (commit_draft_two_behind, "cropped too far"),
    ],
)
def test_wrong_commit_fails_with_a_diagnosis(wrong, says):
    r = run_check("ex04.commit_tokens", wrong)
    assert r.status == "failed" and r.points == 0, r.report()
    assert says in report_text(r), r.report()


@pytest.mark.parametrize(
    "wrong, says",
    [
        (_step(commit_row, catch_up=False), "forgot the draft's catch-up"),
        (_step(commit_row, one_target_call=False), "ONE target call"),
        (_step(commit_row, pending=False), "pending token"),
        (_step(row_keeps_rejected), "kept the rejected draft"),
        (_step(row_forgets_catch_up), "forgot the draft's catch-up"),
        (_step(row_crops_draft_like_target), "forgot the draft's catch-up"),
        (_step(row_drops_bonus), "dropped the bonus token"),
        (_step(commit_row, raw="qp"), "is the softmax of the draft's logits, not process"),
        (_step(commit_row, raw="q"), "the distribution each draft was sampled from"),
        (_step(commit_row, raw="p"), "p is the softmax of the target's logits, not process"),
    ],
)
def test_wrong_step_fails_with_a_diagnosis(wrong, says):
    r = run_check("ex04.speculative_step", wrong)
    assert r.status == "failed" and r.points == 0, r.report()
    assert says in report_text(r), r.report()


def test_untouched_stubs_are_not_attempted():
    for check_id in ("ex04.rollback", "ex04.commit_tokens", "ex04.speculative_step"):
        assert run_check(check_id, stub).status == "not attempted"


# ----------------------------------------------------------------------------- the notebooks


@pytest.fixture(scope="module")
def graded_notebooks(tmp_path_factory):
    import nbformat

    from specdec_grader.judge import batch

    root = Path(__file__).resolve().parent.parent
    folder = tmp_path_factory.mktemp("ex04_submissions")
    solved = nbformat.read(root / "solutions" / "ex04_rollback.ipynb", as_version=4)
    nbformat.write(solved, folder / "ex04_solved.ipynb")
    untouched = nbformat.read(root / "exercises" / "ex04_rollback.ipynb", as_version=4)
    nbformat.write(untouched, folder / "ex04_untouched.ipynb")
    # The classic off-by-one, made in the notebook: the target cache keeps the rejected draft.
    wrong = copy.deepcopy(solved)
    cell = next(c for c in wrong.cells if c.source.startswith("def commit_tokens"))
    assert "new_target = rollback(target_lengths, n, num_accepted)" in cell.source
    cell.source = cell.source.replace(
        "new_target = rollback(target_lengths, n, num_accepted)", "new_target = new_n"
    )
    nbformat.write(wrong, folder / "ex04_keeps_rejected.ipynb")
    # The dodge of the one-target-call check (issue 43): rebuild the target from what its
    # stand-in exports, score the drafts on the copy token by token (k + 1 calls the judge
    # never sees) and copy the copy's cache into the judge's cache tensors.
    dodge = copy.deepcopy(solved)
    cell = next(c for c in dodge.cells if c.source.startswith("def speculative_step"))
    cell.source = REBUILT_TARGET_STEP
    nbformat.write(dodge, folder / "ex04_rebuilt_target.ipynb")
    results = batch.grade(
        [folder],
        workers=2,
        cell_timeout=30,
        notebook_timeout=120,
        memory_mb=0,
        progress=False,
        seed=0,
    )
    return {Path(r.file).stem: r for r in results}


REBUILT_TARGET_STEP = """\
def speculative_step(
    target, draft, ids, target_cache, draft_cache, k, verify, process, generator=None
):
    from specdec_course.model import CharGPT

    shadow = CharGPT(target.config).eval()
    shadow.load_state_dict(target.state_dict())
    feed = ids[draft_cache.length :]
    drafts, qs = [], []
    for _ in range(k):
        q = process(draft(feed[None], draft_cache)[0, -1])
        x = torch.multinomial(q, 1, generator=generator)
        drafts.append(x)
        qs.append(q)
        feed = x
    drafts = torch.cat(drafts)
    sc = shadow.new_cache(1)
    judge_k, judge_v = target_cache.k, target_cache.v
    sc.k.copy_(judge_k)
    sc.v.copy_(judge_v)
    sc.length = target_cache.length
    with torch.no_grad():
        rows = [shadow(t.view(1, 1), sc)[0, -1] for t in torch.cat([ids[-1:], drafts])]
    p = process(torch.stack(rows))
    token_ids, num_accepted = verify(drafts[None], torch.stack(qs)[None], p[None])
    judge_k.copy_(sc.k)
    judge_v.copy_(sc.v)
    target_cache.length = sc.length
    new_ids, n, t_len, d_len = commit_tokens(
        ids[None], torch.tensor([len(ids)]), token_ids, num_accepted,
        torch.tensor([target_cache.length]), torch.tensor([draft_cache.length]),
    )
    target_cache.crop(int(t_len[0]))
    draft_cache.crop(int(d_len[0]))
    return new_ids[0, : int(n[0])]
"""


def test_the_batch_grader_gives_the_solution_notebook_full_marks(graded_notebooks):
    r = graded_notebooks["ex04_solved"]
    assert r.status == "passed" and r.points == r.max_points == 10, r


def test_the_batch_grader_gives_the_untouched_exercise_zero_as_not_attempted(graded_notebooks):
    r = graded_notebooks["ex04_untouched"]
    assert r.points == 0 and {c.status for c in r.checks} == {"not attempted"}, r


def test_the_batch_grader_finds_the_rejected_draft_kept_in_a_notebook(graded_notebooks):
    r = graded_notebooks["ex04_keeps_rejected"]
    by_id = {c.id: c for c in r.checks}
    assert by_id["ex04.rollback"].status == "passed"
    assert by_id["ex04.commit_tokens"].status == "failed"
    assert "kept the rejected draft" in by_id["ex04.commit_tokens"].message
    assert by_id["ex04.speculative_step"].status == "failed"
    assert r.points == 2


def test_a_target_rebuilt_from_its_weights_does_not_dodge_the_one_call_check(graded_notebooks):
    # Issue 43: the judge's models export no weights (no state_dict, parameters, layers),
    # and nothing the kernel writes into the judge's caches comes back, so the step's target
    # calls are the judge's to count. The dodge now scores what k + 1 calls score.
    r = graded_notebooks["ex04_rebuilt_target"]
    by_id = {c.id: c for c in r.checks}
    assert by_id["ex04.speculative_step"].status in ("failed", "error"), r
    assert "not available" in " ".join(by_id["ex04.speculative_step"].message.split())
    assert r.points == 6, r
