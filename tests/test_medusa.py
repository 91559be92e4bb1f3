"""Medusa heads, tree verification and medusa_generate.

Pinned here: the tree forward pass equals plain forward passes along each root-to-node path;
cache compaction leaves the cache equal to a fresh run on the accepted prefix; greedy Medusa
is greedy target decoding token for token (chain and trees); sampling is lossless (chi-square
against the exact joint distribution); the heads are separate parameters and the loss weights
are 0.8^k.

Chi-square tests use the threshold df + 10*sqrt(2 df) (``specdec_course.stats``); each test
asserts from the result object that its false-failure rate is below 1e-6 (df of tens to a
hundred here: the rate is between 1e-8 and 1e-20).
"""

import pytest
import torch
from helpers import assert_fits_joint3, exact_sequence_law, peaky_model
from torch.nn import functional as F

from specdec_course import decoding, medusa, stats
from specdec_course.model import GPTConfig, load_pretrained

SMALL = GPTConfig(vocab_size=8, block_size=24, n_layer=1, n_head=2, n_embd=16)
MID = GPTConfig(vocab_size=20, block_size=64, n_layer=2, n_head=2, n_embd=24)
TREE2 = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (2, 0), (0, 2)]
# 31 nodes, 3 deep, several children per node: paths that need compaction copies.
TREE3 = [
    (0,),
    (1,),
    (2,),
    (3,),
    (4,),
    (0, 0),
    (0, 1),
    (1, 0),
    (0, 2),
    (2, 0),
    (1, 1),
    (0, 3),
    (3, 0),
    (0, 0, 0),
    (2, 1),
    (0, 0, 1),
    (1, 2),
    (0, 1, 0),
    (4, 0),
    (1, 0, 0),
    (0, 0, 2),
    (0, 4),
    (2, 2),
    (0, 2, 0),
    (1, 3),
    (2, 0, 0),
    (0, 1, 1),
    (3, 1),
    (0, 0, 3),
    (1, 0, 1),
]


def _random_heads(model, n_heads, seed, scale=1.0):
    torch.manual_seed(seed)
    heads = medusa.MedusaHeads.from_target(model, n_heads)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(scale * torch.randn_like(p))
    return heads.eval()


@pytest.fixture(scope="module")
def shipped():
    target = load_pretrained("target")
    return target, medusa.load_heads()


# ----------------------------------------------------------------------------------- heads


def test_fresh_heads_equal_the_base_head():
    model = peaky_model(MID, 0, 1.0)
    heads = medusa.MedusaHeads.from_target(model, 3)
    h = torch.randn(5, 7, MID.n_embd)
    out = heads(h)
    assert out.shape == (3, 5, 7, MID.vocab_size)
    base = model.lm_head(h)
    for k in range(3):
        assert torch.allclose(out[k], base, atol=1e-6)


def test_heads_are_distinct_parameters():
    model = peaky_model(MID, 0, 1.0)
    heads = medusa.MedusaHeads.from_target(model, 3)
    ptrs = [p.data_ptr() for p in heads.parameters()]
    assert len(ptrs) == len(set(ptrs)) == 3 * 3  # W, b and the output matrix per head
    assert model.lm_head.weight.data_ptr() not in ptrs
    # Training one head leaves the others and the target alone.
    before = [p.detach().clone() for p in heads.parameters()]
    target_before = model.lm_head.weight.detach().clone()
    opt = torch.optim.SGD(heads.heads[1].parameters(), lr=1.0)
    heads.heads[1](torch.randn(4, MID.n_embd)).sum().backward()
    opt.step()
    changed = [not torch.equal(a, b) for a, b in zip(before, heads.parameters())]
    assert changed == [False] * 3 + [True] * 3 + [False] * 3
    assert torch.equal(model.lm_head.weight, target_before)


def test_loss_weights_are_powers_of_0_8():
    assert torch.allclose(medusa.loss_weights(3), torch.tensor([0.8, 0.64, 0.512]))
    assert torch.allclose(medusa.loss_weights(5), 0.8 ** torch.arange(1, 6).float())


def test_medusa_loss_is_the_weighted_sum_of_head_cross_entropies():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 6, 11)
    targets = torch.randint(11, (3, 4, 6))
    loss, ce = medusa.medusa_loss(logits, targets)
    by_hand = [F.cross_entropy(logits[k].reshape(-1, 11), targets[k].reshape(-1)) for k in range(3)]
    assert torch.allclose(ce, torch.stack(by_hand))
    assert torch.allclose(loss, sum(0.8 ** (k + 1) * by_hand[k] for k in range(3)))


def test_head_targets_shift_by_one_plus_k():
    ids = torch.arange(10)[None]
    targets, valid = medusa.head_targets(ids, 3)
    for k in (1, 2, 3):
        n = 10 - 1 - k
        assert torch.equal(targets[k - 1, 0, :n], torch.arange(1 + k, 10))
        assert valid[k - 1, 0, :n].all() and not valid[k - 1, 0, n:].any()


# ----------------------------------------------------------------------------------- trees


def test_tree_attention_mask_marks_ancestors_and_self():
    # paths sorted breadth first: 1=(0,) 2=(1,) 3=(0,0) 4=(0,1) 5=(1,0) 6=(0,0,0)
    got = medusa.tree_attention_mask([(0, 0, 0), (1,), (0,), (0, 1), (0, 0), (1, 0)])
    want = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0, 0],
            [1, 1, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 1, 0, 0],
            [1, 0, 1, 0, 0, 1, 0],
            [1, 1, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(got, want)


def test_chain_mask_is_causal():
    chain = medusa.build_tree(medusa.CHAIN)
    assert torch.equal(chain.mask, torch.ones(4, 4, dtype=torch.bool).tril())
    assert chain.depth.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "paths, what",
    [
        ([(0,), (0, 0, 1)], "parent"),
        ([(0,), (0,)], "twice"),
        ([(0,), (-1,)], "ranks"),
        ([()], "non-empty"),
        ("abc", "list of paths"),
    ],
)
def test_malformed_trees_raise(paths, what):
    with pytest.raises(ValueError, match=what):
        medusa.build_tree(paths)


def test_named_trees_are_valid_and_nested_by_depth():
    for name, paths in medusa.TREES.items():
        tb = medusa.build_tree(paths)
        assert tb.max_depth <= medusa.DEFAULT_HEADS, name
        # Breadth first: nodes of depth <= d are a prefix of the node order.
        assert tb.depth.tolist() == sorted(tb.depth.tolist()), name
        assert tb.upto[-1] == tb.size
    assert medusa.build_tree(medusa.TREE_SMALL).size < medusa.build_tree(medusa.TREE_LARGE).size


def test_greedy_tree_takes_the_largest_products():
    acc = torch.tensor([[0.6, 0.2, 0.1], [0.5, 0.2, 0.1]])
    tree = medusa.greedy_tree(acc, 4)
    # products: (0,)=.6 (0,0)=.3 (1,)=.2 (0,1)=.12 (1,0)=.1 (2,)=.1
    assert tree == [(0,), (1,), (0, 0), (0, 1)]


def test_tree_forward_equals_forward_along_each_path():
    model = peaky_model(MID, 1, 1.0)
    tb = medusa.build_tree(TREE3)
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(MID.vocab_size, (9,), generator=g)
    tokens = torch.randint(MID.vocab_size, (tb.size,), generator=g)
    cache = model.new_cache(1)
    with torch.inference_mode():
        model(prefix[None, :-1], cache)
        tokens[0] = prefix[-1]  # the root is the pending token
        logits, hidden = medusa.tree_forward(model, tokens, cache, tb)
        assert cache.length == 8 + tb.size
        for i in range(tb.size):
            seq = torch.cat([prefix, tokens[tb.path_nodes[i]]])
            ref_logits, ref_hidden = model(seq[None], return_hidden=True)
            assert torch.allclose(logits[i], ref_logits[0, -1], atol=1e-5), f"node {i}"
            assert torch.allclose(hidden[i], ref_hidden[0, -1], atol=1e-5), f"node {i}"


@pytest.mark.parametrize("path", [(0,), (1, 0), (0, 2), (1, 0, 0), (0, 0, 0)])
def test_compaction_leaves_the_cache_of_a_fresh_run_on_the_accepted_prefix(path):
    model = peaky_model(MID, 2, 1.0)
    tb = medusa.build_tree(TREE3)
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(MID.vocab_size, (6,), generator=g)
    tokens = torch.randint(MID.vocab_size, (tb.size,), generator=g)
    tokens[0] = prefix[-1]
    cache = model.new_cache(1)
    with torch.inference_mode():
        model(prefix[None, :-1], cache)
        start = cache.length
        medusa.tree_forward(model, tokens, cache, tb)
        node = tb.paths.index(path) + 1
        medusa.compact_cache(cache, start, tb.path_nodes[node])
    accepted = torch.cat([prefix, tokens[tb.path_nodes[node]]])
    assert cache.length == accepted.numel()
    assert decoding.caches_consistent(model, cache, accepted)
    # and a token fed next sees exactly that prefix
    with torch.inference_mode():
        nxt = model(torch.tensor([[3]]), cache)[0, -1]
        ref = model(torch.cat([accepted, torch.tensor([3])])[None])[0, -1]
    assert torch.allclose(nxt, ref, atol=1e-5)


# ----------------------------------------------------------------------------- generation


@pytest.mark.parametrize(
    "tree", ["chain", "small", "large", TREE3], ids=["chain", "small", "large", "deep"]
)
def test_greedy_medusa_matches_greedy_target(shipped, val_prompts, tree):
    target, heads = shipped
    accepted = 0
    for prompt in val_prompts:
        ref = decoding.generate(target, prompt, 120, temperature=0)
        out, st = medusa.medusa_generate(target, heads, prompt, 120, tree=tree, temperature=0)
        assert torch.equal(out, ref), f"first difference at {int((out != ref).nonzero()[0])}"
        assert st.emitted == 120 and st.target_calls == st.iterations + 1
        accepted += st.accepted
    assert accepted > 0  # the heads' guesses were used, not only the target's own tokens


def test_greedy_medusa_matches_greedy_target_up_to_the_end_of_the_context():
    # The tree is cut to the context's last slots and to the tokens still needed.
    model = peaky_model(MID, 3, 2.0)
    heads = _random_heads(model, 3, 4, 0.3)
    prompt = torch.randint(MID.vocab_size, (20,), generator=torch.Generator().manual_seed(2))
    for n in (0, 1, 2, 5, MID.block_size - 20):
        ref = decoding.generate(model, prompt, n, temperature=0)
        out, st = medusa.medusa_generate(model, heads, prompt, n, tree=TREE3, temperature=0)
        assert torch.equal(out, ref), n
        assert out.numel() == 20 + n and st.emitted == n


def test_sampled_output_has_exactly_max_new_tokens(shipped, val_prompts):
    target, heads = shipped
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 4, 57):
        out, st = medusa.medusa_generate(target, heads, val_prompts[0], n, generator=g)
        assert out.shape == (32 + n,) and torch.equal(out[:32], val_prompts[0])
        assert n <= sum(st.accepted_per_iteration) + st.iterations + 1 <= n + 1


def test_sampling_is_lossless_joint_of_generated_characters():
    # 5,000 runs on a small peaked model: prefill, then a tree pass of depth 2 over 8
    # guesses (accept, reject and renormalise, residual sample), and another pass if needed.
    # Runs from a power analysis of the walk's defects this test is for, their noncentrality
    # per run estimated from 20,000 runs of each (bias-corrected, on the bins merged at 5,000):
    # a child accepted with probability p(child) instead of p(child) / (mass not yet
    # rejected), 0.060 per run on the first two symbols (df 49): noncentrality 298, power
    # 1 - 7e-12; the last token sampled with the rejected guesses still in, 0.15 per run:
    # power 1. (The same walk serves Hydra's ranked guesses; the first defect is this test's
    # to catch: on test_medusa_hydra's model it is 0.002 per run.) The false-failure rate,
    # 7e-12 per marginal at 5,000, is asserted below 1e-6. (50,000 runs before: 32 s.)
    model = peaky_model(SMALL, 5, 10.0)
    heads = _random_heads(model, 2, 6, 0.5)
    tree = medusa.build_tree(TREE2)
    prompt = torch.tensor([3])
    V, runs = SMALL.vocab_size, 5_000
    g = torch.Generator().manual_seed(7)
    seen = torch.zeros(V**3, dtype=torch.long)
    accepted = rejected = deep = 0
    for _ in range(runs):
        out, st = medusa.medusa_generate(model, heads, prompt, 3, tree=tree, generator=g)
        seen[(out[1] * V + out[2]) * V + out[3]] += 1
        accepted += st.accepted
        rejected += st.rejections
        deep += st.accepted_per_iteration[0] == 2
    # every branch exercised: accepts, rejections, and paths down to depth 2
    assert accepted > 0.2 * runs and rejected > 0.2 * runs and deep > 0.05 * runs
    assert_fits_joint3(seen, exact_sequence_law(model, prompt, 3).view(V, V, V), 20)


def test_sampling_with_top_k_and_temperature_is_lossless():
    model = peaky_model(SMALL, 8, 10.0)
    heads = _random_heads(model, 2, 9, 0.5)
    prompt = torch.tensor([5, 1])
    V, runs = SMALL.vocab_size, 10_000
    g = torch.Generator().manual_seed(11)
    seen = torch.zeros(V * V, dtype=torch.long)
    for _ in range(runs):
        out, _ = medusa.medusa_generate(
            model, heads, prompt, 3, tree=TREE2, temperature=0.7, top_k=4, generator=g
        )
        seen[out[3] * V + out[4]] += 1
    # exact p(x2, x3): sum over x1 of p(x1) p(x2 | x1) p(x3 | x1 x2), after the processing
    exact = exact_sequence_law(model, prompt, 3, temperature=0.7, top_k=4).view(V, V, V)
    pj = exact.sum(0).flatten()
    res = stats.chi_square_test(seen, pj / pj.sum())
    assert res.false_failure_rate < 1e-6
    assert res.passed, str(res)


# ----------------------------------------------------------------------------- boundaries


def test_bad_arguments_raise_clear_errors():
    model = peaky_model(MID, 0, 1.0)
    heads = medusa.MedusaHeads.from_target(model, 2)
    prompt = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="deep"):
        medusa.medusa_generate(model, heads, prompt, 5, tree=medusa.CHAIN)
    with pytest.raises(ValueError, match="heads must be a MedusaHeads"):
        medusa.medusa_generate(model, model, prompt, 5)
    with pytest.raises(ValueError, match="n_embd"):
        medusa.medusa_generate(model, medusa.MedusaHeads(8, MID.vocab_size), prompt, 5)
    with pytest.raises(ValueError, match="prompt_ids"):
        medusa.medusa_generate(model, heads, torch.tensor([], dtype=torch.long), 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        medusa.medusa_generate(model, heads, prompt, -1)
    with pytest.raises(ValueError, match="temperature"):
        medusa.medusa_generate(model, heads, prompt, 3, tree=[(0,)], temperature=-1.0)
    with pytest.raises(ValueError, match="tree must be one of"):
        medusa.medusa_generate(model, heads, prompt, 3, tree="huge")


def test_missing_or_foreign_heads_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="specdec-course train --preset medusa"):
        medusa.load_heads(tmp_path / "nope.pt")
    model = peaky_model(MID, 0, 1.0)
    heads = medusa.MedusaHeads.from_target(model, 2)
    path = medusa.save_heads(tmp_path / "h.pt", heads, model, {"steps": 1})
    back = medusa.load_heads(path, target=model)
    assert back.meta == {"steps": 1}
    for a, b in zip(heads.parameters(), back.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="another target"):
        medusa.load_heads(path, target=peaky_model(MID, 1, 1.0))
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="could not be read"):
        medusa.load_heads(tmp_path / "bad.pt")


def test_shipped_heads_beat_chance_and_fit_the_size_budget(shipped):
    from specdec_course.paths import checkpoints_dir

    target, heads = shipped
    # Hydra heads of 512 units (their token tables are most of it) with the Medusa-1 heads
    assert (checkpoints_dir() / "medusa.pt").stat().st_size <= 4 * 1024 * 1024
    assert heads.n_heads == medusa.DEFAULT_HEADS
    medusa.load_heads(target=target)  # trained on this very target
    top1 = heads.meta["val_top1"]
    assert all(a > 5 / 65 for a in top1) and top1 == sorted(top1, reverse=True)


def test_node_law_is_the_walks_rule_enumerated_and_equals_the_target():
    # medusa.node_law (what lesson 06 checks the rule with) against the grader's own
    # enumeration of the rule (accept-or-move-on per child, then what is left), and the
    # lossless property: for any children the emitted token is distributed as p.
    from specdec_grader.judge.ex07.walk import _node_law

    g = torch.Generator().manual_seed(0)
    for trial in range(6):
        p = torch.softmax(3 * torch.randn(7, dtype=torch.float64, generator=g), -1)
        if trial % 2:
            p[int(torch.randint(7, (), generator=g))] = 0.0  # a child the target never emits
            p = p / p.sum()
        kids = torch.randperm(7, generator=g)[: 1 + trial].tolist()
        moves, rest = _node_law(p, kids)
        want = rest.clone()
        for c, m in zip(kids, moves):
            want[c] += m
        got = medusa.node_law(p, kids)
        assert torch.allclose(got, want, atol=1e-12)
        assert torch.allclose(got, p, atol=1e-12)
