"""Block verification (Sun et al. 2024): lossless, never fewer kept drafts than token-wise,
token-wise itself at one draft and at temperature 0, and the batch-1 row == the batched rule.

The toy language: 3 symbols, a target and a draft with one next-symbol distribution per prefix
(random, with zeros, with p == q at some prefixes, an anti-correlated draft). Exactness is
shown twice: by enumerating every drafted block (exact, no sampling; the output's law equals
the target's to 1e-12) and by a chi-square test of 200,000 sampled calls on the joint law of
four symbols (81 outcomes, of which the zeros of p leave 52 bins: 51 df, false-failure rate
below 1e-11 per test, asserted).
"""

import itertools

import pytest
import torch
from helpers import make_position_batch

from specdec_course import stats, verifier
from specdec_course.block_verifier import block_thresholds, block_verify, block_verify_row
from specdec_course.sampling import exp_noise, uniform_open_closed

V, G = 3, 3  # symbols, drafts per block


def _language(seed: int, kind: str = "random"):
    """Target and draft tables ``{prefix: dist}`` (float64) for prefixes of 0..G symbols."""
    g = torch.Generator().manual_seed(seed)
    P, Q = {}, {}
    for L in range(G + 1):
        for pre in itertools.product(range(V), repeat=L):
            logits = 1.5 * torch.randn(V, generator=g, dtype=torch.float64)
            p = logits.softmax(0)
            q = (-logits if kind == "anti" else torch.randn(V, generator=g).double()).softmax(0)
            r = float(torch.rand((), generator=g))
            if r < 0.2:
                p[int(torch.randint(V, (), generator=g))] = 0.0  # a zero in p
            elif r < 0.35:
                q[int(torch.randint(V, (), generator=g))] = 0.0  # a zero in q
            elif r < 0.5:
                q = p.clone()  # the models agree after this prefix
            P[pre], Q[pre] = p / p.sum(), q / q.sum()
    return P, Q


def _blocks(P, Q, blocks):
    """Inputs of the verifier for each drafted block: ids [N, G], q [N, G, V], p [N, G+1, V]."""
    ids = torch.tensor(blocks, dtype=torch.long)
    q = torch.stack([torch.stack([Q[b[:j]] for j in range(G)]) for b in blocks])
    p = torch.stack([torch.stack([P[b[:j]] for j in range(G + 1)]) for b in blocks])
    return ids, q, p


def _target_law(P):
    law = torch.zeros((V,) * (G + 1), dtype=torch.float64)
    for s in itertools.product(range(V), repeat=G + 1):
        law[s] = torch.prod(torch.stack([P[s[:j]][s[j]] for j in range(G + 1)]))
    return law


def _exact_law(P, Q, rule: str):
    """Law of the first G + 1 symbols when one verify call is followed by the target itself,
    and the expected number of kept drafts, by enumerating every drafted block."""
    blocks = [
        b
        for b in itertools.product(range(V), repeat=G)
        if all(Q[b[:j]][b[j]] > 0 for j in range(G))
    ]
    ids, q, p = _blocks(P, Q, blocks)
    weight, h = block_thresholds(ids, q, p)
    law = torch.zeros((V,) * (G + 1), dtype=torch.float64)
    kept = 0.0
    for n, b in enumerate(blocks):
        q_b = torch.prod(torch.stack([Q[b[:j]][b[j]] for j in range(G)]))
        if rule == "block":  # keep tau drafts: h_tau * prod_{j > tau} (1 - h_j), h_0 = 1
            hh = [1.0] + h[n].tolist()
            law_tau = [
                hh[t] * torch.prod(1 - torch.tensor(hh[t + 1 :], dtype=torch.float64))
                for t in range(G + 1)
            ]
            w_tau = weight[n].tolist()
        else:  # token-wise: stop at the first rejection
            a = [min(1.0, float(P[b[:j]][b[j]] / Q[b[:j]][b[j]])) for j in range(G)]
            law_tau = [
                torch.prod(torch.tensor(a[:t], dtype=torch.float64))
                * (1 - (a[t] if t < G else 0.0))
                for t in range(G + 1)
            ]
            w_tau = [1.0] * (G + 1)
        for t in range(G + 1):
            mass = q_b * float(law_tau[t])
            if mass == 0:
                continue
            kept += float(mass) * t
            pre = b[:t]
            if t == G:
                y = P[pre]
            else:
                y = (w_tau[t] * P[pre] - Q[pre]).clamp_min(0)
                y = y / y.sum() if y.sum() > 0 else P[pre]
            for rest in itertools.product(range(V), repeat=G + 1 - t):
                full = pre + rest  # the new symbol at t, then the target's own
                v = mass * y[rest[0]]
                for j in range(t + 1, G + 1):
                    v = v * P[full[:j]][full[j]]
                law[full] += v
    return law, kept


@pytest.mark.parametrize("seed, kind", [(0, "random"), (1, "random"), (2, "anti"), (3, "anti")])
def test_block_verification_is_lossless_by_enumerating_every_block(seed, kind):
    P, Q = _language(seed, kind)
    law, _ = _exact_law(P, Q, "block")
    assert (law - _target_law(P)).abs().max() < 1e-12


@pytest.mark.parametrize("seed, kind", [(s, k) for s in range(4) for k in ("random", "anti")])
def test_block_never_keeps_fewer_drafts_in_expectation_than_token_wise(seed, kind):
    P, Q = _language(seed, kind)
    token_law, token_kept = _exact_law(P, Q, "token")
    _, block_kept = _exact_law(P, Q, "block")
    assert (token_law - _target_law(P)).abs().max() < 1e-12  # the enumeration itself is right
    assert block_kept >= token_kept - 1e-12


def _simulate(P, Q, N, seed):
    """N sampled verify calls on drafted blocks, each completed to G + 1 symbols by the
    target: the symbols as codes in [0, V**(G + 1))."""
    g = torch.Generator().manual_seed(seed)
    prefixes = [pre for L in range(G + 1) for pre in itertools.product(range(V), repeat=L)]
    index = {pre: i for i, pre in enumerate(prefixes)}
    Pt = torch.stack([P[pre] for pre in prefixes])
    Qt = torch.stack([Q[pre] for pre in prefixes])
    base = torch.tensor([sum(V**L for L in range(j)) for j in range(G + 2)])

    def row(seq, j):  # table row of the prefix seq[:, :j]
        code = torch.zeros(seq.shape[0], dtype=torch.long)
        for c in range(j):
            code = code * V + seq[:, c]
        return base[j] + code

    drafts = torch.zeros(N, G, dtype=torch.long)
    for j in range(G):
        drafts[:, j] = torch.multinomial(Qt[row(drafts, j)], 1, generator=g)[:, 0]
    q = torch.stack([Qt[row(drafts, j)] for j in range(G)], dim=1).float()
    p = torch.stack([Pt[row(drafts, j)] for j in range(G + 1)], dim=1).float()
    res = block_verify(drafts, q, p, generator=g)
    seq = res.token_ids[:, : G + 1].clone()
    for j in range(1, G + 1):
        todo = seq[:, j] < 0
        fill = torch.multinomial(Pt[row(seq.clamp_min(0), j)], 1, generator=g)[:, 0]
        seq[:, j] = torch.where(todo, fill, seq[:, j])
    assert len(index) == Pt.shape[0]
    return row(seq, G + 1) - base[G + 1], res.num_accepted


def test_sampled_block_verification_matches_the_joint_law_of_four_symbols():
    P, Q = _language(0, "anti")
    codes, kept = _simulate(P, Q, 200_000, seed=5)
    res = stats.chi_square_test(stats.counts(codes, V ** (G + 1)), _target_law(P).flatten())
    assert res.false_failure_rate < 1e-11
    assert res.passed, str(res)
    assert (kept < G).any() and (kept == G).any()  # short and full blocks both seen


def test_chi_square_flags_a_residual_without_the_prefix_weight(monkeypatch):
    # The residual must carry the block's weight p_tau; dropping it (token-wise's residual
    # max(p - q, 0) after a block decision) biases the law, and the test sees it.
    from specdec_course import block_verifier

    real = block_verifier.block_thresholds

    def unit_weights(ids, q, p):
        weight, h = real(ids, q, p)
        return torch.ones_like(weight), h

    monkeypatch.setattr(block_verifier, "block_thresholds", unit_weights)
    P, Q = _language(0, "anti")
    codes, _ = _simulate(P, Q, 200_000, seed=5)
    res = stats.chi_square_test(stats.counts(codes, V ** (G + 1)), _target_law(P).flatten())
    assert not res.passed, str(res)


def _random_numbers(B, K, V_, seed):
    g = torch.Generator().manual_seed(seed)
    return uniform_open_closed((B, K), generator=g), exp_noise((B, V_), generator=g)


@pytest.mark.parametrize("one_hot", [False, True])
def test_batch_one_row_emits_the_tokens_of_the_batched_rule(one_hot):
    ids, q, p, _ = make_position_batch(400, one_hot=one_hot, seed=7)
    u, e = _random_numbers(*ids.shape, p.shape[2], seed=8)
    res = block_verify(ids, q, p, uniforms=u, exp_noise=e)
    for b in range(ids.shape[0]):
        n = int((ids[b] >= 0).sum())
        new, tau = block_verify_row(
            ids[b, :n], None if q is None else q[b, :n], p[b, : n + 1], u[b].tolist(), e[b]
        )
        assert tau == int(res.num_accepted[b])
        assert new == res.token_ids[b, : tau + 1].tolist()


@pytest.mark.parametrize("one_hot", [False, True])
def test_one_draft_is_token_wise_verification(one_hot):
    ids, q, p, _ = make_position_batch(500, one_hot=one_hot, seed=9)
    ids, p = ids[:, :1].contiguous(), p[:, :2].contiguous()
    q = None if q is None else q[:, :1].contiguous()
    u, e = _random_numbers(ids.shape[0], 1, p.shape[2], seed=10)
    a = block_verify(ids, q, p, uniforms=u, exp_noise=e)
    b = verifier.rejection_sample(ids, q, p, uniforms=u, exp_noise=e)
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.num_accepted, b.num_accepted)


@pytest.mark.parametrize("one_hot_drafts", [False, True])
def test_at_temperature_zero_block_is_token_wise_token_for_token(one_hot_drafts):
    # A temperature-0 target is one-hot at its argmax: both rules keep the drafts that match
    # it and then emit it, whatever the drafts and their q were.
    ids, q, p, _ = make_position_batch(500, one_hot=one_hot_drafts, seed=11)
    p = torch.nn.functional.one_hot(p.argmax(-1), p.shape[2]).float()
    u, e = _random_numbers(*ids.shape, p.shape[2], seed=12)
    a = block_verify(ids, q, p, uniforms=u, exp_noise=e)
    b = verifier.rejection_sample(ids, q, p, uniforms=u, exp_noise=e)
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.num_accepted, b.num_accepted)
    for r in range(0, 500, 25):
        n = int((ids[r] >= 0).sum())
        qr = None if q is None else q[r, :n]
        assert block_verify_row(ids[r, :n], qr, p[r, : n + 1], u[r].tolist(), e[r]) == (
            verifier.rejection_sample_row(ids[r, :n], qr, p[r, : n + 1], u[r].tolist(), e[r])
        )


def test_a_block_keeps_drafts_past_a_failed_coin():
    # Token-wise stops at the first failed coin; the block keeps the longest prefix whose
    # coin came up. Position 1's coin fails (u = 1 > h_1), position 2's succeeds.
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.95, 0.05, 0.0], [0.3, 0.3, 0.4]]])
    q = torch.tensor([[[0.9, 0.1, 0.0], [0.5, 0.5, 0.0]]])
    ids = torch.tensor([[0, 0]])
    weight, h = block_thresholds(ids, q.double(), p.double())
    assert weight[0].tolist() == pytest.approx([1.0, 5 / 9, 1.0])
    assert h[0, 0] < 1 and h[0, 1] == 1.0
    u = torch.tensor([[1.0, 0.5]], dtype=torch.float64)
    e = torch.ones(1, 3)
    assert block_verify(ids, q, p, uniforms=u, exp_noise=e).num_accepted.item() == 2
    assert verifier.rejection_sample(ids, q, p, uniforms=u, exp_noise=e).num_accepted.item() == 0


def test_bad_inputs_raise_the_verifiers_clear_errors():
    p = torch.full((1, 3, 4), 0.25)
    with pytest.raises(ValueError, match="apply softmax"):
        block_verify(torch.zeros(1, 2, dtype=torch.long), None, p * 10)
    with pytest.raises(ValueError, match=r"\[B, K \+ 1, V\]"):
        block_verify(torch.zeros(1, 3, dtype=torch.long), None, p)


def test_measure_block_reports_the_difference_and_its_paired_standard_error():
    """The bench's standard error of block - token-wise accepted drafts per iteration, with
    each (run, prompt) decode one unit: a hand computation of the delta-method formula, and
    a measured row whose diff is block_accepted - token_accepted."""
    from specdec_course import bench
    from specdec_course.bench.dynamic_and_block import _paired_ratio_se
    from specdec_course.data import CharTokenizer
    from specdec_course.model import load_pretrained

    a, b = [(3, 2), (5, 4), (1, 2)], [(2, 2), (4, 4), (2, 3)]
    ra, rb = 9 / 8, 8 / 9
    ea = [(x - ra * n) / (8 / 3) for x, n in a]
    eb = [(x - rb * n) / (9 / 3) for x, n in b]
    want = (sum((u - v) ** 2 for u, v in zip(ea, eb)) / (3 * 2)) ** 0.5
    assert abs(_paired_ratio_se(a, b) - want) < 1e-12
    assert _paired_ratio_se(a[:1], b[:1]) == 0.0  # one unit: no spread to measure
    assert _paired_ratio_se(a, a) == 0.0  # identical arms: no difference

    target, draft = load_pretrained("target"), load_pretrained("draft")
    prompts = bench.validation_prompts(CharTokenizer(target.vocab), n=2, length=16)
    rec = bench.measure_block(target, draft, prompts, ks=(3,), runs=2, max_new_tokens=30)
    (row,) = rec["rows"]
    assert rec["units"] == 4
    assert abs(row["diff"] - (row["block_accepted"] - row["token_accepted"])) < 1e-12
    assert 0 < row["diff_se"] < 3  # accepted drafts per iteration lie in 0 .. k


@pytest.mark.parametrize("seed", [0, 1])
def test_kept_law_is_the_coins_enumerated(seed):
    # kept_law's closed form against every outcome of the K coins, keeping the longest prefix
    # whose coin came up (exact, float64).
    P, Q = _language(seed)
    blocks = list(itertools.product(range(V), repeat=G))
    ids, q, p = _blocks(P, Q, blocks)
    _, h = block_thresholds(ids, q, p)
    from specdec_course.block_verifier import kept_law

    law = kept_law(h)
    want = torch.zeros_like(law)
    for coins in itertools.product((False, True), repeat=G):
        pr = torch.ones(len(blocks), dtype=torch.float64)
        for j, up in enumerate(coins):
            pr = pr * (h[:, j] if up else 1 - h[:, j])
        want[:, max((j + 1 for j, up in enumerate(coins) if up), default=0)] += pr
    assert torch.allclose(law, want, atol=1e-12)
    assert torch.allclose(law.sum(1), torch.ones(len(blocks), dtype=torch.float64))
