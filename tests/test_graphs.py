"""CUDA-graph decoding, the part a CPU can check: the static step and the loops around it.

A graph replays the static step of ``fast.graphs``; the step itself runs on any device.
Here it runs eagerly on the CPU (the check that refuses graphs off a GPU is switched off for
these tests): its logits match the eager step's up to rounding, and the decoding loops driven
by it give the eager loops' tokens. ``test_gpu.py`` checks the captured graphs on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from specdec_course.decoding import generate, speculative_generate
from specdec_course.drafts import model_draft
from specdec_course.drafts.ngram import NgramDraft
from specdec_course.fast import derived, graphs, steps_for
from specdec_course.model import load_pretrained

PROMPT = torch.tensor([18, 47, 56, 57, 58, 1, 15, 47, 58, 47, 64, 43, 52, 10, 0])


@pytest.fixture(scope="module")
def pair():
    return load_pretrained("target"), load_pretrained("draft")


@pytest.fixture
def static_on_cpu(monkeypatch):
    """Let ``cuda_graphs=True`` through on the CPU: the loops then run the static steps
    eagerly (``StaticSteps(capture=False)``), which is all of the graph path but the capture."""
    monkeypatch.setattr(graphs, "check_cuda_graphs", lambda dev: None)
    monkeypatch.setattr(model_draft, "check_cuda_graphs", lambda dev: None)


def test_cuda_graphs_off_a_gpu_is_a_clear_error(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="cuda_graphs=True needs the models on a CUDA GPU"):
        generate(target, PROMPT, 5, cuda_graphs=True)
    with pytest.raises(ValueError, match="cuda_graphs=True needs the models on a CUDA GPU"):
        speculative_generate(target, draft, PROMPT, 5, cuda_graphs=True)
    with pytest.raises(ValueError, match="needs the models on a CUDA GPU"):
        graphs.StaticSteps(target, 2, capture=True)


@torch.inference_mode()
def test_static_step_matches_the_eager_step_after_rollback(pair):
    target, _ = pair
    static, eager = graphs.StaticSteps(target, 5, capture=False), graphs.EagerSteps(target)
    ids = torch.randint(65, (40,), generator=torch.Generator().manual_seed(0))
    for steps in (static, eager):
        target(ids[None, :20], steps.cache)
    worst = 0.0
    # Several sizes, then a rollback: stale keys past the length must be masked, not used.
    for T, crop in ((5, None), (1, None), (3, 23), (5, 24), (2, None)):
        if crop is not None:
            static.cache.crop(crop)
            eager.cache.crop(crop)
        at = static.cache.length
        a, b = static(ids[None, at : at + T]), eager(ids[None, at : at + T])
        assert static.cache.length == eager.cache.length == at + T
        worst = max(worst, (a - b).abs().max().item())
    assert worst < 1e-4, worst  # rounding only: attention runs over masked padding


def test_static_steps_hold_one_step_per_size(pair):
    target, _ = pair
    steps = graphs.StaticSteps(target, 3, capture=False)
    assert sorted(steps.inputs) == [1, 2, 3]
    steps.ensure(5)
    assert sorted(steps.inputs) == [1, 2, 3, 4, 5]
    assert steps.cache.capacity == target.config.block_size


def test_graph_path_gives_the_eager_tokens_greedy_and_sampled(pair, static_on_cpu):
    target, draft = pair
    for temperature in (0.0, 1.0):
        kw = {"temperature": temperature}

        def gen(seed=5):
            return torch.Generator().manual_seed(seed)

        ref = generate(target, PROMPT, 60, generator=gen(), **kw)
        assert torch.equal(
            generate(target, PROMPT, 60, generator=gen(), cuda_graphs=True, **kw), ref
        )
        for k in (1, 4):
            eager, st_e = speculative_generate(
                target, draft, PROMPT, 60, k=k, generator=gen(), **kw
            )
            static, st_s = speculative_generate(
                target, draft, PROMPT, 60, k=k, generator=gen(), cuda_graphs=True, **kw
            )
            assert torch.equal(static, eager), (temperature, k)
            assert st_s.accepted_per_iteration == st_e.accepted_per_iteration
    # The n-gram draft has no model: only the target's steps are static.
    ng = NgramDraft(order=3)
    eager, _ = speculative_generate(target, ng, PROMPT, 60, k=4, temperature=0)
    static, _ = speculative_generate(target, ng, PROMPT, 60, k=4, temperature=0, cuda_graphs=True)
    assert torch.equal(static, eager)


def test_a_model_as_its_own_draft_gets_two_static_caches(pair, static_on_cpu):
    target, _ = pair
    ref = generate(target, PROMPT, 40, temperature=0)
    out, st = speculative_generate(target, target, PROMPT, 40, k=3, temperature=0, cuda_graphs=True)
    assert torch.equal(out, ref) and st.acceptance_rate == 1.0
    kept = derived._BUILT[target][2]  # beside the model, per role
    assert {"graphs:target", "graphs:draft"} <= set(kept)
    assert kept["graphs:target"].cache is not kept["graphs:draft"].cache
    with torch.no_grad():
        target.lm_head.weight.add_(0.0)  # any in-place write: the steps are captured again
    assert steps_for(target, "target", 4, True) is not kept["graphs:target"]
