"""CharGPT and its KVCache: cached decoding equals the full forward, rollback, presets, files."""

import pytest
import torch

from specdec_course.model import (
    DRAFT,
    TARGET,
    CharGPT,
    GPTConfig,
    KVCache,
    load_checkpoint,
    load_pretrained,
    save_checkpoint,
)

SMALL = GPTConfig(vocab_size=11, block_size=32, n_layer=2, n_head=2, n_embd=16)
ATOL = 1e-5  # float32: cached and full attention sum in different orders


@pytest.fixture
def model():
    torch.manual_seed(0)
    return CharGPT(SMALL).eval()


def ids(B, T, seed=1):
    return torch.randint(0, SMALL.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def run_in_chunks(model, x, sizes):
    cache = model.new_cache(x.shape[0])
    outs, start = [], 0
    for n in sizes:
        outs.append(model(x[:, start : start + n], cache))
        start += n
    assert cache.length == start
    return torch.cat(outs, dim=1), cache


def test_target_preset_has_388k_parameters_within_10_percent():
    n = CharGPT(TARGET).num_parameters()
    assert 0.9 * 388_000 <= n <= 1.1 * 388_000, n


def test_draft_preset_has_108k_parameters_within_10_percent():
    n = CharGPT(DRAFT).num_parameters()
    assert 0.9 * 108_000 <= n <= 1.1 * 108_000, n


def test_presets_share_vocabulary_and_a_256_character_context():
    assert TARGET.vocab_size == DRAFT.vocab_size <= 70
    assert TARGET.block_size == DRAFT.block_size == 256
    assert (TARGET.n_layer, DRAFT.n_layer) == (4, 1)


def test_output_layer_is_tied_to_token_embedding(model):
    assert model.lm_head.weight is model.transformer.wte.weight


@pytest.mark.parametrize(
    "sizes",
    [[1] * 20, [5, 5, 5, 5], [7, 1, 3, 1, 1, 6, 1], [20]],
    ids=["one-at-a-time", "chunks-of-5", "mixed", "all-at-once"],
)
def test_cached_decoding_matches_full_forward(model, sizes):
    x = ids(2, sum(sizes))
    full = model(x)
    cached, _ = run_in_chunks(model, x, sizes)
    torch.testing.assert_close(cached, full, atol=ATOL, rtol=0)


def test_cached_decoding_follows_weights_loaded_after_a_cached_call(model):
    x = ids(1, 6)
    model(x, model.new_cache())  # the cached path has now seen the old weights
    torch.manual_seed(1)
    other = CharGPT(SMALL).eval()
    model.load_state_dict(other.state_dict(), assign=True)  # new parameter tensors
    cached, _ = run_in_chunks(model, x, [2, 1, 3])
    torch.testing.assert_close(cached, other(x), atol=ATOL, rtol=0)


def test_cache_fills_the_whole_context(model):
    x = ids(1, SMALL.block_size)
    cached, cache = run_in_chunks(model, x, [SMALL.block_size - 3, 1, 2])
    torch.testing.assert_close(cached, model(x), atol=ATOL, rtol=0)
    assert cache.length == cache.capacity


@pytest.mark.parametrize("n", [0, 1, 9, 17])
def test_after_crop_next_step_equals_fresh_run_on_prefix(model, n):
    x = ids(2, 18)
    y = ids(2, 3, seed=2)  # a different continuation after the rollback
    _, cache = run_in_chunks(model, x, [4, 1, 13])
    cache.crop(n)
    assert cache.length == n
    after = model(y, cache)
    fresh = model(torch.cat([x[:, :n], y], dim=1))[:, n:]
    torch.testing.assert_close(after, fresh, atol=ATOL, rtol=0)


def test_crop_moves_the_pointer_without_copying(model):
    x = ids(1, 10)
    _, cache = run_in_chunks(model, x, [10])
    k_ptr, v_ptr = cache.k.data_ptr(), cache.v.data_ptr()
    kept = cache.k[:, :, :, :4].clone()
    cache.crop(4)
    model(ids(1, 2, seed=3), cache)
    assert (cache.k.data_ptr(), cache.v.data_ptr()) == (k_ptr, v_ptr)
    assert torch.equal(cache.k[:, :, :, :4], kept)


def test_cache_buffers_are_preallocated_per_layer(model):
    cache = KVCache(SMALL, batch_size=3)
    shape = (SMALL.n_layer, 3, SMALL.n_head, SMALL.block_size, SMALL.head_dim)
    assert cache.k.shape == cache.v.shape == shape
    assert cache.length == 0


@pytest.mark.parametrize("bad", [-1, 6, 2.0, True])
def test_crop_outside_filled_length_raises(model, bad):
    _, cache = run_in_chunks(model, ids(1, 5), [5])
    with pytest.raises(ValueError, match="crop"):
        cache.crop(bad)


def test_forward_past_block_size_raises(model):
    with pytest.raises(ValueError, match="block_size"):
        model(ids(1, SMALL.block_size + 1))
    _, cache = run_in_chunks(model, ids(1, SMALL.block_size - 1), [SMALL.block_size - 1])
    with pytest.raises(ValueError, match="block_size"):
        model(ids(1, 2), cache)
    assert cache.length == SMALL.block_size - 1  # a refused call leaves the cache as it was


def test_generate_past_block_size_raises(model):
    with pytest.raises(ValueError, match="block_size"):
        model.generate(ids(1, 10), SMALL.block_size - 9)


def test_greedy_generate_follows_argmax_of_full_forward(model):
    out = model.generate(ids(1, 4), 12, temperature=0)
    for t in range(4, out.shape[1]):
        assert out[0, t] == model(out[:, :t])[0, -1].argmax()


def test_sampled_generate_is_reproducible_with_a_generator(model):
    a = model.generate(ids(1, 4), 10, generator=torch.Generator().manual_seed(5))
    b = model.generate(ids(1, 4), 10, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.zeros(1, 3), "int64"),
        (torch.zeros(3, dtype=torch.long), r"\[B, T\]"),
        (torch.full((1, 3), 11), "outside"),
        (torch.full((1, 3), -1), "outside"),
    ],
)
def test_bad_token_ids_raise_clear_errors(model, bad, match):
    with pytest.raises(ValueError, match=match):
        model(bad)


def test_cache_of_other_batch_size_raises(model):
    with pytest.raises(ValueError, match="batch size"):
        model(ids(2, 3), model.new_cache(1))


def test_return_hidden_gives_the_state_before_lm_head(model):
    x = ids(2, 7)
    logits, h = model(x, return_hidden=True)
    assert h.shape == (2, 7, SMALL.n_embd)
    torch.testing.assert_close(model.lm_head(h), logits)
    torch.testing.assert_close(model.hidden_states(x), h)


def test_tree_mask_and_positions_match_separate_branches(model):
    # Two branches after a shared prefix: [a, b] and [c]. Put all three in one call with a
    # tree mask and explicit positions; each must equal its own causal chain.
    prefix, a, b, c = ids(1, 6), ids(1, 1, 4), ids(1, 1, 5), ids(1, 1, 6)
    cache = model.new_cache()
    model(prefix, cache)
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)
    mask = torch.cat([torch.ones(3, 6, dtype=torch.bool), mask], dim=1)
    tree = model(
        torch.cat([a, b, c], 1), cache, attn_mask=mask, position_ids=torch.tensor([6, 7, 6])
    )
    chain_ab = model(torch.cat([prefix, a, b], 1))[:, 6:]
    chain_c = model(torch.cat([prefix, c], 1))[:, 6:]
    torch.testing.assert_close(tree[:, :2], chain_ab, atol=ATOL, rtol=0)
    torch.testing.assert_close(tree[:, 2:], chain_c, atol=ATOL, rtol=0)


def test_attn_mask_of_wrong_shape_raises(model):
    cache = model.new_cache()
    model(ids(1, 4), cache)
    with pytest.raises(ValueError, match="attn_mask"):
        model(ids(1, 2), cache, attn_mask=torch.ones(2, 2, dtype=torch.bool))


def test_config_rejects_heads_that_do_not_divide_width():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=30, n_head=4)


def test_checkpoint_round_trip_keeps_weights_vocab_and_meta(model, tmp_path):
    path = save_checkpoint(tmp_path / "m.pt", model, "abcdefghijk", {"steps": 3, "val_loss": 1.5})
    loaded, ck = load_checkpoint(path)
    assert not loaded.training
    assert ck["vocab"] == "abcdefghijk" and ck["meta"] == {"steps": 3, "val_loss": 1.5}
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    x = ids(1, 9)
    assert torch.equal(loaded(x), model(x))


def test_missing_checkpoint_raises_with_rebuild_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="specdec-course train"):
        load_checkpoint(tmp_path / "nope.pt")


def test_corrupt_checkpoint_raises_with_rebuild_command(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="rebuild it with: specdec-course train"):
        load_checkpoint(bad)


def test_load_pretrained_missing_file_names_the_exact_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="specdec-course train --preset target"):
        load_pretrained("target")


def test_load_pretrained_rejects_unknown_names():
    with pytest.raises(ValueError, match="'target' or 'draft'"):
        load_pretrained("big")
