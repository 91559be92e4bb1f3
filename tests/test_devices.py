"""Device plumbing, on the CPU: explicit devices work, mismatched devices get one clear error.

A second real device is not needed to test the errors: PyTorch's ``meta`` device holds
tensors without data, so a model moved there disagrees with CPU tensors before anything is
computed. What only a GPU can show (the same tokens on CUDA) is in ``test_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

import specdec_course
from specdec_course import devices, sampling
from specdec_course.decoding import generate, speculative_generate
from specdec_course.drafts.ngram import NgramDraft
from specdec_course.medusa import load_heads, medusa_generate
from specdec_course.model import load_pretrained

PROMPT = torch.tensor([18, 47, 56, 57, 58, 1, 15, 47, 58, 47, 64, 43, 52, 10, 0])


@pytest.fixture(scope="module")
def pair():
    return load_pretrained("target", device="cpu"), load_pretrained("draft", device="cpu")


def test_device_picks_cuda_only_when_there_is_one():
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert devices.device().type == want == specdec_course.device().type
    assert devices.device("auto").type == want
    assert devices.device("cpu") == torch.device("cpu")


def test_unknown_or_absent_devices_are_a_clear_value_error():
    with pytest.raises(ValueError, match="device must be"):
        devices.device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no(ne)? .*CUDA GPU|has none"):
            load_pretrained("target", device="cuda")
        with pytest.raises(ValueError, match="CUDA GPU"):
            NgramDraft(device="cuda")


def test_explicit_cpu_device_gives_the_default_models_tokens(pair):
    target, draft = pair
    assert target.lm_head.weight.device.type == "cpu"
    default = load_pretrained("target")
    ref = generate(default, PROMPT, 40, temperature=0)
    assert torch.equal(generate(target, PROMPT, 40, temperature=0), ref)
    out, _ = speculative_generate(target, draft, PROMPT, 40, k=3, temperature=0)
    assert torch.equal(out, ref) and out.device.type == "cpu"
    g = NgramDraft(device="cpu")
    assert g.device == torch.device("cpu") and g.q_table.device.type == "cpu"
    out, _ = speculative_generate(target, g, PROMPT, 40, k=3, temperature=0)
    assert torch.equal(out, ref)


def test_a_model_on_another_device_than_its_input_is_refused(pair):
    target, _ = pair
    ghost = load_pretrained("target").to("meta")
    with pytest.raises(
        ValueError, match=r"idx and the model are on different devices \(cpu and meta\)"
    ):
        ghost(PROMPT[None])
    with pytest.raises(
        ValueError, match=r"the cache and the model are on different devices \(cpu and meta\)"
    ):
        ghost(PROMPT[None].to("meta"), target.new_cache(1))


def test_target_and_draft_on_two_devices_are_refused(pair):
    target, _ = pair
    ghost_draft = load_pretrained("draft").to("meta")
    with pytest.raises(
        ValueError, match=r"the draft and the target are on different devices \(meta and cpu\)"
    ):
        speculative_generate(target, ghost_draft, PROMPT, 10)
    ghost_ngram = NgramDraft(order=2)
    ghost_ngram.device = torch.device("meta")  # as if counted for another device
    with pytest.raises(
        ValueError, match=r"the draft and the target are on different devices \(meta and cpu\)"
    ):
        speculative_generate(target, ghost_ngram, PROMPT, 10)


def test_medusa_heads_on_another_device_than_the_target_are_refused(pair):
    target, _ = pair
    heads = load_heads(target=target)
    out, _ = medusa_generate(target, heads, PROMPT, 20, temperature=0)
    assert torch.equal(out, generate(target, PROMPT, 20, temperature=0))
    with pytest.raises(
        ValueError, match=r"the heads and the model are on different devices \(meta and cpu\)"
    ):
        medusa_generate(target, load_heads(target=target).to("meta"), PROMPT, 5)


def test_random_numbers_come_from_the_generators_device_whatever_the_output_device():
    # A CPU generator with another output device: the numbers are drawn on the CPU and
    # moved, so a seed gives the same numbers for a model on any device.
    g = torch.Generator().manual_seed(3)
    moved = sampling.exp_noise((4, 7), generator=g, device="meta")
    assert moved.device.type == "meta" and moved.shape == (4, 7)
    a = sampling.exp_noise((4, 7), generator=torch.Generator().manual_seed(3))
    b = sampling.exp_noise((4, 7), generator=torch.Generator().manual_seed(3), device="cpu")
    assert torch.equal(a, b)
    u = sampling.uniform_open_closed((5,), generator=torch.Generator().manual_seed(1))
    assert u.dtype == torch.float64 and ((u > 0) & (u <= 1)).all()


def test_synced_clock_is_the_plain_clock_on_a_cpu():
    import time

    assert devices.clock("cpu") is time.perf_counter
    devices.synchronize("cpu")  # nothing to wait for


def test_set_threads_sets_numpys_blas_threads_with_torchs():
    # The NumPy draft steps call NumPy's BLAS, whose pool ignores torch.set_num_threads: on a
    # busy machine its extra threads wait for cores (devices' docstring has the measurement).
    from threadpoolctl import threadpool_info

    from specdec_course.devices import set_threads

    before = torch.get_num_threads()
    try:
        set_threads(1)
        assert torch.get_num_threads() == 1
        blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
        assert blas and all(p["num_threads"] == 1 for p in blas)
    finally:
        set_threads(before)


def test_one_reader_of_the_cpu_serves_the_name_the_kernel_record_and_the_bf16_check(monkeypatch):
    from specdec_course import devices
    from specdec_course.llm import kernels, packed

    name, flags = devices.cpu_info()
    assert name and devices.cpu_name() == name and kernels._cpu()[0] == name
    assert packed.native_bf16() == bool({"avx512_bf16", "amx_bf16", "bf16"} & set(flags.split()))

    def unreadable(*args, **kwargs):
        raise OSError("no /proc here")

    monkeypatch.setattr("builtins.open", unreadable)
    name, flags = devices.cpu_info.__wrapped__()  # uncached: what a machine without /proc gets
    assert name and flags == ""


def test_a_live_timing_is_labelled_with_the_cpu_its_threads_and_the_clock():
    from specdec_course import devices, token_view

    label = devices.machine_label()
    assert label.startswith(devices.cpu_name())
    assert f"{torch.get_num_threads()} thread(s)" in label and label.endswith("wall clock")
    assert token_view.machine_label is devices.machine_label  # one label for every lesson
