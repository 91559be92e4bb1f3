"""The batched verifier (PyTorch reference): layout, greedy rows, exactness, checks, seeds.

Statistical tests compare against the exact distribution with ``stats.chi_square_test``
(reject when chi2 > df + 10 sqrt(2 df)). With V = 16 and thousands of samples per position
the tests here have 12 to 15 degrees of freedom after merging bins, a false-failure rate
below 2e-8 per position (asserted below 1e-7), so below 1e-6 for a whole file. The seeds are
fixed, so a run is repeatable.
"""

from __future__ import annotations

import pytest
import torch
from helpers import V_SMALL, make_position_batch, one_hot_rows, position_chi_squares

from specdec_course import verifier
from specdec_course.verifier import rejection_sample

# ----------------------------------------------------------------------------- greedy rows


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_greedy_rows_emit_matches_then_the_target_argmax(with_draft_probs):
    # Targets are one-hot, so every draft that equals the argmax is accepted (u <= 1) and
    # the first mismatch is replaced by the argmax, whatever the random numbers.
    target = torch.stack(
        [
            one_hot_rows(1, 2, 3, 5),  # drafts [1, 2, 3] all match -> bonus 5
            one_hot_rows(1, 4, 3, 5),  # mismatch at position 1 -> [1, 4]
            one_hot_rows(1, 2, 0, 5),  # ragged: two drafts, both match -> bonus at 2 is 0
            one_hot_rows(4, 2, 3, 5),  # no drafts -> the bonus comes from row 0: 4
            one_hot_rows(0, 2, 3, 5),  # ragged with a mismatch at 0 -> [0]
        ]
    )
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, -1], [-1, -1, -1], [1, -1, -1]])
    q = None
    if with_draft_probs:
        # Draft distributions that put most mass on the drafted ids (any q with q(x) > 0).
        q = torch.full((5, 3, V_SMALL), 0.02)
        q.scatter_(2, drafts.clamp_min(0).unsqueeze(2), 0.9)
    out = rejection_sample(drafts, q, target, generator=torch.Generator().manual_seed(0))
    assert out.token_ids.tolist() == [
        [1, 2, 3, 5],
        [1, 4, -1, -1],
        [1, 2, 0, -1],
        [4, -1, -1, -1],
        [0, -1, -1, -1],
    ]
    assert out.num_accepted.tolist() == [3, 1, 2, 0, 0]
    assert out.token_ids.dtype == out.num_accepted.dtype == torch.int64


def test_no_drafts_at_all_emits_one_bonus_token_per_row():
    target = torch.stack([one_hot_rows(3), one_hot_rows(1)])  # [B = 2, K + 1 = 1, V]
    out = rejection_sample(torch.empty(2, 0, dtype=torch.int64), None, target)
    assert out.token_ids.tolist() == [[3], [1]]
    assert out.num_accepted.tolist() == [0, 0]


def test_empty_batch_returns_empty_tensors():
    out = rejection_sample(torch.empty(0, 2, dtype=torch.int64), None, torch.empty(0, 3, 5))
    assert out.token_ids.shape == (0, 3) and out.num_accepted.shape == (0,)


# --------------------------------------------------------------------- the rule, by hand


def test_accept_rule_is_u_times_q_at_most_p():
    # p(x) = 0.3, q(x) = 0.6: accept iff u <= 0.5. u = 0.5 accepts, the next double rejects.
    p = torch.tensor([[[0.3, 0.7], [0.5, 0.5]]], dtype=torch.float64)
    q = torch.tensor([[[0.6, 0.4]]], dtype=torch.float64)
    noise = torch.ones(1, 2)
    for u, accepted in [(0.5, 1), (0.5000000000000001, 0)]:
        out = rejection_sample(
            torch.tensor([[0]]),
            q,
            p,
            uniforms=torch.tensor([[u]], dtype=torch.float64),
            exp_noise=noise,
        )
        assert out.num_accepted.item() == accepted
        if not accepted:
            # Residual max(p - q, 0) = [0, 0.3]: only token 1 can be recovered.
            assert out.token_ids.tolist() == [[1, -1]]


def test_recovered_token_is_the_exponential_race_over_the_residual():
    p = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.25] * 4]])
    q = torch.tensor([[[0.4, 0.1, 0.1, 0.4]]])
    # Residual w = [0, .1, .2, 0]; with E = [1, .1, 1, 1] the scores w/E are [0, 1, .2, 0].
    noise = torch.tensor([[1.0, 0.1, 1.0, 1.0]])
    out = rejection_sample(
        torch.tensor([[0]]), q, p, uniforms=torch.ones(1, 1, dtype=torch.float64), exp_noise=noise
    )
    assert out.token_ids.tolist() == [[1, -1]]
    # The same noise and an accepted draft: the bonus races over p_1 = uniform: argmax 1/E.
    out = rejection_sample(
        torch.tensor([[3]]),
        q,
        p,
        uniforms=torch.full((1, 1), 0.5, dtype=torch.float64),
        exp_noise=noise,
    )
    assert out.token_ids.tolist() == [[3, 1]]


def test_token_with_target_probability_zero_is_never_accepted():
    # q(x) = 0 and p(x) = 0: u * q <= p would hold (0 <= 0); the rule refuses it.
    p = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]])
    q = torch.tensor([[[0.0, 1.0]]])
    out = rejection_sample(torch.tensor([[0]]), q, p, generator=torch.Generator().manual_seed(0))
    assert out.token_ids.tolist() == [[1, -1]]


def test_zero_residual_falls_back_to_the_target_and_ids_stay_in_range():
    # p <= q everywhere (a q row that sums to 1 + 1e-6, within rounding) with u = 1 rejects
    # draft 2 but leaves no residual mass: the new token is raced over p, never over nothing.
    V = 20
    p = torch.zeros(3, 2, V)
    p[:, :, :4] = 0.25  # the last 16 ids have probability 0
    q = p[:, :1].clone()
    q[:, 0, 2] += 1e-6
    noise = torch.rand(3, V) + 0.5
    out = rejection_sample(
        torch.tensor([[2], [2], [2]]),
        q,
        p,
        uniforms=torch.ones(3, 1, dtype=torch.float64),
        exp_noise=noise,
    )
    assert out.num_accepted.tolist() == [0, 0, 0]
    expected = (p[:, 0] / noise).argmax(1)
    assert out.token_ids[:, 0].tolist() == expected.tolist()
    assert ((out.token_ids[:, 0] >= 0) & (out.token_ids[:, 0] < 4)).all()


def test_p_equal_q_accepts_every_draft():
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(50, 4, 9, generator=g), -1)
    drafts = torch.multinomial(p[:, :3].reshape(-1, 9), 1, generator=g).view(50, 3)
    out = rejection_sample(drafts, p[:, :3].clone(), p, generator=g)
    assert out.num_accepted.tolist() == [3] * 50
    assert torch.equal(out.token_ids[:, :3], drafts)
    assert ((out.token_ids[:, 3] >= 0) & (out.token_ids[:, 3] < 9)).all()


# ------------------------------------------------------------------------- distributions


# One-hot drafts are accepted less often here (with probability p_j(x)), so that case takes
# more rows to leave a few thousand samples at the last position.
ROWS = {False: 100_000, True: 200_000}


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot-drafts"])
def test_every_output_position_follows_its_target_distribution(one_hot):
    B = ROWS[one_hot]
    drafts, q, target, p = make_position_batch(B, one_hot=one_hot, seed=1)
    out = rejection_sample(drafts, q, target, generator=torch.Generator().manual_seed(1))
    results = position_chi_squares(out.token_ids, out.num_accepted, p, min_samples=2000)
    for j, r in enumerate(results):
        assert r.false_failure_rate < 1e-7
        assert r.passed, f"position {j}: {r}"


def test_position_chi_square_detects_a_verifier_told_the_wrong_draft_probs():
    # The test has power: claim the drafts came from p (they came from q), so every draft is
    # accepted and the emitted tokens follow q. Each position must fail by far.
    B = 100_000
    drafts, q, target, p = make_position_batch(B, one_hot=False, seed=1)
    drafts = drafts[:, :2].clone()
    drafts[drafts < 0] = 0
    out = rejection_sample(
        drafts, target[:, :2], target[:, :3], generator=torch.Generator().manual_seed(1)
    )
    results = position_chi_squares(out.token_ids, out.num_accepted, p[:3], min_samples=3000)
    assert not results[0].passed and not results[1].passed
    assert results[2].passed  # the bonus position is still drawn from p_2


# --------------------------------------------------------------------------------- seeds


def random_batch(B=64, K=4, V=65, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(B, K + 1, V, generator=g), -1)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, K)
    return drafts, q, p


def test_same_seed_same_output_and_different_seeds_differ():
    drafts, q, p = random_batch()
    a = rejection_sample(drafts, q, p, generator=torch.Generator().manual_seed(7))
    b = rejection_sample(drafts, q, p, generator=torch.Generator().manual_seed(7))
    c = rejection_sample(drafts, q, p, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.num_accepted, b.num_accepted)
    # 64 rows, each a fresh token from a 65-way draw: two seeds agreeing everywhere would
    # need about 64 coincidences.
    assert not torch.equal(a.token_ids, c.token_ids)


def test_generator_draws_uniforms_then_noise():
    drafts, q, p = random_batch(B=8)
    g = torch.Generator().manual_seed(5)
    from specdec_course.sampling import exp_noise, uniform_open_closed

    u = uniform_open_closed((8, 4), generator=g)
    e = exp_noise((8, 65), generator=g)
    a = rejection_sample(drafts, q, p, uniforms=u, exp_noise=e)
    b = rejection_sample(drafts, q, p, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.token_ids, b.token_ids)


# ------------------------------------------------------------------------------- checks


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d, q, p: (d, q, p.masked_fill(torch.rand(p.shape) < 0.01, float("nan"))), "NaN"),
        (lambda d, q, p: (d, q.masked_fill(torch.rand(q.shape) < 0.01, float("nan")), p), "NaN"),
        (lambda d, q, p: (d, q, p - 0.5), "negative"),
        (lambda d, q, p: (d, q, torch.log(p)), "negative"),
        (lambda d, q, p: (d, q, p * 10), "above 1"),
        (lambda d, q, p: (d.masked_fill(d == d[0, 0], 65), q, p), r"\[0, V\)"),
        (lambda d, q, p: (d.masked_fill(d == d[0, 0], -2), q, p), r"\[0, V\)"),
        (lambda d, q, p: (torch.cat([d[:, :1] * 0 - 1, d[:, 1:]], 1), q, p), "after a -1"),
        (lambda d, q, p: (d.float(), q, p), "int64"),
        (lambda d, q, p: (d, q, p[:, :-1]), "target_probs must have shape"),
        (lambda d, q, p: (d, q[..., :-1], p), "draft_probs must have shape"),
        (lambda d, q, p: (d[0], q, p), "draft_token_ids must be"),
        (lambda d, q, p: (d, q, p.to(torch.int64)), "float tensor"),
    ],
    ids=[
        "nan-target",
        "nan-draft",
        "negative",
        "logits",
        "above-one",
        "id-too-big",
        "id-below-minus-one",
        "draft-after-pad",
        "float-ids",
        "target-shape",
        "draft-shape",
        "ids-1d",
        "int-probs",
    ],
)
def test_bad_inputs_raise_one_clear_value_error(change, message):
    drafts, q, p = random_batch(B=4)
    d, qq, pp = change(drafts, q, p)
    with pytest.raises(ValueError, match=message):
        rejection_sample(d, qq, pp)


def test_bad_random_numbers_raise_value_error():
    drafts, q, p = random_batch(B=4)
    with pytest.raises(ValueError, match="float64"):
        rejection_sample(drafts, q, p, uniforms=torch.rand(4, 4))
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        rejection_sample(drafts, q, p, uniforms=torch.zeros(4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="exp_noise must hold"):
        rejection_sample(drafts, q, p, exp_noise=torch.zeros(4, 65))
    with pytest.raises(ValueError, match="shape"):
        rejection_sample(drafts, q, p, exp_noise=torch.ones(4, 64))


def test_prepare_inputs_returns_int64_contiguous_tensors():
    drafts, q, p = random_batch(B=4)
    ins = verifier.prepare_inputs(
        drafts.int(),
        q.transpose(0, 1).contiguous().transpose(0, 1),
        p,
        generator=torch.Generator().manual_seed(0),
    )
    assert ins.draft_token_ids.dtype == torch.int64
    assert all(t.is_contiguous() for t in ins if t is not None)
    assert ins.uniforms.dtype == torch.float64 and ins.exp_noise.dtype == torch.float32


# ----------------------------------------------------------------------- the batch-1 path


def _row_cases(seed: int, V: int = 17):
    """Single rows with awkward distributions: zeros in p and q, p == q, one-hot targets,
    anti-correlated drafts, and every draft count from 0 to 5."""
    g = torch.Generator().manual_seed(seed)
    for case in range(400):
        k = case % 6
        logits = 2 * torch.randn(k + 1, V, generator=g)
        p = logits.softmax(-1)
        kind = (case // 6) % 5
        if kind == 0:
            q = (logits[:k] + torch.randn(k, V, generator=g)).softmax(-1)
        elif kind == 1:
            q = (-logits[:k]).softmax(-1)  # anti-correlated draft
        elif kind == 2:
            q = p[:k].clone()  # p == q: every draft accepted, no residual
        elif kind == 3:
            p = p * (torch.rand(k + 1, V, generator=g) > 0.4)  # zeros in p
            p[:, 0] += 1e-3
            p = p / p.sum(-1, keepdim=True)
            q = (logits[:k] + torch.randn(k, V, generator=g)).softmax(-1)
            q[:, 1] = 0
            q = q / q.sum(-1, keepdim=True)  # zeros in q
        else:
            p = torch.nn.functional.one_hot(logits.argmax(-1), V).float()  # temperature 0
            q = None
        src = p[:k] if q is None else q
        drafts = (
            torch.multinomial(src, 1, generator=g)[:, 0] if k else torch.empty(0, dtype=torch.long)
        )
        u = 1.0 - torch.rand(1, k, dtype=torch.float64, generator=g)
        e = torch.empty(1, V).exponential_(generator=g).clamp_min_(1e-30)
        yield drafts, q, p, u, e


@pytest.mark.parametrize("path", ["host", "tensors", "host, float64", "host, arrays"])
def test_batch_one_path_emits_the_tokens_of_the_batched_verifier(path):
    # One semantics, three implementations: for the same random numbers, the same tokens.
    # "host" is the NumPy path CPU tensors take (noise as an array, as the loop passes it),
    # "tensors" the tensor ops other devices take, run here on the CPU.
    row = verifier._row_tensors if path == "tensors" else verifier.rejection_sample_row
    for seed in (1, 2):
        for drafts, q, p, u, e in _row_cases(seed):
            if path == "host, float64":  # mixed widths: float64 p and q, float32 race
                p, q = p.double(), None if q is None else q.double()
            k = drafts.numel()
            ref = rejection_sample(
                drafts[None] if k else torch.full((1, 1), -1),
                None if q is None else (q[None] if k else p[None, :1]),
                p[None] if k else p[None].expand(1, 2, -1),
                uniforms=u if k else torch.ones(1, 1, dtype=torch.float64),
                exp_noise=e,
            )
            noise = e[0] if path == "tensors" else e[0].numpy()
            ids = drafts.numpy() if path in ("host", "host, arrays") else drafts  # as the loop
            if path == "host, arrays":  # p and q as NumPy views too, as the loop passes them
                p, q = p.numpy(), None if q is None else q.numpy()
            new, a = row(ids, q, p, u[0].tolist(), noise)
            m = int(ref.num_accepted[0])
            assert a == m and new == ref.token_ids[0, : m + 1].tolist(), (k, new, ref)


def test_batch_one_path_is_exact_at_every_position():
    drafts, q, target, p = make_position_batch(20_000, one_hot=False, seed=5)
    g = torch.Generator().manual_seed(5)
    rows = []
    for b in range(drafts.shape[0]):
        n = int((drafts[b] >= 0).sum())
        u = (1.0 - torch.rand(n, dtype=torch.float64, generator=g)).tolist()
        e = torch.empty(p.shape[1]).exponential_(generator=g)
        new, a = verifier.rejection_sample_row(drafts[b, :n], q[b, :n], p[: n + 1], u, e)
        rows.append(new + [-1] * (4 - len(new)))
    token_ids = torch.tensor(rows)
    num_accepted = (token_ids >= 0).sum(1) - 1
    for r in position_chi_squares(token_ids, num_accepted, p, min_samples=500):
        assert r.passed and r.false_failure_rate < 1e-7, str(r)
