"""The NumPy steps (fast.numpy_steps): the tensor steps' logits and caches, on the same memory."""

import numpy as np
import pytest
import torch

from specdec_course import decoding
from specdec_course.drafts import ModelProposer
from specdec_course.fast import FoldedStep, draft_step, lean_step
from specdec_course.fast.numpy_steps import NumpyFolded, NumpyStep
from specdec_course.model import CharGPT, GPTConfig
from specdec_course.sampling import SamplingOptions

ATOL = 2e-5  # float32; the folds sum in another order than decode_hidden

DEEP = GPTConfig(vocab_size=11, block_size=32, n_layer=3, n_head=2, n_embd=16)
ONE = GPTConfig(vocab_size=13, block_size=40, n_layer=1, n_head=4, n_embd=24)


def _model(config, std=0.3, dtype=torch.float32):
    torch.manual_seed(0)
    m = CharGPT(config).eval()
    for p in m.parameters():  # biases away from 0, so that a dropped or doubled bias shows
        torch.nn.init.normal_(p, std=std)
    return m.to(dtype)


def _ids(config, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(config.vocab_size, (n,), generator=g)


def _reference(model, ids, cache):
    h = model.decode_hidden(ids[None], cache)[0]
    return torch.nn.functional.linear(h, model.lm_head.weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@torch.inference_mode()
def test_numpy_target_step_matches_decode_hidden_for_every_size_and_after_rollback(dtype):
    model = _model(DEEP, dtype=dtype)
    x = _ids(DEEP, 30)
    lean = lean_step(model, numpy=True)
    assert isinstance(lean.np_step, NumpyStep) and lean_step(model).np_step is None
    cache, ref = model.new_cache(1), model.new_cache(1)
    model(x[None, :8], cache)  # a tensor prefill, then NumPy steps on the same cache
    model(x[None, :8], ref)
    out = torch.empty(9, DEEP.vocab_size, dtype=dtype)
    for T, crop in ((1, None), (4, None), (9, None), (2, 15), (1, None), (5, 12), (1, None)):
        if crop is not None:
            cache.crop(crop)
            ref.crop(crop)
        at = cache.length
        tok = x[at : at + T] if T % 2 else x[at : at + T].numpy()  # a tensor or an array
        lean.step(tok, cache, out[:T] if at % 2 else out[:T].numpy())
        want = _reference(model, x[at : at + T], ref)
        assert cache.length == ref.length == at + T
        torch.testing.assert_close(out[:T], want, atol=ATOL, rtol=0)
    assert decoding.caches_consistent(model, cache, x)


@torch.inference_mode()
def test_plain_and_speculative_decoding_run_on_the_numpy_target_step():
    # The loops take LeanStep.step: with executor="numpy" the target's steps are NumPy ones,
    # and greedy decoding still gives the target's own argmax continuation.
    target, draft = _model(DEEP), _model(GPTConfig(**{**DEEP.__dict__, "n_layer": 1}))
    prompt = _ids(DEEP, 6, seed=3)
    want = decoding.generate(target, prompt, 20, temperature=0)
    numpy = {"temperature": 0, "executor": "numpy"}
    assert torch.equal(decoding.generate(target, prompt, 20, **numpy), want)
    for k in (1, 3):
        got, _ = decoding.speculative_generate(target, draft, prompt, 20, k=k, **numpy)
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="executor must be 'torch' or 'numpy'"):
        decoding.generate(target, prompt, 20, executor="host")


def test_the_numpy_step_needs_a_dtype_numpy_has():
    model = _model(DEEP, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"CPU model of dtype float32 or float64.*bfloat16"):
        lean_step(model, numpy=True)


def test_a_draft_numpy_cannot_run_takes_the_lean_step():
    # The folded step runs in NumPy only: a bfloat16 one-layer draft gets the lean step.
    model = _model(ONE, dtype=torch.bfloat16)
    assert draft_step(model) is lean_step(model)
    with pytest.raises(ValueError, match=r"FoldedStep runs in NumPy.*bfloat16"):
        FoldedStep(model)


@pytest.mark.parametrize("std", [0.3, 3.0])  # 3.0: scores past the bound, the max kept
@torch.inference_mode()
def test_numpy_folded_step_matches_decode_hidden(std):
    model = _model(ONE, std=std)
    folded = draft_step(model)
    assert isinstance(folded.np_step, NumpyFolded)
    assert folded.np_step.bounded == (std == 0.3)
    x = _ids(ONE, 30, seed=1)
    cache, ref = folded.new_cache(), model.new_cache(1)
    folded.feed(x[:6], cache)
    model(x[None, :6], ref)
    out, out_t = np.empty(ONE.vocab_size, np.float32), torch.empty(1, ONE.vocab_size)
    host = folded.np_step
    rolled = False
    while cache.length < 20:
        at = cache.length
        if at == 12 and not rolled:  # a rollback, then a one-token feed (a catch-up)
            rolled = True
            for c in (cache, ref):
                c.crop(9)
            folded.feed(x[9:10], cache)
            model(x[None, 9:10], ref)
            at = 10
        if at % 2:  # the step's own entry (a tensor token, a [1, V] tensor out) and its host's
            folded.step(x[at : at + 1], cache, out_t)
        else:
            host.step(int(x[at]), cache, out)
            out_t[0] = torch.from_numpy(out)
        want = _reference(model, x[at : at + 1], ref)[0]
        tol = ATOL * (1 if std < 1 else 50)  # large weights, large logits
        torch.testing.assert_close(out_t[0], want, atol=tol, rtol=0)
    assert cache.length == ref.length
    assert decoding.caches_consistent(model, cache, x, atol=1e-4 if std > 1 else 1e-5)


@pytest.mark.parametrize("opts", [(1.0, None, None), (0.7, 5, 0.9)])
@torch.inference_mode()
def test_the_numpy_draft_reports_the_softmax_of_the_logits_it_sampled_from(opts):
    # The proposer's q is computed in NumPy: it must be softmax(processed logits), row by
    # row, where the drafts were drawn by Gumbel-max over those same logits.
    model = _model(ONE)
    prop = ModelProposer(model)
    ids = _ids(ONE, 8, seed=2)
    smp = SamplingOptions(*opts)
    prop.start(ids, 8, smp, torch.Generator().manual_seed(0), 20, 4)
    assert prop._host is not None
    out = torch.empty(4, dtype=torch.long)
    kk, q = prop.propose(ids, 8, 4, out)
    assert kk == 4
    torch.testing.assert_close(q, prop.logits[:4].softmax(-1), atol=1e-6, rtol=0)
    assert torch.all(q.gather(1, out[:, None]) > 0)  # every draft has mass under its q
    # The logits are the model's own, processed: row j scores the text plus drafts < j.
    ctx = torch.cat([ids, out])
    full = model(ctx[None])[0, 7:11]
    torch.testing.assert_close(prop.logits[:4], smp.logits(full), atol=1e-4, rtol=0)
