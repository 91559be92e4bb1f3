"""The one-layer draft's folded step (fast.folded): the same logits and cache as a forward."""

import copy
import pickle

import pytest
import torch

from specdec_course import decoding
from specdec_course.fast import FoldedCache, FoldedStep, LeanStep, draft_step, lean_step
from specdec_course.model import CharGPT, GPTConfig

ATOL = 2e-5  # float32; the folds sum in another order than decode_hidden

CONFIG = GPTConfig(vocab_size=13, block_size=40, n_layer=1, n_head=4, n_embd=24)


@pytest.fixture
def model():
    torch.manual_seed(0)
    m = CharGPT(CONFIG).eval()
    for p in m.parameters():  # biases away from 0, so that a dropped or doubled bias shows
        torch.nn.init.normal_(p, std=0.3)
    return m


def _ids(n, seed=0):
    return torch.randint(CONFIG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids, cache):
    # The reference: decode_hidden over the new ids, then the tied output layer.
    h = model.decode_hidden(ids[None], cache)[0]
    return torch.nn.functional.linear(h, model.lm_head.weight)


@torch.inference_mode()
def test_steps_match_decode_hidden_through_feeds_and_rollbacks(model):
    x = _ids(36)
    step = draft_step(model)
    assert isinstance(step, FoldedStep)
    cache, ref = step.new_cache(), model.new_cache(1)
    assert isinstance(cache, FoldedCache)
    step.feed(x[:10], cache)  # a prefill
    model(x[None, :10], ref)
    out = torch.empty(1, CONFIG.vocab_size)
    # One-token steps, one-token feeds (a catch-up) and rollbacks, in the order a run makes them.
    for kind, arg in (
        ("step", 3),
        ("feed", 1),
        ("crop", 11),
        ("step", 5),
        ("feed", 2),
        ("crop", 14),
        ("step", 1),
        ("step", 4),
    ):
        if kind == "crop":
            cache.crop(arg)
            ref.crop(arg)
            continue
        for _ in range(arg):
            at = cache.length
            if kind == "feed":
                step.feed(x[at : at + 1], cache)
                model(x[None, at : at + 1], ref)
            else:  # the token as a tensor, as the draft loop passes it, and as an int
                tok = x[at : at + 1] if at % 2 else int(x[at])
                step.step(tok, cache, out)
                want = _logits(model, x[at : at + 1], ref)
                torch.testing.assert_close(out, want, atol=ATOL, rtol=0)
            assert cache.length == ref.length == at + 1
    assert decoding.caches_consistent(model, cache, x)


@torch.inference_mode()
def test_the_cache_holds_keys_and_projected_values(model):
    # The layout the module documents, checked against a forward's own keys and values.
    x = _ids(12, seed=2)
    step = draft_step(model)
    cache, ref = step.new_cache(), model.new_cache(1)
    step.feed(x, cache)
    model(x[None], ref)
    nh, C = CONFIG.n_head, CONFIG.n_embd
    keys = ref.k[0, 0, :, :12].transpose(0, 1).reshape(12, C)
    w = model.transformer.h[0].attn.c_proj.weight  # [C_out, C_in]
    vp = torch.stack(
        [ref.v[0, 0, h, :12] @ w[:, h * (C // nh) : (h + 1) * (C // nh)].T for h in range(nh)],
        dim=1,
    ).reshape(12, nh * C)
    torch.testing.assert_close(cache.k[:12], keys, atol=ATOL, rtol=0)
    torch.testing.assert_close(cache.v[:12], vp, atol=ATOL, rtol=0)
    # A cache that disagrees is caught by caches_consistent.
    cache.k[3, 0] += 1.0
    assert not decoding.caches_consistent(model, cache, x)


@torch.inference_mode()
def test_the_shipped_draft_steps_as_its_forward():
    from specdec_course.model import load_pretrained

    draft = load_pretrained("draft")
    x = torch.randint(draft.config.vocab_size, (80,), generator=torch.Generator().manual_seed(5))
    step = draft_step(draft)
    cache = step.new_cache()
    step.feed(x[:79], cache)
    out = torch.empty(1, draft.config.vocab_size)
    step.step(x[79:], cache, out)
    torch.testing.assert_close(out[0], draft(x[None])[0, -1], atol=1e-4, rtol=0)


def test_a_deeper_model_keeps_its_lean_step():
    m = CharGPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=8)).eval()
    assert draft_step(m) is lean_step(m)
    with pytest.raises(ValueError, match="one-layer model; this one has 2 layers"):
        FoldedStep(m)


def test_the_folded_step_is_rebuilt_when_the_weights_change_and_not_copied(model):
    first = draft_step(model)
    assert draft_step(model) is first
    model.load_state_dict(model.state_dict())
    assert draft_step(model) is not first
    copied = copy.deepcopy(model)  # the model holds nothing derived: copies build their own
    assert draft_step(copied) is not draft_step(model)
    assert isinstance(draft_step(pickle.loads(pickle.dumps(model))), FoldedStep)
    assert isinstance(lean_step(model), LeanStep)


def test_crop_is_a_pointer_move_with_kv_caches_checks(model):
    cache = draft_step(model).new_cache()
    draft_step(model).feed(_ids(5), cache)
    cache.crop(2)
    assert cache.length == 2 and cache.capacity == CONFIG.block_size and cache.batch_size == 1
    with pytest.raises(ValueError, match=r"crop\(n\) needs an int 0 <= n <= cache.length \(2\)"):
        cache.crop(3)
    assert "FoldedCache(length=2" in repr(cache)
