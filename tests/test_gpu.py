"""What only a CUDA GPU can show; every test here is marked ``gpu`` and skipped without one.

``tools/gpu_check.sh`` runs them (``pytest -m gpu``) before the GPU benchmarks:

- the native kernels (compiled for this GPU, the vocabulary race split over programs for
  small batches) give the PyTorch reference's tokens on the same inputs, up to V = 128256;
- on the GPU every output position follows its target distribution (chi-square per
  position, false-failure rate below 1e-7 each, as ``test_verifier`` states);
- decoding with CUDA graphs gives the eager loops' tokens, and a replayed graph gives its
  static step's logits bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from helpers import make_position_batch, position_chi_squares

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = torch.device("cuda")
PROMPT = torch.tensor([18, 47, 56, 57, 58, 1, 15, 47, 58, 47, 64, 43, 52, 10, 0])


@pytest.fixture(scope="module")
def pair():
    from specdec_course.model import load_pretrained

    return load_pretrained("target", device="cuda"), load_pretrained("draft", device="cuda")


@pytest.mark.parametrize("V", [65, 32000, 128256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_kernels_give_the_reference_tokens(V, dtype):
    from specdec_course.bench.verifier_sweep import _make_inputs
    from specdec_course.kernels import launch, launch_config
    from specdec_course.verifier import rejection_sample_prepared

    for B, K in ((1, 4), (8, 1), (64, 4), (128, 8)):
        ins = _make_inputs(B, K, V, "cuda", seed=B + K)
        if dtype != torch.float32:
            ins = ins._replace(
                draft_probs=ins.draft_probs.to(dtype), target_probs=ins.target_probs.to(dtype)
            )
        ref = rejection_sample_prepared(ins)
        br, bv, S = launch_config(B, V, CUDA)
        for splits in {S, 1}:  # as configured, and the race unsplit
            got = launch(ins, block_rows=br, block_vocab=bv, splits=splits)
            assert torch.equal(got.num_accepted, ref.num_accepted), (B, K, V, splits)
            assert torch.equal(got.token_ids, ref.token_ids), (B, K, V, splits)


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot-drafts"])
def test_gpu_output_positions_follow_their_target_distributions(one_hot):
    from specdec_course.kernels import rejection_sample_triton

    B = 200_000
    drafts, q, target, p = make_position_batch(B, one_hot=one_hot, seed=4)
    out = rejection_sample_triton(
        drafts.to(CUDA),
        None if q is None else q.to(CUDA),
        target.to(CUDA),
        generator=torch.Generator(device=CUDA).manual_seed(4),
    )
    for j, r in enumerate(
        position_chi_squares(out.token_ids.cpu(), out.num_accepted.cpu(), p, min_samples=2000)
    ):
        assert r.false_failure_rate < 1e-7
        assert r.passed, f"position {j}: {r}"


@torch.inference_mode()
def test_a_replayed_graph_gives_its_static_step_bit_for_bit(pair):
    from specdec_course.fast import graphs

    target, _ = pair
    graphed = graphs.StaticSteps(target, 4, capture=True)
    plain = graphs.StaticSteps(target, 4, capture=False)
    ids = torch.randint(65, (30,), generator=torch.Generator().manual_seed(0)).to(CUDA)
    for steps in (graphed, plain):
        target(ids[None, :20], steps.cache)
    for T in (4, 1, 3):
        at = graphed.cache.length
        a = graphed(ids[None, at : at + T]).clone()
        b = plain(ids[None, at : at + T])
        assert torch.equal(a, b), T
    graphed.cache.crop(21)
    plain.cache.crop(21)
    assert torch.equal(graphed(ids[None, 21:23]).clone(), plain(ids[None, 21:23]))


def test_cuda_graph_decoding_gives_the_eager_tokens(pair):
    from specdec_course.decoding import generate, speculative_generate
    from specdec_course.drafts.ngram import NgramDraft

    target, draft = pair
    prompt = PROMPT.to(CUDA)
    ngram = NgramDraft(order=3, device="cuda")
    for temperature in (0.0, 1.0):

        def gen(seed=5):
            return torch.Generator().manual_seed(seed)

        kw = {"temperature": temperature}
        ref = generate(target, prompt, 120, generator=gen(), **kw)
        assert ref.device.type == "cuda"
        assert torch.equal(
            generate(target, prompt, 120, generator=gen(), cuda_graphs=True, **kw), ref
        )
        for d in (draft, ngram):
            for k in (1, 3, 6):
                eager, st_e = speculative_generate(
                    target, d, prompt, 120, k=k, generator=gen(), **kw
                )
                graphed, st_g = speculative_generate(
                    target, d, prompt, 120, k=k, generator=gen(), cuda_graphs=True, **kw
                )
                assert torch.equal(graphed, eager), (temperature, k, type(d).__name__)
                assert st_g.accepted_per_iteration == st_e.accepted_per_iteration
        if temperature == 0.0:  # greedy speculative decoding is plain greedy decoding
            assert torch.equal(eager, ref)


def test_medusa_runs_on_the_gpu(pair):
    from specdec_course.decoding import generate
    from specdec_course.medusa import load_heads, medusa_generate

    target, _ = pair
    heads = load_heads(target=target)
    out, st = medusa_generate(target, heads, PROMPT.to(CUDA), 60, temperature=0)
    assert out.device.type == "cuda" and st.iterations > 0
    assert torch.equal(out, generate(target, PROMPT.to(CUDA), 60, temperature=0))
