"""The lean batch-1 step, the noise blocks and the native-kernel switch of the decoding loops."""

import numpy as np
import pytest
import torch

from specdec_course.devices import native_cpu_kernels, with_native_cpu_kernels
from specdec_course.fast import LeanStep, lean_step, rebuild
from specdec_course.model import CharGPT, GPTConfig
from specdec_course.sampling import NoiseBlocks

ATOL = 2e-5  # float32; the step sums in another order than decode_hidden

CONFIGS = {
    "two layers": GPTConfig(vocab_size=11, block_size=32, n_layer=2, n_head=2, n_embd=16),
    "one layer": GPTConfig(vocab_size=13, block_size=40, n_layer=1, n_head=4, n_embd=24),
}


@pytest.fixture(params=list(CONFIGS))
def model(request):
    torch.manual_seed(0)
    m = CharGPT(CONFIGS[request.param]).eval()
    for p in m.parameters():  # biases away from 0, so that a dropped bias shows
        torch.nn.init.normal_(p, std=0.3)
    return m


def _ids(model, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(model.config.vocab_size, (n,), generator=g)


@torch.inference_mode()
def test_step_matches_decode_hidden_for_every_size_and_after_rollback(model):
    x = _ids(model, 30)
    lean, ref = model.new_cache(1), model.new_cache(1)
    model(x[None, :8], lean)
    model(x[None, :8], ref)
    step = lean_step(model)
    out = torch.empty(9, model.config.vocab_size)
    for T, crop in ((1, None), (4, None), (9, None), (2, 15), (1, None), (5, 12)):
        if crop is not None:  # rollback: positions past the length are stale and overwritten
            lean.crop(crop)
            ref.crop(crop)
        at = lean.length
        step.step(x[at : at + T], lean, out[:T])
        want = torch.nn.functional.linear(
            model.decode_hidden(x[None, at : at + T], ref)[0], model.lm_head.weight
        )
        assert lean.length == ref.length == at + T
        torch.testing.assert_close(out[:T], want, atol=ATOL, rtol=0)
        L = lean.length
        torch.testing.assert_close(lean.k[..., :L, :], ref.k[..., :L, :], atol=ATOL, rtol=0)
        torch.testing.assert_close(lean.v[..., :L, :], ref.v[..., :L, :], atol=ATOL, rtol=0)


@torch.inference_mode()
def test_feed_extends_the_cache_as_a_step_does(model):
    # A one-layer model's feed writes keys and values from the table alone; deeper models
    # run the step without logits. Either way the cache is the one a forward builds.
    x = _ids(model, 25, seed=3)
    fed, ref = model.new_cache(1), model.new_cache(1)
    step = lean_step(model)
    step.feed(x[:20], fed)  # a prefill
    step.feed(x[20:21], fed)  # a catch-up token
    model(x[None, :21], ref)
    assert fed.length == 21
    torch.testing.assert_close(fed.k[..., :21, :], ref.k[..., :21, :], atol=ATOL, rtol=0)
    torch.testing.assert_close(fed.v[..., :21, :], ref.v[..., :21, :], atol=ATOL, rtol=0)


def test_lean_step_is_rebuilt_when_the_weights_change(model):
    # Kept beside the model (fast.derived), stamped with the weights' versions: any write to
    # them (load_state_dict's copies, an optimizer's in-place step) builds it again, and the
    # model itself holds nothing derived (copies and pickles carry weights only).
    first = lean_step(model)
    assert lean_step(model) is first  # kept between calls
    model.train(False)  # no weight changes: still the same step
    assert lean_step(model) is first
    model.load_state_dict(model.state_dict())
    second = lean_step(model)
    assert second is not first
    x = _ids(model, 3)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # as an optimizer writes: in place
    third = lean_step(model)
    assert third is not second
    cache, out = third.new_cache(), torch.empty(3, model.config.vocab_size)
    with torch.inference_mode():
        third.step(x, cache, out)
        torch.testing.assert_close(out, model(x[None])[0], atol=ATOL, rtol=0)  # new weights
    rebuild(model)
    assert lean_step(model) is not third
    assert isinstance(lean_step(model), LeanStep)
    assert not {k for k in vars(model) if k.startswith("_") and "lean" in k}
    with torch.no_grad():
        model.lm_head.weight.mul_(0.5)


def test_noise_blocks_hand_out_each_row_once_in_blocks():
    g = torch.Generator().manual_seed(0)
    blocks = NoiseBlocks(7, 50, block=16, generator=g)
    rows = [blocks.take(3) for _ in range(10)] + [blocks.take(16)]
    assert blocks.drawn <= 50
    flat = torch.cat(rows)
    assert flat.shape == (46, 7) and bool((flat > 0).all())
    assert len({tuple(r.tolist()) for r in flat}) == 46  # no row handed out twice
    with pytest.raises(ValueError, match="noise rows"):
        blocks.take(10)  # past the limit of 50 rows


def test_noise_blocks_gumbel_and_host_views():
    e = NoiseBlocks(5, 8, block=8, generator=torch.Generator().manual_seed(1)).take(8)
    blocks = NoiseBlocks(5, 8, block=8, generator=torch.Generator().manual_seed(1), gumbel=True)
    torch.testing.assert_close(blocks.take(8), -e.log())
    host = NoiseBlocks(5, 8, block=8, generator=torch.Generator().manual_seed(1), host=True)
    rows = host.take(8)
    assert isinstance(rows, np.ndarray) and np.array_equal(rows, e.numpy())


def test_native_cpu_kernels_restores_the_flag():
    before = torch.backends.mkldnn.enabled
    with native_cpu_kernels():
        assert torch.backends.mkldnn.enabled is False
        with native_cpu_kernels():
            pass
        assert torch.backends.mkldnn.enabled is False
    assert torch.backends.mkldnn.enabled == before

    @with_native_cpu_kernels
    def fails():
        raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        fails()
    assert torch.backends.mkldnn.enabled == before


@torch.inference_mode()
def test_hidden_with_positions_and_bias_matches_decode_hidden(model):
    # A Medusa tree pass: nodes at position L + depth, each seeing the prefix and its ancestors.
    x = _ids(model, 16, seed=5)
    lean, ref = model.new_cache(1), model.new_cache(1)
    model(x[None, :10], lean)
    model(x[None, :10], ref)
    depth = torch.tensor([0, 1, 1, 2, 2])
    parents = [-1, 0, 0, 1, 2]
    allowed = torch.zeros(5, 5, dtype=torch.bool)
    for i in range(5):
        j = i
        while j >= 0:
            allowed[i, j] = True
            j = parents[j]
    bias = torch.zeros(5, 15).masked_fill(
        ~torch.cat([torch.ones(5, 10, dtype=torch.bool), allowed], 1), float("-inf")
    )
    got = lean_step(model).hidden(x[10:15], lean, depth + 10, bias)
    want = model.decode_hidden(x[None, 10:15], ref, depth + 10, bias)[0]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert lean.length == ref.length == 15
