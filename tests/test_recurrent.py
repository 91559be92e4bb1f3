"""The recurrent EAGLE-style draft: its proposer's exactness, its two paths, training, checkpoint.

Exactness is tested on a tiny random target over 3 symbols (1 layer, large weights) with a
recurrent draft whose parameters are all random (std 0.3; an untrained draft's ``M2`` is
zero), so that ``q`` is far from ``p`` (the loop accepts about a third of the drafts;
asserted between 0.02 and 0.9). The law of the next 3 symbols is an exact enumeration of
27 sequences, at temperature 1 and at temperature 1.5 with top-k 2; 3,000 runs of the whole
loop each, chi-square with threshold df + 10 sqrt(2 df) over the merged bins (df 15 and 7
with these seeds, up to 26: false-failure rate below 1e-6 each, asserted).
``audit_proposer`` (4,000 runs, df 2, threshold 22) fails a correct proposer with
probability about 2e-5 (asserted below 1e-4 through its ``false_failure_rate``). Every
other test is deterministic (fixed seeds, exact or float-rounding comparisons). The tests
of the shipped draft (``data/checkpoints/recurrent.pt``, ``specdec-course train --preset
recurrent``) skip while it is missing, and fail when it no longer loads (a draft trained
on another target).
"""

import copy
import math
import re

import pytest
import torch
from helpers import assert_prints, data_readme, exact_sequence_law, sequence_codes, tiny_model

from specdec_course import decoding, stats
from specdec_course.data import CharTokenizer
from specdec_course.drafts import audit_proposer
from specdec_course.drafts.eagle import (
    RECURRENT_COMMAND,
    RECURRENT_SHIPPED,
    RecurrentDraft,
    RecurrentProposer,
    check_recurrent,
    collect_features,
    draft_model_alpha_by_depth,
    load_recurrent,
    recurrent_alpha_by_depth,
    save_recurrent,
    target_features,
    train_recurrent,
)
from specdec_course.drafts.eagle import eagle_draft as draft_module
from specdec_course.drafts.eagle import recurrent as recurrent_module
from specdec_course.drafts.eagle.recurrent import _HostCell
from specdec_course.drafts.eagle.recurrent_training import _loss_terms
from specdec_course.paths import checkpoints_dir
from specdec_course.sampling import SamplingOptions

RUNS, LENGTH = 3_000, 3
ROMEO = "ROMEO:\nWhat light through yonder window"
SIZES = {"state": 8, "hidden": 16, "init_hidden": 8}


def _random_draft(target, seed=5, std=0.3, **sizes):
    # Every parameter random (M2 included: a fresh draft's is zero), so that q is far from
    # p; std 0.8 makes the tiny draft's q nearly one-hot (audit_proposer then tests on 0 df).
    torch.manual_seed(seed)
    draft = RecurrentDraft.for_target(target, **{**SIZES, **sizes})
    with torch.no_grad():
        for p in draft.parameters():
            p.normal_(0.0, std)
    return draft.eval()


@pytest.fixture(scope="module")
def tiny():
    target = tiny_model(0, block_size=16)
    return target, _random_draft(target)


@pytest.fixture(scope="module")
def shipped_draft(target):
    try:
        return load_recurrent(target=target)
    except FileNotFoundError:
        pytest.skip(f"data/checkpoints/recurrent.pt is missing ({RECURRENT_COMMAND})")


def _propose_both_ways(draft, target, prompt, monkeypatch, k=5, seed=3, sampling=None):
    # One proposal (run alone: the proposer computes the prompt's features), then a commit
    # of two drafts and a token of the target's with their features passed as the loop
    # would, then a second proposal; in NumPy and as tensor ops (numpy_ok refused).
    n = prompt.numel()
    sampling = sampling or SamplingOptions(1.0)
    runs = []
    for host in (True, False):
        with monkeypatch.context() as m:
            if not host:
                m.setattr(recurrent_module, "numpy_ok", lambda w: False)
            p = RecurrentProposer(draft, target)
            g = torch.Generator().manual_seed(seed)
            p.start(prompt, n, sampling, g, 20, k)
        assert (p.host is not None) == host
        out = torch.empty(k, dtype=torch.long)
        kk, q = p.propose(prompt, n, k, out)
        first = (kk, out.clone(), None if q is None else q.clone())
        ids = torch.cat([prompt, out[:2], torch.tensor([1])])
        p.commit(ids, n + 3)
        p.observe_target(target_features(target, ids[None, : n + 2], draft.feature_layers)[0], 0)
        kk, q = p.propose(ids, n + 3, k, out)
        runs.append((first, (kk, out.clone(), None if q is None else q.clone())))
    for (k1, o1, q1), (k2, o2, q2) in zip(*runs):
        assert k1 == k2 == k
        assert torch.equal(o1, o2), (o1, o2)
        assert (q1 is None) == (q2 is None) == sampling.greedy
        if q1 is not None:
            assert q1.shape == (k, target.config.vocab_size)
            torch.testing.assert_close(q1, q2, atol=1e-5, rtol=1e-4)
    return runs


@torch.inference_mode()  # as inside the loop
def test_the_numpy_and_tensor_paths_draft_alike_on_tiny_models(tiny, monkeypatch):
    target, draft = tiny
    _propose_both_ways(draft, target, torch.tensor([0, 1, 2, 2, 1]), monkeypatch)
    # Processed logits (temperature and top-k: -inf entries in q), and greedy.
    prompt = torch.tensor([1, 1, 0, 2])
    runs = _propose_both_ways(draft, target, prompt, monkeypatch, sampling=SamplingOptions(0.7, 2))
    assert (runs[0][0][2] == 0).any()  # top-k 2 of 3 symbols filtered something out
    _propose_both_ways(draft, target, prompt, monkeypatch, k=8, sampling=SamplingOptions(0.0))
    # Other sizes (a state wider than the cell), in float64.
    target64 = copy.deepcopy(target).double()
    wide = _random_draft(target64, seed=9, state=24, hidden=6, init_hidden=4).double()
    _propose_both_ways(wide, target64, torch.tensor([2, 0, 1, 1]), monkeypatch, seed=4)


@torch.inference_mode()
def test_the_numpy_cell_computes_the_drafts_steps(tiny):
    # _HostCell against the module's begin / step / logits (A's bias folded into c).
    target, draft = tiny
    f = target.hidden_states(torch.tensor([[0, 1, 2, 2]]))[0, 2]
    cell = _HostCell(draft)
    s, c = cell.begin(f.numpy().copy())
    ts, tc = draft.begin(f)
    torch.testing.assert_close(torch.from_numpy(s), ts, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.from_numpy(c), tc + draft.A.bias, atol=1e-5, rtol=1e-5)
    for tok in (2, 0, 0, 1):
        got = torch.empty(3)
        s = cell.step(s, c, tok, got.numpy())
        ts = draft.step(ts, tc, torch.tensor(tok))
        torch.testing.assert_close(torch.from_numpy(s), ts, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got, draft.logits(ts), atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_the_numpy_and_tensor_paths_draft_alike_on_the_shipped_target(target, monkeypatch):
    prompt = CharTokenizer().encode(ROMEO)
    draft = _random_draft(target, seed=2, std=0.05, state=32, hidden=64, init_hidden=16)
    _propose_both_ways(draft, target, prompt, monkeypatch, k=6)
    _propose_both_ways(draft, target, prompt, monkeypatch, sampling=SamplingOptions(0.8, 20))


@torch.inference_mode()
def test_the_numpy_and_tensor_paths_draft_alike_with_the_shipped_draft(
    target, shipped_draft, monkeypatch
):
    prompt = CharTokenizer().encode(ROMEO)
    _propose_both_ways(shipped_draft, target, prompt, monkeypatch, k=8)
    _propose_both_ways(shipped_draft, target, prompt, monkeypatch, k=8, sampling=SamplingOptions(0))


@pytest.mark.parametrize("host", [True, False], ids=["numpy", "tensor"])
@pytest.mark.parametrize(
    "sampling", [SamplingOptions(1.0), SamplingOptions(0.7, 2)], ids=["t 1", "t 0.7 top-k 2"]
)
@torch.inference_mode()
def test_the_jth_draft_reads_f_n_minus_2_fed_x_n_minus_1_then_its_own_drafts(
    tiny, monkeypatch, host, sampling
):
    # The proposal after n committed tokens: q_j is the draft's unrolled cell from the
    # target's feature f_{n-2}, fed x_{n-1} then drafts 1 .. j-1 (as training unrolls it),
    # after the sampling options.
    target, draft = tiny
    if not host:
        monkeypatch.setattr(recurrent_module, "numpy_ok", lambda w: False)
    prompt = torch.tensor([1, 0, 2, 2, 0])
    n, k = prompt.numel(), 4
    p = RecurrentProposer(draft, target)
    p.start(prompt, n, sampling, torch.Generator().manual_seed(7), 10, k)
    assert (p.host is not None) == host
    out = torch.empty(k, dtype=torch.long)
    kk, q = p.propose(prompt, n, k, out)
    assert kk == k and q.shape == (k, 3)
    text = torch.cat([prompt, out])[None]
    f = target.hidden_states(text)[0]
    fed = torch.cat([prompt[n - 1 :], out[: k - 1]])

    def law(pos):
        return sampling.probs(draft.unroll(f[pos], fed))

    torch.testing.assert_close(q, law(n - 2), atol=1e-5, rtol=1e-4)
    # Not another position's feature (the test tells them apart).
    for pos in (n - 3, n - 1):
        assert (q - law(pos)).abs().max() > 1e-2


@pytest.mark.parametrize(
    "opts", [{}, {"temperature": 1.5, "top_k": 2}], ids=["temperature 1", "t 1.5 top-k 2"]
)
def test_speculative_sampling_with_the_recurrent_draft_keeps_the_law_of_the_target(tiny, opts):
    _check_law(*tiny, opts)


def _check_law(target, draft, opts):
    prompt = torch.tensor([0, 1])
    g = torch.Generator().manual_seed(0)
    proposer = RecurrentProposer(draft, target)
    outs, accepted, drafted = [], 0, 0
    for _ in range(RUNS):
        out, st = decoding.speculative_generate(
            target, proposer, prompt, LENGTH, k=3, generator=g, **opts
        )
        outs.append(out[2:])
        accepted, drafted = accepted + st.accepted, drafted + st.drafted
    assert 0.02 < accepted / drafted < 0.9  # both verdicts, often: a test of the loop's rule
    V = target.config.vocab_size
    exact = exact_sequence_law(target, prompt, LENGTH, **opts)
    res = stats.chi_square_test(
        stats.counts(sequence_codes(torch.stack(outs), V), V**LENGTH), exact
    )
    assert res.false_failure_rate < 1e-6
    assert res.passed, res


def test_the_proposer_drafts_from_the_q_it_reports(tiny):
    target, draft = tiny
    res = audit_proposer(RecurrentProposer(draft, target), [0, 1, 2], runs=4_000)
    assert res.df >= 1  # q is not one-hot: the audit tests something
    assert res.false_failure_rate < 1e-4
    assert res.passed, res


def test_a_one_token_prompt_drafts_nothing_until_the_target_has_a_feature(tiny):
    target, draft = tiny
    g = torch.Generator().manual_seed(0)
    out, st = decoding.speculative_generate(
        target, RecurrentProposer(draft, target), torch.tensor([1]), 6, k=3, generator=g
    )
    assert out.numel() == 7 and st.accepted_per_iteration[0] == 0 and st.drafted > 0
    p = RecurrentProposer(draft, target)
    with torch.inference_mode():
        one = torch.tensor([1])
        p.start(one, 1, SamplingOptions(1.0), torch.Generator().manual_seed(0), 6, 3)
        assert p.propose(one, 1, 3, torch.empty(3, dtype=torch.long)) == (0, None)
        two = torch.tensor([1, 2])
        p.start(two, 2, SamplingOptions(1.0), torch.Generator().manual_seed(0), 6, 3)
        kk, q = p.propose(two, 2, 3, torch.empty(3, dtype=torch.long))
    assert kk == 3 and q.shape == (3, 3)


@pytest.mark.parametrize("host", [True, False], ids=["numpy", "tensor"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_with_a_random_draft_is_the_greedy_target(tiny, monkeypatch, host, k):
    target, draft = tiny
    if not host:
        monkeypatch.setattr(recurrent_module, "numpy_ok", lambda w: False)
    prompt = torch.tensor([2, 0, 1])
    ref = decoding.generate(target, prompt, 12, temperature=0)
    p = RecurrentProposer(draft, target)
    got, st = decoding.speculative_generate(target, p, prompt, 12, k=k, temperature=0)
    assert (p.host is not None) == host
    assert torch.equal(got, ref)
    assert st.drafted > 0


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_with_the_shipped_draft_is_the_greedy_target(target, shipped_draft, k):
    prompt = CharTokenizer().encode("ROMEO:\nWhat light through yonder")
    ref = decoding.generate(target, prompt, 100, temperature=0)
    got, st = decoding.speculative_generate(
        target, RecurrentProposer(shipped_draft, target), prompt, 100, k=k, temperature=0
    )
    assert torch.equal(got, ref)
    assert st.accepted > 0


@pytest.mark.parametrize("host", [True, False], ids=["numpy", "tensor"])
def test_the_loop_passes_the_prompts_features_so_the_proposer_runs_no_forward_of_its_own(
    tiny, monkeypatch, host
):
    # The loop's prefill hands the proposer the prompt's features (observe_target at 0): no
    # second target forward per generation. Run alone, the proposer makes them itself, once.
    target, draft = tiny
    prompt = torch.tensor([0, 2, 1, 1])
    calls = []
    real = type(target).hidden_states

    def counted(self, *a, **kw):
        calls.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(type(target), "hidden_states", counted)
    if not host:
        monkeypatch.setattr(recurrent_module, "numpy_ok", lambda w: False)
    p = RecurrentProposer(draft, target)
    got, _ = decoding.speculative_generate(target, p, prompt, 10, k=3, temperature=0)
    assert (p.host is not None) == host
    assert calls == []
    assert torch.equal(got, decoding.generate(target, prompt, 10, temperature=0))
    calls.clear()
    with torch.inference_mode():
        p.start(prompt, prompt.numel(), SamplingOptions(0.0), None, 10, 3)
        out = torch.empty(3, dtype=torch.long)
        p.propose(prompt, prompt.numel(), 3, out)
        p.propose(prompt, prompt.numel(), 3, out)
    assert calls == [1]


def _hand_terms(draft, target, f, x, w, t, depths):
    # _loss_terms one start and one depth at a time: the d-th draft of a proposal whose
    # text ends with x_t reads f_{t-1}, is fed x_t .. x_{t+d-1}, and is scored against
    # softmax(lm_head(f_{t+d-1})).
    P, Q = [], []
    for wb, tb in zip(w.tolist(), t.tolist()):
        s, c = draft.begin(f[wb, tb - 1])
        ps, qs = [], []
        for d in range(1, depths + 1):
            s = draft.step(s, c, x[wb, tb + d - 1])
            qs.append(draft.logits(s).softmax(-1))
            ps.append(target.lm_head(f[wb, tb + d - 1, -target.config.n_embd :]).softmax(-1))
        P.append(torch.stack(ps))
        Q.append(torch.stack(qs))
    return torch.stack(P), torch.stack(Q)


@torch.inference_mode()
def test_the_loss_scores_depth_d_at_t_against_the_feature_t_plus_d_minus_1(tiny):
    target, draft = tiny
    g = torch.Generator().manual_seed(0)
    N, T, depths = 3, 9, 4
    f = torch.randn(N, T, 8, generator=g)
    x = torch.randint(3, (N, T), generator=g)
    w = torch.tensor([0, 2, 1, 2, 0])
    t = torch.tensor([1, 5, 3, T - depths, 2])  # from the first start to the last
    p, q = _loss_terms(draft, target, f, x, w, t, depths)
    assert p.shape == q.shape == (5, depths, 3)
    want_p, want_q = _hand_terms(draft, target, f, x, w, t, depths)
    torch.testing.assert_close(p, want_p, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(q, want_q, atol=1e-6, rtol=1e-5)
    # The hand computation tells a shift apart: one position later is another law.
    later_p, later_q = _hand_terms(draft, target, f, x, w, t + 1, depths - 1)
    assert (p[:, :-1] - later_p).abs().max() > 1e-2
    assert (q[:, :-1] - later_q).abs().max() > 1e-2


@torch.inference_mode()
def test_the_alpha_by_depth_is_the_mean_overlap_at_every_start(tiny):
    target, draft = tiny
    ids = torch.randint(3, (200,), generator=torch.Generator().manual_seed(1))
    f, x = collect_features(target, ids, 3)
    N, T = x.shape
    got = recurrent_alpha_by_depth(draft, target, f, x, depth=5)
    assert len(got) == 5 and all(isinstance(a, float) and 0 <= a <= 1 for a in got)
    w = torch.arange(N).repeat_interleave(T - 5)
    t = torch.arange(1, T - 4).repeat(N)
    p, q = _hand_terms(draft, target, f, x, w, t, 5)
    want = p.double().minimum(q.double()).sum(-1).mean(0)
    for a, b in zip(got, want.tolist()):
        assert a == pytest.approx(b, abs=1e-6)
    assert len(recurrent_alpha_by_depth(draft, target, f, x)) == 8  # the default depth
    with pytest.raises(ValueError, match="depth"):
        recurrent_alpha_by_depth(draft, target, f, x, depth=T)
    with pytest.raises(ValueError, match="RecurrentDraft"):
        recurrent_alpha_by_depth(target, target, f, x)


@torch.inference_mode()
def test_the_draft_models_alpha_by_depth_is_taken_at_the_recurrent_drafts_positions(tiny):
    # The recurrent draft's d-th draft from start t is scored at position t + d - 1 (the
    # target's distribution there); the draft model's list must average the same positions.
    target, _ = tiny
    other = tiny_model(7, block_size=16)
    ids = torch.randint(3, (200,), generator=torch.Generator().manual_seed(2))
    _, x = collect_features(target, ids, 3)
    N, T = x.shape
    got = draft_model_alpha_by_depth(other, target, x, depth=4)
    ov = target(x).softmax(-1).double().minimum(other(x).softmax(-1).double()).sum(-1)
    for d in range(1, 5):
        pos = [t + d - 1 for t in range(1, T - 4 + 1)]
        assert got[d - 1] == pytest.approx(float(ov[:, pos].mean()), abs=1e-12)
    assert got[0] != pytest.approx(float(ov[:, : T - 4].mean()), abs=1e-9)  # not position 0 on
    with pytest.raises(ValueError, match="depth"):
        draft_model_alpha_by_depth(other, target, x, depth=T)


def test_a_draft_of_another_dtype_than_the_target_drafts_through_the_tensor_path(tiny):
    # NumPy needs one dtype for the weights and the features: a float32 draft on a float64
    # target takes the tensor path, exactly, instead of failing in np.dot.
    target, draft = tiny
    t64 = tiny_model(0, block_size=16).double()
    prop = RecurrentProposer(draft, t64)
    assert prop.device == draft.out.weight.device
    prompt = torch.tensor([0, 1, 2, 1])
    out, _ = decoding.speculative_generate(t64, prop, prompt, 6, k=3, temperature=0)
    assert prop.host is None
    assert torch.equal(out, decoding.generate(t64, prompt, 6, temperature=0))


def test_training_raises_the_acceptance_above_an_untrained_drafts(tiny):
    target, _ = tiny
    ids = torch.randint(3, (400,), generator=torch.Generator().manual_seed(0))
    before = [p.detach().clone() for p in target.parameters()]
    grads = [p.requires_grad for p in target.parameters()]
    kw = dict(steps=40, batch_size=64, depths=3, progress=False, **SIZES)
    draft, seconds = train_recurrent(target, ids, **kw)
    assert seconds > 0 and not draft.training
    assert draft.sizes == {"target_width": 8, "vocab_size": 3, "feature_layers": 1, **SIZES}
    # The target is frozen, and left as it was.
    assert all(torch.equal(a, b) for a, b in zip(before, target.parameters()))
    assert [p.requires_grad for p in target.parameters()] == grads
    torch.manual_seed(0)
    untrained = RecurrentDraft.for_target(target, **SIZES).eval()
    with torch.inference_mode():
        f, x = collect_features(target, ids, 4)
    trained_alpha = recurrent_alpha_by_depth(draft, target, f, x, 4)
    base = recurrent_alpha_by_depth(untrained, target, f, x, 4)
    assert all(a > b + 0.1 for a, b in zip(trained_alpha, base)), (trained_alpha, base)
    # Same seed, same draft.
    again, _ = train_recurrent(target, ids, **{**kw, "steps": 5})
    twice, _ = train_recurrent(target, ids, **{**kw, "steps": 5})
    for a, b in zip(again.parameters(), twice.parameters()):
        assert torch.equal(a, b)


def test_the_checkpoint_round_trips_and_refuses_other_targets(tiny, tmp_path, monkeypatch):
    target, draft = tiny
    path = save_recurrent(tmp_path / "r.pt", draft, target, {"steps": 40, "alpha": [0.5]})
    back = load_recurrent(path, target=target)
    assert back.meta == {"steps": 40, "alpha": [0.5]} and back.sizes == draft.sizes
    assert not back.training and isinstance(back, RecurrentDraft)
    for (name, a), b in zip(draft.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), name
    ck = torch.load(path, map_location="cpu", weights_only=True)  # plain tensors and data
    assert set(ck) == {"state_dict", "sizes", "target_fingerprint", "meta"}
    command = re.escape(RECURRENT_COMMAND)
    with pytest.raises(FileNotFoundError, match=command):
        load_recurrent(tmp_path / "missing.pt", target=target)
    monkeypatch.setenv("SPECDEC_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=f"recurrent.pt not found.*{command}"):
        load_recurrent(target=target)  # the default path
    with pytest.raises(ValueError, match=f"trained on another target.*{command}"):
        load_recurrent(path, target=tiny_model(9, block_size=16))  # same sizes
    with pytest.raises(ValueError, match=f"could not be read.*another target.*{command}"):
        load_recurrent(path, target=tiny_model(3, V=4, block_size=16))  # other sizes
    raw = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint" * 10)
    torch.save({"state_dict": {}, "sizes": draft.sizes}, tmp_path / "keys.pt")
    for bad in ("cut.pt", "junk.pt", "keys.pt"):
        with pytest.raises(ValueError, match=f"(?s)could not be read.*{command}"):
            load_recurrent(tmp_path / bad, target=target)
    with pytest.raises(ValueError, match="CharGPT"):
        load_recurrent(path, target=draft)


def test_bad_input_raises_clear_errors(tiny):
    target, draft = tiny
    with pytest.raises(ValueError, match="RecurrentDraft"):
        check_recurrent(target, target)
    with pytest.raises(ValueError, match="RecurrentDraft"):
        RecurrentProposer(target, target)
    with pytest.raises(ValueError, match="another target"):
        check_recurrent(RecurrentDraft(12, 3, **SIZES), target)  # other width
    with pytest.raises(ValueError, match="another target"):
        RecurrentProposer(RecurrentDraft(8, 4, **SIZES), target)  # other vocabulary
    with pytest.raises(ValueError, match="CharGPT"):
        check_recurrent(draft, draft)
    with pytest.raises(ValueError, match="CharGPT"):
        RecurrentDraft.for_target(draft)
    for name in ("target_width", "vocab_size", "state", "hidden", "init_hidden"):
        sizes = {"target_width": 8, "vocab_size": 3, **SIZES}
        for bad in (0, -2):
            with pytest.raises(ValueError, match=name):
                RecurrentDraft(**{**sizes, name: bad})
    with pytest.raises(ValueError, match="another target"):  # built for another target
        decoding.speculative_generate(
            tiny_model(9, block_size=16), RecurrentProposer(draft, target), torch.tensor([0]), 3
        )
    with pytest.raises(ValueError, match="cuda_graphs"):
        decoding.speculative_generate(
            target, RecurrentProposer(draft, target), torch.tensor([0, 1]), 3, cuda_graphs=True
        )
    ids = torch.zeros(100, dtype=torch.long)
    with pytest.raises(ValueError, match="depths"):
        train_recurrent(target, ids, depths=15, progress=False)
    with pytest.raises(ValueError, match="depth_decay"):
        train_recurrent(target, ids, depth_decay=1.5, progress=False)
    with pytest.raises(ValueError, match="CharGPT"):
        train_recurrent(draft, ids, progress=False)


def test_the_shipped_draft_records_its_training(shipped_draft):
    meta = shipped_draft.meta
    assert meta["command"] == RECURRENT_COMMAND
    assert set(meta["settings"]) == set(RECURRENT_SHIPPED)
    assert shipped_draft.sizes["state"] == meta["settings"]["state"]
    assert shipped_draft.sizes["hidden"] == meta["settings"]["hidden"]
    assert shipped_draft.sizes["init_hidden"] == meta["settings"]["init_hidden"]
    assert shipped_draft.feature_layers == meta["settings"]["feature_layers"]
    assert meta["train_seconds"] > 0
    by_depth = meta["alpha_by_depth"]
    assert len(by_depth) == 8 and all(isinstance(a, float) and 0 < a < 1 for a in by_depth)
    s = meta["settings"]
    assert meta["positions"] == s["steps"] * s["batch_size"] * s["depths"]
    plain = meta["draft_alpha_by_depth"]
    assert len(plain) == 8 and all(isinstance(a, float) and 0 < a < 1 for a in plain)
    # Above the draft model by at least 0.03 at every depth, on the same positions (the
    # issue's bar; data/README.md prints both lists).
    assert all(a > b + 0.03 for a, b in zip(by_depth, plain))
    assert meta["params"] == sum(p.numel() for p in shipped_draft.parameters())
    ck = torch.load(checkpoints_dir() / "recurrent.pt", map_location="cpu", weights_only=True)
    assert ck["meta"] == meta and ck["sizes"] == shipped_draft.sizes
    assert math.isfinite(ck["target_fingerprint"])


def test_data_readme_gives_the_shipped_drafts_figures_from_its_record(shipped_draft):
    meta, s = shipped_draft.meta, shipped_draft.meta["settings"]
    text, section = data_readme("The recurrent EAGLE-style draft")
    assert_prints(text, f"{meta['params']:,}")
    assert_prints(section, f"{meta['train_seconds']:.0f}", f"{s['steps']:,}", str(s["batch_size"]))
    assert_prints(section, str(s["feature_layers"] - 1), str(s["depths"]), str(s["kl_weight"]))
    assert_prints(section, str(s["depth_decay"]), f"{meta['positions'] / 1e6:.0f}")
    assert_prints(section, str(s["state"]), str(s["hidden"]), str(s["init_hidden"]))
    size = (checkpoints_dir() / "recurrent.pt").stat().st_size
    assert_prints(text, f"{size / 1e6:.1f}")
    assert_prints(section, *(f"{a:.3f}" for a in meta["alpha_by_depth"]))
    plain = meta["draft_alpha_by_depth"]
    assert_prints(section, f"{min(plain):.3f}", f"{max(plain):.3f}")


# ------------------------------------------------ features from several of the target's blocks


@pytest.fixture(scope="module")
def tiny2():
    # A 2-layer target and a random draft that reads both blocks' outputs.
    target = tiny_model(4, block_size=16, n_layer=2)
    return target, _random_draft(target, seed=6, feature_layers=2)


@torch.inference_mode()
def test_wide_features_are_the_earlier_blocks_outputs_normed_then_the_last_hidden_state(tiny2):
    target, _ = tiny2
    ids = torch.tensor([[0, 2, 1, 1, 0, 2, 2]])
    tr = target.transformer
    x0 = tr.wte(ids) + tr.wpe(torch.arange(7))
    x1 = tr.h[0](x0)
    wide = target_features(target, ids, 2)
    assert wide.shape == (1, 7, 16)
    torch.testing.assert_close(wide[..., :8], torch.nn.functional.layer_norm(x1, (8,)))
    assert torch.equal(wide[..., 8:], target.hidden_states(ids))  # lm_head's input, last
    assert torch.equal(target_features(target, ids, 1), target.hidden_states(ids))
    assert (wide[..., :8] - wide[..., 8:]).abs().max() > 0.1  # two different blocks
    for bad in (0, 3, 1.0, "2"):
        with pytest.raises(ValueError, match="layers"):
            target_features(target, ids, bad)


@torch.inference_mode()
@pytest.mark.parametrize("which", ["tiny 2 layers", "shipped 4 layers"])
def test_the_loops_lean_step_gives_the_wide_features_of_a_full_forward(tiny2, target, which):
    from specdec_course.fast.lean import LeanStep

    model = tiny2[0] if which.startswith("tiny") else target
    m = model.config.n_layer
    ids = torch.tensor([0, 2, 1, 1, 0, 2, 2, 1, 0, 1])
    want = target_features(model, ids[None], m)[0]
    lean = LeanStep(model)
    cache = lean.new_cache()
    got = torch.cat([lean.hidden(ids[:6], cache, layers=m), lean.hidden(ids[6:], cache, layers=m)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    cache = lean.new_cache()
    torch.testing.assert_close(
        lean.hidden(ids, cache), want[:, -model.config.n_embd :], atol=1e-5, rtol=1e-4
    )


@pytest.mark.parametrize("host", [True, False], ids=["numpy", "tensor"])
def test_a_wide_draft_is_exact_greedy_and_drafts_from_the_wide_feature_at_n_minus_2(
    tiny2, monkeypatch, host
):
    target, draft = tiny2
    if not host:
        monkeypatch.setattr(recurrent_module, "numpy_ok", lambda w: False)
    prompt = torch.tensor([2, 0, 1, 1])
    ref = decoding.generate(target, prompt, 12, temperature=0)
    p = RecurrentProposer(draft, target)
    got, st = decoding.speculative_generate(target, p, prompt, 12, k=3, temperature=0)
    assert (p.host is not None) == host and p.feats.shape[1] == 16
    assert torch.equal(got, ref) and st.drafted > 0
    # q of a proposal is the cell unrolled from the wide feature at n - 2.
    n, k = prompt.numel(), 4
    with torch.inference_mode():
        p.start(prompt, n, SamplingOptions(1.0), torch.Generator().manual_seed(1), 10, k)
        out = torch.empty(k, dtype=torch.long)
        kk, q = p.propose(prompt, n, k, out)
        f = target_features(target, torch.cat([prompt, out])[None], 2)[0]
        fed = torch.cat([prompt[n - 1 :], out[: k - 1]])
        torch.testing.assert_close(q, draft.unroll(f[n - 2], fed).softmax(-1), atol=1e-5, rtol=1e-4)
        assert (q - draft.unroll(f[n - 3], fed).softmax(-1)).abs().max() > 1e-2


@torch.inference_mode()
def test_the_numpy_and_tensor_paths_of_a_wide_draft_draft_alike(tiny2, monkeypatch):
    target, draft = tiny2
    _propose_both_ways(draft, target, torch.tensor([0, 1, 2, 2, 1]), monkeypatch)


def test_the_loop_passes_a_wide_draft_its_features_so_it_runs_no_forward_of_its_own(
    tiny2, monkeypatch
):
    target, draft = tiny2
    calls = []
    real = draft_module.target_features

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(draft_module, "target_features", counted)
    prompt = torch.tensor([0, 2, 1, 1])
    p = RecurrentProposer(draft, target)
    got, _ = decoding.speculative_generate(target, p, prompt, 10, k=3, temperature=0)
    assert calls == [] and torch.equal(got, decoding.generate(target, prompt, 10, temperature=0))


def test_speculative_sampling_with_a_wide_draft_keeps_the_law_of_the_target(tiny2):
    _check_law(*tiny2, {})


@torch.inference_mode()
def test_a_wide_drafts_loss_and_alpha_read_p_from_the_last_hidden_state(tiny2):
    target, draft = tiny2
    g = torch.Generator().manual_seed(0)
    f = torch.randn(3, 9, 16, generator=g)
    x = torch.randint(3, (3, 9), generator=g)
    w, t = torch.tensor([0, 2, 1]), torch.tensor([1, 4, 5])
    p, q = _loss_terms(draft, target, f, x, w, t, 3)
    want_p, want_q = _hand_terms(draft, target, f, x, w, t, 3)
    torch.testing.assert_close(p, want_p, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(q, want_q, atol=1e-6, rtol=1e-5)
    ids = torch.randint(3, (200,), generator=g)
    wide, xs = collect_features(target, ids, 3, layers=2)
    assert wide.shape[-1] == 16
    assert len(recurrent_alpha_by_depth(draft, target, wide, xs, depth=3)) == 3
    narrow, _ = collect_features(target, ids, 3)
    torch.testing.assert_close(narrow, wide[..., 8:])
    with pytest.raises(ValueError, match=r"layers=2"):
        recurrent_alpha_by_depth(draft, target, narrow, xs, depth=3)


def test_a_wide_draft_refuses_a_target_with_fewer_blocks_and_round_trips(tiny, tiny2, tmp_path):
    target, draft = tiny2
    one_layer, _ = tiny
    with pytest.raises(ValueError, match="reads 2 of the target's blocks"):
        RecurrentProposer(draft, one_layer)
    with pytest.raises(ValueError, match="feature_layers"):
        train_recurrent(
            one_layer, torch.zeros(100, dtype=torch.long), feature_layers=2, progress=False
        )
    back = load_recurrent(save_recurrent(tmp_path / "w.pt", draft, target), target=target)
    assert back.feature_layers == 2 and back.sizes == draft.sizes
