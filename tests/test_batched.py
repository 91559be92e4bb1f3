"""Batched decoding with ragged acceptance: each row exact, greedy rows the target's text.

Exactness: 6,000 rows of one batched call on a tiny random target and draft over 3 symbols
(1 layer, large weights); every row is an independent run, so the 81 codes of its 4 new
symbols are tested against the exact enumeration by chi-square with threshold df + 10
sqrt(2 df) (df below 80: false-failure rate below 1e-8 per test, asserted). The rows accept
different numbers of drafts in every iteration, so the ragged caches are exercised.
"""

import pytest
import torch
from helpers import exact_sequence_law, sequence_codes, tiny_model

from specdec_course import stats
from specdec_course.decoding import generate
from specdec_course.decoding.batched import generate_batch, speculative_generate_batch
from specdec_course.model import load_pretrained
from specdec_course.model.ragged import RaggedCache, ragged_forward

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


def test_ragged_forward_matches_each_row_decoded_alone(tiny):
    target, _ = tiny
    torch.manual_seed(0)
    seqs = torch.randint(0, 3, (3, 10))
    cache = RaggedCache(target, 3)
    ragged_forward(target, seqs[:, :4], cache)
    cache.crop(torch.tensor([4, 2, 3]))  # rows now hold different lengths
    h = ragged_forward(target, torch.stack([seqs[0, 4:7], seqs[1, 2:5], seqs[2, 3:6]]), cache)
    with torch.inference_mode():
        for b, start in enumerate([4, 2, 3]):
            ref = target.hidden_states(seqs[b : b + 1, : start + 3])[0, start:]
            torch.testing.assert_close(h[b], ref, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="one length per row"):
        cache.crop(torch.tensor([9, 0, 0]))


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
    costs = {"sizes": [1, 8], "target_s": [1.0, 1.7], "draft_s": [0.3, 0.4]}
    assert bench.marginal_cost(costs) == pytest.approx(0.3 + 0.1)
