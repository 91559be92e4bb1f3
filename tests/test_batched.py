"""Batched decoding with ragged acceptance: each row exact, greedy rows the target's text.

Exactness: 6,000 rows of one batched call on a tiny random target and draft over 3 symbols
(1 layer, large weights); every row is an independent run, so the 81 codes of its 4 new
symbols are tested against the exact enumeration by chi-square with threshold df + 10
sqrt(2 df) (df below 80: false-failure rate below 1e-8 per test, asserted). The rows accept
different numbers of drafts in every iteration, so the ragged caches are exercised. The
same test runs with a two-layer target (the ragged step's later layers), and 2,000 calls of
one row each test the one-row path (the batch-1 steps and verifier), at the same rate.
"""

import time

import pytest
import torch
from helpers import exact_sequence_law, sequence_codes, tiny_model

from specdec_course import stats
from specdec_course.data import CharTokenizer
from specdec_course.decoding import generate
from specdec_course.decoding.batched import generate_batch, speculative_generate_batch
from specdec_course.fast.ragged import (
    OneRowSteps,
    RaggedSteps,
    batch_steps,
)
from specdec_course.model import CharGPT, GPTConfig, load_pretrained

ROWS, LENGTH = 6_000, 4


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(0), tiny_model(1)


def _law(outs, target, prompt):
    V = target.config.vocab_size
    exact = exact_sequence_law(target, prompt, LENGTH)
    return stats.chi_square_test(stats.counts(sequence_codes(outs, V), V**LENGTH), exact)


@pytest.mark.parametrize("verify", ["token", "block"])
def test_every_row_of_batched_speculative_decoding_follows_the_target(tiny, verify):
    target, draft = tiny
    prompt = torch.tensor([0, 1])
    g = torch.Generator().manual_seed(3)
    out, st = speculative_generate_batch(
        target, draft, prompt.expand(ROWS, -1), LENGTH, k=3, generator=g, verify=verify
    )
    res = _law(out[:, 2:], target, prompt)
    assert res.false_failure_rate < 1e-8
    assert res.passed, str(res)
    assert st.emitted == ROWS * LENGTH
    assert len(set(st.accepted_per_iteration)) > 2  # rows really accepted different counts


def test_batched_plain_decoding_follows_the_target(tiny):
    target, _ = tiny
    prompt = torch.tensor([0, 1])
    out = generate_batch(
        target, prompt.expand(ROWS, -1), LENGTH, generator=torch.Generator().manual_seed(4)
    )
    res = _law(out[:, 2:], target, prompt)
    assert res.false_failure_rate < 1e-8
    assert res.passed, str(res)


@pytest.mark.parametrize("verify", ["token", "block"])
def test_greedy_batched_speculation_is_the_targets_greedy_text(verify):
    target, draft = load_pretrained("target"), load_pretrained("draft")
    from specdec_course.data import CharTokenizer

    tok = CharTokenizer()
    texts = ["ROMEO:\nWhat", "JULIET:\nO R", "KING:\nThe "]
    prompts = torch.stack([tok.encode(s)[-8:] for s in texts])
    out, _ = speculative_generate_batch(
        target, draft, prompts, 40, k=4, temperature=0.0, verify=verify
    )
    plain = generate_batch(target, prompts, 40, temperature=0.0)
    assert torch.equal(out, plain)
    for b in range(3):
        assert torch.equal(out[b], generate(target, prompts[b], 40, temperature=0.0))


def test_bad_batches_raise_clear_errors(tiny):
    target, draft = tiny
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        speculative_generate_batch(target, draft, torch.tensor([0, 1]), 2)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        speculative_generate_batch(target, draft, torch.tensor([[0]]), 2)
    with pytest.raises(ValueError, match="exceeds the context"):
        speculative_generate_batch(target, draft, torch.tensor([[0, 1]]), 10, k=4)
    with pytest.raises(ValueError, match="verify"):
        speculative_generate_batch(target, draft, torch.tensor([[0, 1]]), 2, verify="tree")


@pytest.mark.parametrize("draft_kind", ["model", "table"])
def test_the_batched_loops_timings_split_its_wall_time(tiny, tiny_table, draft_kind):
    # timings=True: the prefill, drafting, target calls, verifier and the rest add up to the
    # call's wall time, and the tokens are those of the untimed run from the same seed.
    target, draft = tiny
    draft = draft if draft_kind == "model" else tiny_table
    prompts = torch.tensor([[0, 1, 2], [2, 1, 0], [1, 1, 0]])
    t0 = time.perf_counter()
    out, st = speculative_generate_batch(
        target, draft, prompts, 6, k=3, generator=torch.Generator().manual_seed(3), timings=True
    )
    wall = time.perf_counter() - t0
    same, _ = speculative_generate_batch(
        target, draft, prompts, 6, k=3, generator=torch.Generator().manual_seed(3)
    )
    assert torch.equal(out, same)
    assert set(st.seconds) == {"prefill", "draft", "target", "verify", "rest"}
    assert all(v >= 0 for v in st.seconds.values()) and st.seconds["target"] > 0
    assert sum(st.seconds.values()) <= wall  # load-independent: parts of a run within its whole


def test_the_batch_ceiling_prices_an_iteration_in_one_token_calls():
    from specdec_course import bench, theory

    calls = {
        "batch_sizes": [1, 8],
        "sizes": [1, 2, 3],
        "target_s": [[1.0, 1.0, 1.0], [1.0, 2.0, 3.0]],
        "draft_s": [0.0, 0.5],
    }
    batch = {"ks": [1, 2], "rows": [{"B": 1, "alpha": 0.8}, {"B": 8, "alpha": 0.8}]}
    out = bench.batch_ceiling(batch, calls)
    free, dear = out["rows"]
    assert free["best_k"] == 2 and free["ceiling"]["2"] == theory.expected_tokens(0.8, 2)
    assert dear["ceiling"]["1"] == theory.expected_tokens(0.8, 1) / 2.5
    assert out["crossover_B"] == 8
    with pytest.raises(ValueError, match="size 4"):
        bench.batch_ceiling({"ks": [3], "rows": batch["rows"]}, calls)
    # With the steady runs' own split, the calls are priced as they ran in the loop: plain's
    # step of 2 s against a k = 1 iteration whose calls took 3 s (its verifier's 5 s is the
    # loop's own work, which the bound leaves out).
    split = {"1": {"draft": 1.0, "target": 2.0, "verify": 5.0, "rest": 0.0}}
    row = {"B": 8, "alpha": 0.8, "plain_step_s": 2.0, "steady_per_call_s": split}
    inner = bench.batch_ceiling({"ks": [1], "rows": [row]}, calls)["rows"][0]
    assert inner["ceiling_in_loop"]["1"] == pytest.approx(theory.expected_tokens(0.8, 1) * 2 / 3)
    assert inner["best_ceiling_in_loop"] == inner["ceiling_in_loop"]["1"]
    costs = {"sizes": [1, 8], "target_s": [1.0, 1.7], "draft_s": [0.3, 0.4]}
    assert bench.marginal_cost(costs) == pytest.approx(0.3 + 0.1)


def _two_layer(seed: int) -> CharGPT:
    # tiny_model's recipe with two layers: the ragged step's layers after the table's.
    torch.manual_seed(seed)
    model = CharGPT(GPTConfig(vocab_size=3, block_size=12, n_layer=2, n_head=2, n_embd=8))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.6)
    return model.eval()


def test_batched_speculation_with_a_deeper_target_follows_it(tiny):
    target, draft = _two_layer(5), tiny[1]
    prompt = torch.tensor([2, 0])
    g = torch.Generator().manual_seed(6)
    out, st = speculative_generate_batch(
        target, draft, prompt.expand(ROWS, -1), LENGTH, k=2, generator=g
    )
    res = _law(out[:, 2:], target, prompt)
    assert res.false_failure_rate < 1e-8
    assert res.passed, str(res)
    assert len(set(st.accepted_per_iteration)) > 2


@pytest.fixture
def one_thread():
    # Thousands of calls on a tiny model: each op is tiny, and a second torch thread on a
    # busy 2-core machine can make every op wait for it (a hundred times slower).
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(was)


def test_one_row_batches_follow_the_target(tiny, one_thread):
    target, draft = _two_layer(7), tiny[1]
    prompt = torch.tensor([[1, 2]])
    g = torch.Generator().manual_seed(8)
    outs = torch.cat(
        [
            speculative_generate_batch(target, draft, prompt, LENGTH, k=3, generator=g)[0]
            for _ in range(2_000)
        ]
    )
    res = _law(outs[:, 2:], target, prompt[0])
    assert res.false_failure_rate < 1e-8
    assert res.passed, str(res)


@pytest.mark.parametrize("B", [1, 2])
def test_greedy_rows_of_any_batch_are_the_targets_greedy_text(B):
    target, draft = load_pretrained("target"), load_pretrained("draft")
    torch.manual_seed(B)
    prompts = torch.randint(0, target.config.vocab_size, (B, 9))
    for k in (1, 3):
        out, st = speculative_generate_batch(target, draft, prompts, 37, k=k, temperature=0.0)
        assert torch.equal(out, generate_batch(target, prompts, 37, temperature=0.0))
        assert torch.equal(out[0], generate(target, prompts[0], 37, temperature=0.0))
        assert st.emitted == B * 37 and st.target_calls >= 37 / (k + 1)


def test_the_token_verifier_in_numpy_is_rejection_sample():
    from specdec_course.decoding.batched import _token_verify
    from specdec_course.verifier import VerifierInputs, rejection_sample_prepared

    g = torch.Generator().manual_seed(9)
    B, K, V = 400, 4, 5
    q = torch.rand(B, K, V, generator=g).pow(3)
    p = torch.rand(B, K + 1, V, generator=g).pow(3)
    p[:50, :K] = q[:50]  # p == q: every draft accepted or an empty residual
    q, p = q / q.sum(-1, keepdim=True), p / p.sum(-1, keepdim=True)
    x = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, K)
    x[100:150, 2:] = -1  # rows with fewer drafts
    u = 1.0 - torch.rand(B, K, dtype=torch.float64, generator=g)
    e = torch.empty(B, V).exponential_(generator=g)
    ref = rejection_sample_prepared(VerifierInputs(x, q, p, u, e))
    a, new = _token_verify(x.numpy(), q.numpy(), p.numpy(), u.numpy(), e.numpy())
    assert torch.equal(torch.from_numpy(a), ref.num_accepted)
    assert torch.equal(
        torch.from_numpy(new), ref.token_ids.gather(1, ref.num_accepted[:, None])[:, 0]
    )
    assert len(set(a.tolist())) == K + 1  # every count of accepted drafts occurs


def test_batch_steps_match_each_row_decoded_alone():
    target = load_pretrained("target")
    torch.manual_seed(0)
    seqs = torch.randint(0, target.config.vocab_size, (3, 20))
    starts = torch.tensor([9, 6, 8])
    with torch.inference_mode():
        steps = RaggedSteps(target, 3)
        steps.prefill(seqs[:, :9])
        slots = starts[:, None] + torch.arange(4)
        tok = torch.stack([seqs[b, s : s + 4] for b, s in enumerate(starts.tolist())])
        out = steps.step(tok, slots, 13, torch.empty(12, target.config.vocab_size))
        for b, s in enumerate(starts.tolist()):
            ref = target(seqs[b : b + 1, : s + 4])[0, s:]
            torch.testing.assert_close(out.view(3, 4, -1)[b], ref, atol=1e-4, rtol=1e-4)
        one = batch_steps(target, 1)
        assert isinstance(one, OneRowSteps)
        one.prefill(seqs[:1, :9])
        got = one.step(seqs[:1, 9:12], torch.tensor([[9, 10, 11]]), 12, torch.empty(3, 65))
        torch.testing.assert_close(got, target(seqs[:1, :12])[0, 9:], atol=1e-4, rtol=1e-4)


def test_batch_call_costs_time_the_loops_own_steps():
    from specdec_course import bench

    target, draft = load_pretrained("target"), load_pretrained("draft")
    calls = bench.batch_call_costs(target, draft, (1, 2), sizes=(1, 2), repeats=1)
    assert calls["batch_sizes"] == [1, 2] and len(calls["target_s"]) == 2
    assert all(t > 0 for row in calls["target_s"] for t in row) and min(calls["draft_s"]) > 0
    assert calls["warm"] is True  # each timed call follows an untimed one of itself
    cold = bench.batch_call_costs(target, draft, (1,), sizes=(1, 2), repeats=1, warm=False)
    assert cold["warm"] is False and len(cold["target_s"][0]) == 2
    from specdec_course.drafts.distilled import load_distilled

    table = bench.batch_call_costs(target, load_distilled(), (1, 2), sizes=(1, 3), repeats=1)
    assert min(table["draft_s"]) > 0 and "table" in table["steps"]


@pytest.fixture(scope="module")
def tiny_table():
    """An order-3 n-gram over the tiny models' 3 symbols, counted from a skewed random text
    (so its rows differ from context to context and from the target's)."""
    from specdec_course.drafts.ngram import NgramDraft

    g = torch.Generator().manual_seed(5)
    ids = torch.multinomial(torch.tensor([0.6, 0.3, 0.1]), 400, replacement=True, generator=g)
    return NgramDraft(order=3, ids=ids, vocab="abc")


@pytest.mark.parametrize("verify", ["token", "block"])
def test_batched_speculation_with_an_ngram_draft_follows_the_target(tiny, tiny_table, verify):
    # Same test and false-failure rate as the draft model's (module docstring).
    target, _ = tiny
    prompt = torch.tensor([0, 1])
    g = torch.Generator().manual_seed(4)
    out, st = speculative_generate_batch(
        target, tiny_table, prompt.expand(ROWS, -1), LENGTH, k=3, generator=g, verify=verify
    )
    res = _law(out[:, 2:], target, prompt)
    assert res.false_failure_rate < 1e-8
    assert res.passed, str(res)
    assert len(set(st.accepted_per_iteration)) > 2


def test_the_ngram_draft_reports_the_q_it_draws_from(tiny_table):
    # propose_rows draws each row's drafts by inverse CDF from the table rows it reports: the
    # same tokens as NgramDraft.propose makes for one sequence from the same uniforms.
    import numpy as np

    from specdec_course.sampling import SamplingOptions

    smp = SamplingOptions(1.0)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 3, (50, 9))
    n = rng.integers(1, 10, 50)
    u = rng.random((50, 4))
    toks, rows = np.empty((50, 4), np.int64), np.empty((50, 4), np.int64)
    tiny_table.propose_rows(smp, ids, n, 4, u, toks, rows)
    q = tiny_table.sampling_rows(smp)
    for b in range(50):
        ctx = ids[b, : n[b]].tolist()
        for j in range(4):
            law = tiny_table.probs(torch.tensor(ctx, dtype=torch.long)).float().numpy()
            assert np.array_equal(q[rows[b, j]], law)
            assert toks[b, j] == int(
                np.searchsorted(np.cumsum(law.astype(np.float64)), u[b, j], "right")
            )
            ctx.append(int(toks[b, j]))


def test_until_first_stops_at_the_first_finished_row_with_exact_rows(tiny):
    # The steady-state run: it stops once one row has max_new_tokens; every row holds only
    # what it committed (-1 after), the same tokens as the full run from the same seed.
    target, draft = tiny
    prompt = torch.tensor([0, 1])
    B, m = 4, 7
    full, _ = speculative_generate_batch(
        target, draft, prompt.expand(B, -1), m, k=3, generator=torch.Generator().manual_seed(6)
    )
    g = torch.Generator().manual_seed(6)
    out, st = speculative_generate_batch(
        target, draft, prompt.expand(B, -1), m, k=3, generator=g, until="first"
    )
    done = (out[:, 2:] >= 0).sum(1)
    assert int(done.max()) == m and st.emitted == int(done.sum())
    for b in range(B):  # committed tokens first, then only -1
        kept = out[b, 2 : 2 + int(done[b])]
        assert torch.equal(kept, full[b, 2 : 2 + int(done[b])])
        assert (out[b, 2 + int(done[b]) :] == -1).all()
    with pytest.raises(ValueError, match="until"):
        speculative_generate_batch(target, draft, prompt.expand(2, -1), 2, until="some")


def test_greedy_batched_ngram_speculation_is_the_targets_greedy_text():
    from specdec_course.data import CharTokenizer
    from specdec_course.drafts.distilled import load_distilled

    target, table = load_pretrained("target"), load_distilled()
    tok = CharTokenizer()
    prompts = torch.stack(
        [tok.encode(s)[-8:] for s in ["ROMEO:\nWhat", "JULIET:\nO R", "KING:\nThe "]]
    )
    out, st = speculative_generate_batch(target, table, prompts, 40, k=5, temperature=0.0)
    assert torch.equal(out, generate_batch(target, prompts, 40, temperature=0.0))
    assert st.accepted > 0


def test_measure_batch_keeps_each_rounds_spread_and_runs_small_batches_longer():
    from specdec_course import bench

    target, draft = load_pretrained("target"), load_pretrained("draft")
    prompts = torch.stack(bench.validation_prompts(CharTokenizer(target.vocab), n=2))
    out = bench.measure_batch(
        target,
        draft,
        prompts,
        batch_sizes=(1, 2),
        ks=(1,),
        repeats=1,
        max_new_tokens=4,
        min_tokens=16,
    )
    one, two = out["rows"]
    assert (one["rounds"], two["rounds"], out["min_tokens"]) == (4, 2, 16)  # 16 / (B * 4)
    for r in out["rows"]:  # where the steady runs' time went, per target call, from the loop
        split = r["steady_per_call_s"]["1"]
        assert set(split) == {"draft", "target", "verify", "rest"}
        assert split["target"] > 0 and split["draft"] > 0 and r["plain_step_s"] > 0
    for r in out["rows"]:
        for name, spread in (("speedup", "spread"), ("steady_speedup", "steady_spread")):
            lo, hi = r[spread]["1"]
            assert lo <= r[name]["1"] <= hi  # load-independent: a median within its own spread


@pytest.mark.parametrize("temperature", [1.0, 0.0, 0.7])
def test_the_ngram_proposal_over_many_rows_makes_the_per_row_draws(tiny_table, temperature):
    # From _VECTOR_ROWS rows on, propose_rows walks the row transitions in NumPy; below,
    # it looks rows up one at a time. Both must make the same draws from the same uniforms,
    # rows with fewer characters than the context included (n = 1).
    import numpy as np

    from specdec_course.drafts.ngram.ngram_draft import _VECTOR_ROWS
    from specdec_course.sampling import SamplingOptions

    smp = SamplingOptions(temperature)
    rng = np.random.default_rng(1)
    B, K = 4 * _VECTOR_ROWS, 5
    ids = rng.integers(0, 3, (B, 12))
    n = rng.integers(1, 12, B)
    u = None if smp.greedy else rng.random((B, K))
    toks, rows = np.empty((B, K), np.int64), np.empty((B, K), np.int64)
    tiny_table.propose_rows(smp, ids, n, K, u, toks, rows)
    step = _VECTOR_ROWS - 1  # chunks small enough for the per-row path
    for lo in range(0, B, step):
        sl = slice(lo, lo + step)
        t1, r1 = np.empty_like(toks[sl]), np.empty_like(rows[sl])
        tiny_table.propose_rows(smp, ids[sl], n[sl], K, None if u is None else u[sl], t1, r1)
        assert np.array_equal(t1, toks[sl]) and np.array_equal(r1, rows[sl])
    # the draws are not all one symbol (greedy: the skewed table's argmaxes, two of three)
    assert len(set(toks.ravel().tolist())) >= (2 if smp.greedy else 3)


def test_the_loops_time_with_a_clock_they_are_given(tiny, tiny_table):
    # timings=<a clock>: the bench's thread clock splits the run, for a batch and for one row
    # (the batch-1 loop), and the parts add up to no more than that clock's own interval.
    target, draft = tiny
    for prompts in (torch.tensor([[0, 1, 2], [2, 1, 0]]), torch.tensor([[0, 1, 2]])):
        t0 = time.thread_time()
        _, st = speculative_generate_batch(
            target,
            tiny_table,
            prompts,
            6,
            k=3,
            generator=torch.Generator().manual_seed(1),
            timings=time.thread_time,
        )
        spent = time.thread_time() - t0
        assert set(st.seconds) == {"prefill", "draft", "target", "verify", "rest"}
        # load-independent: the parts of a run add up to no more than its whole
        assert st.seconds["target"] > 0 and sum(st.seconds.values()) <= spent
