"""The EAGLE-style draft: its cached step, its proposer's exactness, and its errors.

Exactness is tested on a tiny random target over 3 symbols (1 layer, large weights) with an
EAGLE draft of large random weights, so that ``q`` is far from ``p``: the law of the next 3
symbols is an exact enumeration of 27 sequences; 3,000 runs of the whole loop, chi-square
with threshold df + 10 sqrt(2 df) over the merged bins (df up to 26: false-failure rate
below 1e-6, asserted). ``audit_proposer`` (4,000 runs, df 2, threshold 22) fails a correct
proposer with probability about 2e-5 (asserted through its ``false_failure_rate``).
Greedy identity runs on the shipped target with the shipped ``eagle.pt``.
"""

import pytest
import torch
from helpers import assert_prints, data_readme, exact_sequence_law, sequence_codes, tiny_model

from specdec_course import decoding, stats
from specdec_course.data import CharTokenizer
from specdec_course.drafts import audit_proposer
from specdec_course.drafts.eagle import (
    EagleDraft,
    EagleProposer,
    collect_features,
    eagle_alpha,
    eagle_alpha_by_depth,
    eagle_loss,
    load_eagle,
    save_eagle,
    train_eagle,
    unrolled_features,
    unrolled_loss,
)
from specdec_course.drafts.eagle.eagle_numpy import HostEagle
from specdec_course.model import load_pretrained
from specdec_course.sampling import SamplingOptions

RUNS, LENGTH = 3_000, 3


def _random_eagle(target, seed=2):
    torch.manual_seed(seed)
    draft = EagleDraft.from_target(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.normal_(0.0, 0.8)
    return draft.eval()


@pytest.fixture(scope="module")
def tiny():
    target = tiny_model(0, block_size=16)
    return target, _random_eagle(target)


@pytest.fixture(scope="module")
def shipped():
    target = load_pretrained("target")
    return target, load_eagle(target=target)


def test_the_cached_step_equals_the_full_forward_in_any_chunks(tiny):
    target, draft = tiny
    ids = torch.tensor([[0, 1, 2, 2, 1, 0, 0, 1, 2, 1, 1, 0, 2]])
    with torch.no_grad():
        f = target.hidden_states(ids)
        full = draft(f[:, :-1], ids[:, 1:])
        cache, got = draft.new_cache(), []
        for a, b in ((0, 5), (5, 6), (6, 12)):
            got.append(draft.step(f[:, a:b], ids[:, a + 1 : b + 1], cache))
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(got, 1), full, atol=1e-5, rtol=1e-5)


def test_the_numpy_steps_equal_the_tensor_steps(tiny):
    # The tiny draft's weights have std 0.8: features of size ~3, float32 rounding ~1e-5.
    target, draft = tiny
    ids = torch.tensor([[0, 1, 2, 2, 1, 0, 0, 1, 2, 1, 1, 0, 2]])
    host = HostEagle(draft)
    with torch.no_grad():
        f = target.hidden_states(ids)
        ct, ch = draft.new_cache(), draft.new_cache()
        want = draft.step(f[:, :6], ids[:, 1:7], ct)[0, -1]
        got = host.catch_up(f[0, :6].numpy(), ids[0, 1:7].numpy(), ch)
        for j in range(7, 12):  # feed predicted features back, as a proposal does
            torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-4, rtol=1e-4)
            want = draft.step(want[None, None], ids[:, j : j + 1], ct)[0, -1]
            got = host.step(got, int(ids[0, j]), ch)
    assert ch.length == ct.length == 11
    torch.testing.assert_close(ch.k[..., :11, :], ct.k[..., :11, :], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ch.v[..., :11, :], ct.v[..., :11, :], atol=1e-4, rtol=1e-4)


def test_the_unrolled_training_pass_is_the_drafting_chain(tiny):
    # Depth d at position t of unrolled_features is the draft's (d + 1)-th draft of a
    # proposal after t - d + 1 committed pairs, the text's tokens as the earlier drafts.
    target, draft = tiny
    ids = torch.tensor([[0, 1, 2, 2, 1, 0, 0, 1, 2, 1, 1, 0, 2, 2]])
    with torch.no_grad():
        f = target.hidden_states(ids)
        outs = unrolled_features(draft, f, ids, 3)
        torch.testing.assert_close(outs[0], draft(f[:, :-1], ids[:, 1:]))
        for n in (2, 6, 10):
            cache = draft.new_cache()
            h = draft.step(f[:, : n - 1], ids[:, 1:n], cache)[0, -1:]
            for d in range(3):
                torch.testing.assert_close(h[0], outs[d][0, n - 2 + d], atol=1e-5, rtol=1e-5)
                h = draft.step(h[None], ids[:, n + d : n + d + 1], cache)[0]


@torch.inference_mode()  # as inside the loop
def test_the_numpy_and_tensor_proposers_draft_alike(shipped):
    target, draft = shipped
    prompt = CharTokenizer().encode("ROMEO:\nWhat light through yonder window")
    runs = []
    for host in (True, False):
        p = EagleProposer(draft, target)
        p.start(
            prompt, prompt.numel(), SamplingOptions(1.0), torch.Generator().manual_seed(3), 10, 5
        )
        if not host:
            p.host = None
        out = torch.empty(5, dtype=torch.long)
        kk, q = p.propose(prompt, prompt.numel(), 5, out)
        runs.append((out.clone(), q.clone(), p.cache.length))
    (o1, q1, l1), (o2, q2, l2) = runs
    assert torch.equal(o1, o2) and l1 == l2 == prompt.numel() - 1
    torch.testing.assert_close(q1, q2, atol=1e-5, rtol=1e-4)


def test_speculative_sampling_with_the_eagle_draft_keeps_the_law_of_the_target(tiny):
    target, draft = tiny
    prompt = torch.tensor([0, 1])
    g = torch.Generator().manual_seed(0)
    proposer = EagleProposer(draft, target)
    outs = []
    for _ in range(RUNS):
        out, _ = decoding.speculative_generate(target, proposer, prompt, LENGTH, k=3, generator=g)
        outs.append(out[2:])
    V = target.config.vocab_size
    exact = exact_sequence_law(target, prompt, LENGTH)
    res = stats.chi_square_test(
        stats.counts(sequence_codes(torch.stack(outs), V), V**LENGTH), exact
    )
    assert res.false_failure_rate < 1e-6
    assert res.passed, res


def test_the_proposer_drafts_from_the_q_it_reports(tiny):
    target, draft = tiny
    res = audit_proposer(EagleProposer(draft, target), [0, 1, 2], runs=4_000)
    assert res.false_failure_rate < 1e-4
    assert res.passed, res


def test_a_one_token_prompt_drafts_nothing_until_the_target_has_a_feature(tiny):
    target, draft = tiny
    g = torch.Generator().manual_seed(0)
    out, st = decoding.speculative_generate(
        target, EagleProposer(draft, target), torch.tensor([1]), 6, k=3, generator=g
    )
    assert out.numel() == 7 and st.accepted_per_iteration[0] == 0 and st.drafted > 0


@pytest.mark.parametrize("k", range(1, 7))
def test_greedy_with_the_eagle_draft_is_the_greedy_target(shipped, k):
    target, draft = shipped
    prompt = CharTokenizer().encode("ROMEO:\nWhat light through yonder")
    ref = decoding.generate(target, prompt, 100, temperature=0)
    got, st = decoding.speculative_generate(
        target, EagleProposer(draft, target), prompt, 100, k=k, temperature=0
    )
    assert torch.equal(got, ref)
    assert st.accepted > 0


def test_the_loop_passes_the_prompts_features_so_the_proposer_runs_no_forward_of_its_own(
    shipped, monkeypatch
):
    # The loop's prefill hands the proposer the prompt's features (observe_target at 0): no
    # second full forward per generation. Run alone, the proposer makes them itself.
    target, draft = shipped
    prompt = CharTokenizer().encode("ROMEO:\nWhat light through yonder")
    calls = []
    real = type(target).hidden_states
    monkeypatch.setattr(
        type(target), "hidden_states", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    p = EagleProposer(draft, target)
    got, _ = decoding.speculative_generate(target, p, prompt, 40, k=4, temperature=0)
    assert calls == []
    assert torch.equal(got, decoding.generate(target, prompt, 40, temperature=0))
    calls.clear()
    with torch.inference_mode():
        p.start(prompt, prompt.numel(), SamplingOptions(0.0), None, 10, 4)
        p.propose(prompt, prompt.numel(), 4, torch.empty(4, dtype=torch.long))
    assert calls == [1]


def test_the_shipped_draft_records_its_training_and_keeps_its_acceptance_as_it_drafts(shipped):
    # Trained as it drafts (unrolled_loss), its later drafts, which read its own predicted
    # features, are accepted at least as often as its first; it saw at least the positions
    # the draft model's three stages saw (45M), and its first draft's alpha is the draft
    # model's to within 0.01 (the draft model's record: data/checkpoints/draft.pt).
    _, draft = shipped
    meta = draft.meta
    assert meta["command"] == "specdec-course train --preset eagle"
    by_depth = meta["alpha_by_depth"]
    assert meta["positions"] >= 45e6 and len(by_depth) == 6
    assert min(by_depth[1:]) >= by_depth[0]
    assert abs(meta["alpha_vs_target"] - load_pretrained("draft").meta["alpha_vs_teacher"]) < 0.01


def test_training_lowers_the_loss_and_the_checkpoint_round_trips(tiny, tmp_path):
    target, _ = tiny
    ids = torch.randint(3, (400,), generator=torch.Generator().manual_seed(0))
    res = train_eagle(target, ids, steps=30, batch_size=4, crop=8, n_windows=None, progress=False)
    assert res.history["loss"][-1] < res.history["loss"][0]
    f, x = collect_features(target, ids, 4)
    by_depth = eagle_alpha_by_depth(res.draft, f, x, 3)
    assert by_depth[0] == pytest.approx(eagle_alpha(res.draft, f, x), abs=1e-9)
    assert all(0.0 < a <= 1.0 for a in by_depth)
    with torch.no_grad():
        assert float(unrolled_loss(res.draft, f, x, 2)[0]) > 0
    path = save_eagle(tmp_path / "e.pt", res.draft, target, {"steps": 30})
    back = load_eagle(path, target=target)
    assert back.meta == {"steps": 30}
    with torch.no_grad():
        torch.testing.assert_close(eagle_loss(back, f, x)[0], eagle_loss(res.draft, f, x)[0])
    assert 0.0 < eagle_alpha(back, f, x) <= 1.0


def test_bad_input_raises_clear_errors(tiny, tmp_path):
    target, draft = tiny
    other = tiny_model(5, V=4, block_size=16)
    with pytest.raises(ValueError, match="built for"):
        EagleProposer(draft, other)
    with pytest.raises(ValueError, match="EagleDraft"):
        EagleProposer(target, target)
    with pytest.raises(ValueError, match="another target's embedding"):
        EagleProposer(draft, tiny_model(7, block_size=16))
    with pytest.raises(ValueError, match="cuda_graphs"):
        decoding.speculative_generate(
            target, EagleProposer(draft, target), torch.tensor([0, 1]), 3, cuda_graphs=True
        )
    with pytest.raises(ValueError, match=r"\[B, T, C\]"):
        draft(torch.zeros(1, 3, 8), torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="block size"):
        draft(torch.zeros(1, 3, 8), torch.zeros(1, 3, dtype=torch.long), start=15)
    with pytest.raises(FileNotFoundError, match="train --preset eagle"):
        load_eagle(tmp_path / "missing.pt", target=target)
    save_eagle(tmp_path / "e.pt", draft, target)
    with pytest.raises(ValueError, match="another target"):
        load_eagle(tmp_path / "e.pt", target=tiny_model(7, block_size=16))
    with pytest.raises(ValueError, match="crop"):
        train_eagle(target, torch.zeros(100, dtype=torch.long), crop=2, progress=False)


def test_bench_eagle_writes_its_json_and_train_refuses_model_options(tmp_path, monkeypatch, capsys):
    # A smaller sweep than the real command, through the same code path.
    from specdec_course import bench, cli

    monkeypatch.setattr(
        bench.eagle_race,
        "validation_prompts",
        lambda tok, n=4, length=32: [tok.encode("\nKING LEAR:\nThou art a soul in")],
    )
    real = bench.measure_eagle
    monkeypatch.setattr(
        bench, "measure_eagle", lambda **kw: real(**kw, ks=(1, 2), max_new_tokens=40)
    )
    code = cli.main(
        ["bench", "eagle", "--temperature", "0", "--repeats", "1", "--out", str(tmp_path)]
    )
    assert code == 0
    data = bench.load_eagle_results(tmp_path)
    assert data["command"] == "specdec-course bench eagle" and len(data["runs"]) == 1
    for m in data["runs"][0]["methods"].values():
        assert [r["k"] for r in m["rows"]] == [1, 2] and 0 < m["alpha_at_best"] <= 1
    assert cli.main(["train", "--preset", "eagle", "--init-from", "x.pt"]) != 0
    assert "--init-from does not apply to --preset eagle" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="bench eagle"):
        bench.load_eagle_results(tmp_path / "none")


def test_data_readme_gives_the_shipped_eagle_drafts_figures_from_its_record(shipped):
    # data/README's EAGLE-style paragraph against the checkpoint's own training record, and
    # the draft model's figure beside it recomputed on the same validation windows.
    from specdec_course import data as D
    from specdec_course.drafts.eagle import collect_features, draft_model_alpha_by_depth

    target, draft = shipped
    meta = draft.meta
    text, section = data_readme("The EAGLE-style draft")
    assert_prints(text, f"{meta['params']:,}")
    assert_prints(section, f"{meta['train_seconds'] / 60:.0f}", f"{meta['positions'] / 1e6:.1f}")
    for st, secs in zip(meta["stages"], meta["stage_seconds"], strict=True):
        assert_prints(section, f"{st['steps']:,}", f"{secs:,.0f}")
        assert_prints(section, f"{st['lr']:.0e}".replace("e-0", "e-"))
    assert_prints(section, *(f"{a:.3f}" for a in meta["alpha_by_depth"]))
    _, val_ids = D.corpus_split(D.CharTokenizer(target.vocab))
    with torch.inference_mode():
        _, x = collect_features(target, val_ids, 16)
    # depth 1 scores every position from the second: those eagle_alpha_by_depth's p is at
    (plain,) = draft_model_alpha_by_depth(load_pretrained("draft"), target, x, depth=1)
    assert_prints(section, f"{plain:.3f}")
