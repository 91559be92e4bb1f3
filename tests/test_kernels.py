"""The Triton verifier: identical tokens to the reference, exact distribution, GPU compile.

On a machine without CUDA every kernel here runs under the Triton interpreter, and
``test_every_kernel_compiles_for_an_sm90_gpu`` compiles them for an H100-class GPU all the
same, so code that only the interpreter accepts fails CI. The chi-square tests state their
false-failure rate in ``test_verifier``'s docstring (below 1e-7 per position).
"""

from __future__ import annotations

import pytest
import torch
from helpers import make_position_batch, one_hot_rows, position_chi_squares

from specdec_course.kernels import launch, launch_config, rejection_sample_triton
from specdec_course.verifier import prepare_inputs, rejection_sample

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def ragged_batch(B: int, K: int, V: int, *, seed: int, greedy_target: bool = False):
    """Random targets, anti-correlated draft distributions, drafts sampled from them, about a
    third of the rows cut short (including rows with no drafts)."""
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(B, K + 1, V, generator=g)
    p = torch.softmax(logits, -1)
    if greedy_target:
        p = torch.nn.functional.one_hot(logits.argmax(-1), V).float()
    q = torch.softmax(-logits[:, :K] + 0.5 * torch.randn(B, K, V, generator=g), -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, K)
    if greedy_target:
        # Half the drafts copy the target's argmax so that greedy rows run long too.
        copy = torch.rand(B, K, generator=g) < 0.5
        drafts = torch.where(copy, logits[:, :K].argmax(-1), drafts)
    n = torch.randint(0, K + 1, (B,), generator=g)
    cut = torch.rand(B, generator=g) < 0.35
    drafts[(torch.arange(K) >= n.unsqueeze(1)) & cut.unsqueeze(1)] = -1
    return drafts, q, p


def assert_same(ref, got):
    assert torch.equal(ref.num_accepted, got.num_accepted.cpu())
    diff = (ref.token_ids != got.token_ids.cpu()).nonzero()
    assert diff.numel() == 0, f"{len(diff)} tokens differ, first at (row, position) {diff[0]}"


# ------------------------------------------------------------------- identical tokens


@pytest.mark.parametrize("V", [16, 65, 1000, 8193])
@pytest.mark.parametrize("K", [1, 3, 5, 8])
@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft-probs", "one-hot"])
@pytest.mark.parametrize("greedy_target", [False, True], ids=["sampled-target", "greedy-target"])
def test_kernel_returns_the_reference_tokens(V, K, with_draft_probs, greedy_target):
    drafts, q, p = ragged_batch(24, K, V, seed=V * 10 + K, greedy_target=greedy_target)
    q = q if with_draft_probs else None
    g = torch.Generator().manual_seed(K)
    ref = rejection_sample(drafts, q, p, generator=g)
    got = rejection_sample_triton(
        *(t if t is None else t.to(DEVICE) for t in (drafts, q, p)),
        generator=torch.Generator().manual_seed(K),
    )
    assert_same(ref, got)
    # Not a vacuous comparison: some rows stop early and some get the bonus.
    assert (ref.num_accepted < (drafts >= 0).sum(1)).any()


@pytest.mark.parametrize("V", [65, 1000])
@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft-probs", "one-hot"])
def test_kernel_matches_reference_for_greedy_targets(V, with_draft_probs):
    drafts, q, p = ragged_batch(32, 4, V, seed=V, greedy_target=True)
    q = q if with_draft_probs else None
    ref = rejection_sample(drafts, q, p, generator=torch.Generator().manual_seed(0))
    got = rejection_sample_triton(drafts, q, p, generator=torch.Generator().manual_seed(0))
    assert_same(ref, got)
    # Greedy rows: every emitted token is the target's argmax at its position.
    argmax = p.argmax(-1)
    emitted = ref.token_ids >= 0
    assert torch.equal(ref.token_ids[emitted], argmax[emitted])
    assert ref.num_accepted.max() >= 2


@pytest.mark.parametrize("V, block_vocab", [(1000, 256), (8193, 1024), (65, 16)])
def test_tiled_vocabulary_gives_the_same_tokens(V, block_vocab):
    # Several tiles, the last one partly padding: the race must carry its winner across
    # tiles and never pick a padding column.
    drafts, q, p = ragged_batch(16, 3, V, seed=5)
    for qq in (q, None):
        ins = prepare_inputs(drafts, qq, p, generator=torch.Generator().manual_seed(3))
        ref = rejection_sample(drafts, qq, p, uniforms=ins.uniforms, exp_noise=ins.exp_noise)
        for block_rows in (1, 4):
            assert_same(ref, launch(ins, block_rows=block_rows, block_vocab=block_vocab))
        # The race split over chunks of the vocabulary (small batches on a GPU), combined
        # by race_combine_kernel: the same first maximum, so the same tokens.
        for splits in (2, 3, 64):
            assert_same(ref, launch(ins, block_rows=2, block_vocab=block_vocab, splits=splits))


def test_split_race_keeps_the_first_maximum_across_chunks():
    # Ties between chunks: p uniform and the noise constant give every column the same
    # score, so the winner must be column 0 (torch.argmax's first maximum), not a later
    # chunk's first column.
    B, K, V = 3, 1, 64
    p = torch.full((B, K + 1, V), 1.0 / V)
    ins = prepare_inputs(
        torch.tensor([[5], [7], [-1]]),
        None,
        p,
        uniforms=torch.ones(B, K, dtype=torch.float64),
        exp_noise=torch.ones(B, V),
    )
    ref = rejection_sample(*ins[:3], uniforms=ins.uniforms, exp_noise=ins.exp_noise)
    for splits in (1, 4, 8):
        assert_same(ref, launch(ins, block_rows=1, block_vocab=8, splits=splits))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_kernel_matches_reference_for_other_probability_dtypes(dtype):
    drafts, q, p = ragged_batch(16, 3, 65, seed=9)
    ref = rejection_sample(
        drafts, q.to(dtype), p.to(dtype), generator=torch.Generator().manual_seed(1)
    )
    got = rejection_sample_triton(
        drafts, q.to(dtype), p.to(dtype), generator=torch.Generator().manual_seed(1)
    )
    assert_same(ref, got)


def test_greedy_rows_pinned_exactly_through_the_kernel():
    target = torch.stack(
        [
            one_hot_rows(1, 2, 3, 5),
            one_hot_rows(1, 4, 3, 5),
            one_hot_rows(1, 2, 0, 5),
            one_hot_rows(4, 2, 3, 5),
        ]
    )
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, -1], [-1, -1, -1]])
    out = rejection_sample_triton(drafts, None, target, generator=torch.Generator().manual_seed(0))
    assert out.token_ids.tolist() == [[1, 2, 3, 5], [1, 4, -1, -1], [1, 2, 0, -1], [4, -1, -1, -1]]
    assert out.num_accepted.tolist() == [3, 1, 2, 0]


def test_no_drafts_and_empty_batch():
    target = torch.stack([one_hot_rows(3), one_hot_rows(1)])
    out = rejection_sample_triton(torch.empty(2, 0, dtype=torch.int64), None, target)
    assert out.token_ids.tolist() == [[3], [1]]
    out = rejection_sample_triton(torch.empty(0, 2, dtype=torch.int64), None, torch.empty(0, 3, 5))
    assert out.token_ids.shape == (0, 3)


# ------------------------------------------------------------------------- boundaries


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["draft-probs", "one-hot"])
def test_ids_stay_in_range_when_the_last_tile_has_zero_probability(with_draft_probs):
    # V = 20 in tiles of 8: the last tile holds ids 16..19 (probability 0) and 4 padding
    # columns. Every score there is 0 or masked; the winner must be a real, possible id.
    B, K, V = 64, 2, 20
    drafts, q, p = ragged_batch(B, K, V, seed=11)
    p[..., 16:] = 0
    p /= p.sum(-1, keepdim=True)
    q = q if with_draft_probs else None
    ins = prepare_inputs(drafts.clamp_max(15), q, p, generator=torch.Generator().manual_seed(0))
    out = launch(ins, block_rows=4, block_vocab=8)
    ref = rejection_sample(*ins[:3], uniforms=ins.uniforms, exp_noise=ins.exp_noise)
    assert_same(ref, out)
    emitted = out.token_ids[out.token_ids >= 0]
    assert ((emitted >= 0) & (emitted < 16)).all()


def test_zero_residual_and_p_equal_q_keep_ids_in_range():
    V = 20
    p = torch.zeros(3, 2, V)
    p[:, :, :4] = 0.25
    # Row 0: q = p except q(2) a hair larger (within rounding): u = 1 rejects draft 2 and the
    # residual is all zero, so the token comes from p. Rows 1, 2: q == p, accepted.
    q = p[:, :1].clone()
    q[0, 0, 2] += 1e-6
    ins = prepare_inputs(
        torch.tensor([[2], [2], [1]]),
        q,
        p,
        uniforms=torch.ones(3, 1, dtype=torch.float64),
        exp_noise=torch.rand(3, V, generator=torch.Generator().manual_seed(0)) + 0.5,
    )
    ref = rejection_sample(*ins[:3], uniforms=ins.uniforms, exp_noise=ins.exp_noise)
    out = launch(ins, block_rows=2, block_vocab=8)
    assert_same(ref, out)
    assert out.num_accepted.tolist() == [0, 1, 1]
    emitted = out.token_ids[out.token_ids >= 0]
    assert ((emitted >= 0) & (emitted < 4)).all()


def test_kernel_rejects_nan_like_the_reference():
    drafts, q, p = ragged_batch(4, 2, 16, seed=0)
    p[1, 1, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        rejection_sample_triton(drafts, q, p)


def test_launch_rejects_block_sizes_that_are_not_powers_of_two():
    drafts, q, p = ragged_batch(4, 2, 16, seed=0)
    with pytest.raises(ValueError, match="block_vocab"):
        launch(prepare_inputs(drafts, q, p), block_rows=1, block_vocab=12)
    with pytest.raises(ValueError, match="splits"):
        launch(prepare_inputs(drafts, q, p), block_rows=1, block_vocab=8, splits=0)


def test_interpreter_launch_config_keeps_programs_few():
    rows, vocab, splits = launch_config(100_000, 16, torch.device("cpu"))
    assert vocab == 16 and 100_000 / rows <= 100 and splits == 1


def test_gpu_launch_config_splits_small_batches_and_not_large_ones():
    # On a GPU (132 multiprocessors assumed without one): one row per program; a small
    # batch spreads each row over chunks until there are ~4 programs per multiprocessor,
    # a large one fills the GPU by itself.
    cuda = torch.device("cuda")
    for B in (1, 8, 32, 64, 128):
        for V in (65, 32000, 128256):
            rows, block, S = launch_config(B, V, cuda)
            assert rows == 1 and block & (block - 1) == 0 and block <= 4096
            assert 1 <= S <= -(-V // block)
            if V >= 32000 and B <= 8:
                assert S > 1
    assert launch_config(1, 128256, cuda)[2] * 1 >= 100
    assert launch_config(128, 128256, cuda)[2] <= 8
    assert launch_config(3, 65, cuda) == (1, 128, 1)


# --------------------------------------------------------------------------- seeds


def test_kernel_same_seed_same_output_different_seed_differs():
    drafts, q, p = ragged_batch(64, 4, 65, seed=2)
    a = rejection_sample_triton(drafts, q, p, generator=torch.Generator().manual_seed(7))
    b = rejection_sample_triton(drafts, q, p, generator=torch.Generator().manual_seed(7))
    c = rejection_sample_triton(drafts, q, p, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a.token_ids, b.token_ids)
    assert not torch.equal(a.token_ids, c.token_ids)


# -------------------------------------------------------------------- distribution


@pytest.mark.parametrize("one_hot", [False, True], ids=["draft-probs", "one-hot-drafts"])
def test_kernel_output_positions_follow_their_target_distributions(one_hot):
    # A seed different from test_verifier's: an independent sample, not a copy of its test.
    B = 100_000 if not one_hot else 200_000
    drafts, q, target, p = make_position_batch(B, one_hot=one_hot, seed=2)
    out = rejection_sample_triton(drafts, q, target, generator=torch.Generator().manual_seed(2))
    for j, r in enumerate(
        position_chi_squares(out.token_ids, out.num_accepted, p, min_samples=2000)
    ):
        assert r.false_failure_rate < 1e-7
        assert r.passed, f"position {j}: {r}"


# --------------------------------------------------------------------- GPU compile


def test_every_kernel_compiles_for_an_sm90_gpu():
    from specdec_course.kernels import compile_for_gpu
    from specdec_course.kernels.compile import KERNEL_VARIANTS

    compiled = compile_for_gpu(arch=90)
    assert len(compiled) == len(KERNEL_VARIANTS)
    for name, art in compiled.items():
        assert art["cubin_bytes"] > 0, name
        assert ".target sm_90" in art["ptx"], name
        if name.startswith("race_kernel"):
            # The race divides with IEEE rounding, as torch does, so tokens match on the GPU.
            assert "div.rn.f32" in art["ptx"], name


def test_kernels_interpret_even_after_torch_imported_triton():
    # An optimizer step makes torch import triton (interpreter off) before this package can
    # switch the interpreter on; the kernels must still run on CPU tensors.
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "m = torch.nn.Linear(2, 2); torch.optim.AdamW(m.parameters()).step()\n"
        "assert 'triton' in sys.modules or torch.cuda.is_available()\n"
        "from specdec_course.kernels import rejection_sample_triton\n"
        "from specdec_course.verifier import rejection_sample\n"
        "g = torch.Generator().manual_seed(0)\n"
        "p = torch.softmax(torch.randn(4, 3, 50, generator=g), -1)\n"
        "d = torch.randint(0, 50, (4, 2), generator=g)\n"
        "a = rejection_sample(d, None, p, generator=torch.Generator().manual_seed(1))\n"
        "b = rejection_sample_triton(d, None, p, generator=torch.Generator().manual_seed(1))\n"
        "assert torch.equal(a.token_ids, b.token_ids), (a, b)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


# ---------------------------------------------------------------------- benchmark


def test_benchmark_pipeline_writes_json_csv_and_plot(tmp_path):
    # The GPU sweep's bookkeeping, run on the CPU with a stand-in timer (1 ms each side):
    # tokens compared, bytes by the byte model, files written and read back.
    from specdec_course import bench

    cases, meta = bench.run_verifier_sweep(
        (1, 3), (2,), (64,), device="cpu", progress=False, timer=lambda fn: (fn(), 1.0)[1]
    )
    assert [(c.B, c.K, c.V) for c in cases] == [(1, 2, 64), (3, 2, 64)]
    assert all(c.speedup == 1.0 and c.bytes > 64 * 8 for c in cases)
    paths = bench.save_verifier_results(cases, meta, tmp_path)
    assert all(p.exists() for p in paths.values())
    loaded, loaded_meta = bench.load_verifier_results(tmp_path)
    assert loaded == cases and loaded_meta["byte_model"] == bench.BYTE_MODEL


def test_byte_model_reads_one_vocabulary_row_set_per_batch_row():
    from specdec_course.bench import verifier_bytes

    V, K = 1000, 4
    # Row 0 rejects draft 1 (examines 2 positions, reads p, q, E rows); row 1 accepts all 4
    # (examines 4, reads p and E rows for the bonus).
    got = verifier_bytes(torch.tensor([1, 4]), torch.tensor([4, 4]), K, V)
    per_position = 8 + 8 + 4 + 4
    expected = (2 * per_position + 3 * V * 4) + (4 * per_position + 2 * V * 4) + 2 * (5 * 8 + 8)
    assert got == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the command benchmarks")
def test_bench_verifier_without_cuda_runs_the_interpreter_sweep(capsys):
    from specdec_course.cli import main

    assert main(["bench", "verifier"]) == 0
    out = capsys.readouterr().out
    assert "No CUDA device" in out and "identical tokens: False" not in out
    assert out.count("identical tokens: True") == 8


# ------------------------------------------------- what only the compiler catches

import triton  # noqa: E402  (after specdec_course.kernels, which picks the interpreter)
import triton.language as tl  # noqa: E402


@triton.jit
def _first_negative_kernel(x_ptr, out_ptr, n):
    found = -1
    for i in range(n):
        if tl.load(x_ptr + i) < 0:
            found = i
            break  # fine in Python, so in the interpreter; no GPU compiler accepts it
    tl.store(out_ptr, found)


def test_gpu_compile_rejects_code_that_only_the_interpreter_runs():
    from specdec_course.kernels import compile_kernel_for_gpu

    if not torch.cuda.is_available():
        out = torch.zeros(1, dtype=torch.int32)
        _first_negative_kernel[(1,)](torch.tensor([3.0, -1.0, -2.0]), out, 3)
        assert out.item() == 1  # the interpreter ran the `break`
    with pytest.raises(RuntimeError, match="break"):
        compile_kernel_for_gpu(
            _first_negative_kernel, {"x_ptr": "*fp32", "out_ptr": "*i32", "n": "i32"}
        )
