"""The batched verifier as two Triton kernels: verify, then one exponential race per row.

Same semantics as ``specdec_course.verifier.rejection_sample`` (read its docstring first);
given the same ``uniforms`` and ``exp_noise`` the tokens are identical. The work splits in
two launches:

1. ``verify_kernel``: walks each row's drafts in order, accepts draft ``j`` iff
   ``p_j(x) > 0 and u_j * q_j(x) <= p_j(x)`` (float64), writes the accepted ids and stops at
   the first rejection (later positions are masked off: a GPU kernel cannot ``break``). It
   reads only ``p_j(x)`` and ``q_j(x)``, two numbers per position, and stores
   ``num_accepted``.
2. ``race_kernel``: for each row, at its position ``m = num_accepted`` only, runs the race
   ``argmax(w / E)`` over the vocabulary in tiles of ``BLOCK_V``; ``w = max(p_m - q_m, 0)``
   after a rejection and ``w = p_m`` for the bonus (no draft at ``m``). vLLM computes a
   recovered token at every draft position; racing only where it is needed reads one
   vocabulary row per batch row instead of ``K``.

Rows and splits. A program handles ``BLOCK_R`` rows as a vector. On the GPU
``BLOCK_R = 1``, and a small batch would leave most of the GPU idle with one program per
row (vLLM's layout): 8 rows of a 128K vocabulary are 8 programs on a GPU with 132
multiprocessors, each streaming 1.5 MB alone. So the race splits each row's vocabulary into
``S`` chunks, one program each (grid ``(B, S)``), enough for about four programs per
multiprocessor; every program races its chunk in tiles of ``BLOCK_V`` and writes its two
winners (score and column) to a small scratch tensor ``[B, S, 2]``, and a third launch,
``race_combine_kernel``, picks each row's winner over its ``S`` chunks. A large batch fills
the GPU by itself and runs with ``S = 1``: the race then writes the token directly. The
interpreter runs programs one after another in Python, where each program costs the same
whatever its width, so there a program takes a block of rows (and the whole vocabulary in
one tile), with ``S = 1``: 100,000 rows then need about a hundred programs, not 100,000.

The outputs need no fill before the launch: ``verify_kernel`` writes every slot of its rows
(the accepted ids, ``-1`` elsewhere), and the race then writes the new token at ``m``.

The race keeps two running winners per row while it streams the vocabulary: one over the
residual ``w`` and one over ``p`` itself. When no residual score is positive (``p == q`` up
to rounding) the token comes from the second, without a second pass over memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..verifier import RejectionResult, VerifierInputs, prepare_inputs

__all__ = [
    "verify_kernel",
    "race_kernel",
    "race_combine_kernel",
    "launch",
    "launch_config",
    "rejection_sample_triton",
]


# Only triton builtins below (tl.full, tl.reduce, ...), no library helpers such as tl.zeros
# or tl.max: those are @triton.jit functions decorated when triton is first imported, and
# torch imports triton (for its compiler) as soon as an optimizer steps. If that happened
# before this package switched the interpreter on, the helpers are compiled-mode objects the
# interpreter cannot call. The reductions use tl.max's own combiner, which the interpreter
# recognises and runs as one numpy call (a combiner of ours would run element by element).
_max = tl.standard._elementwise_max
_min = tl.standard._elementwise_min


@triton.jit
def verify_kernel(
    token_ids_ptr,  # int64 [B, K + 1]: every slot written here (accepted ids, else -1)
    num_accepted_ptr,  # int64 [B], written here
    draft_ids_ptr,  # int64 [B, K], -1 pads the end of a row
    draft_probs_ptr,  # [B, K, V]; unused when NO_DRAFT_PROBS
    target_probs_ptr,  # [B, K + 1, V]
    uniforms_ptr,  # float64 [B, K] in (0, 1]
    B,
    K,
    V,
    NO_DRAFT_PROBS: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < B
    # int64 offsets: B * (K + 1) * V passes 2**31 for large batches and vocabularies.
    r = rows.to(tl.int64)
    m = tl.full([BLOCK_R], 0, dtype=tl.int64)  # accepted so far
    active = row_ok  # still accepting: no rejection and no end of drafts yet
    for j in range(K):
        x = tl.load(draft_ids_ptr + r * K + j, mask=active, other=-1)
        look = active & (x >= 0)
        xs = tl.where(look, x, 0)  # a safe column where there is nothing to look at
        p_x = tl.load(target_probs_ptr + (r * (K + 1) + j) * V + xs, mask=look, other=0.0)
        p_x = p_x.to(tl.float64)
        u = tl.load(uniforms_ptr + r * K + j, mask=look, other=1.0)
        # The accept test is sampling.accepts written again in Triton (a kernel cannot call
        # Python); the tests pin its tokens to verifier.rejection_sample, which calls it.
        if NO_DRAFT_PROBS:
            # One-hot draft: q(x) = 1, accept iff u <= p(x).
            accept = look & (p_x > 0) & (u <= p_x)
        else:
            q_x = tl.load(draft_probs_ptr + (r * K + j) * V + xs, mask=look, other=0.0)
            # u <= p/q as u * q <= p in float64: no division, no 0/0 when q(x) = 0, and the
            # same rounding as the PyTorch reference.
            accept = look & (p_x > 0) & (u * q_x.to(tl.float64) <= p_x)
        tl.store(token_ids_ptr + r * (K + 1) + j, tl.where(accept, x, -1), mask=row_ok)
        m += accept.to(tl.int64)
        active = accept  # the first rejection (or -1) switches the row off for good
    tl.store(token_ids_ptr + r * (K + 1) + K, tl.full([BLOCK_R], -1, tl.int64), mask=row_ok)
    tl.store(num_accepted_ptr + r, m, mask=row_ok)


@triton.jit
def race_kernel(
    token_ids_ptr,  # int64 [B, K + 1]: the new token goes to position m
    num_accepted_ptr,  # int64 [B], from verify_kernel
    draft_ids_ptr,  # int64 [B, K]
    draft_probs_ptr,  # [B, K, V]; unused when NO_DRAFT_PROBS
    target_probs_ptr,  # [B, K + 1, V]
    exp_noise_ptr,  # float32 [B, V], Exp(1) draws > 0
    part_score_ptr,  # float32 [B, S, 2]: each chunk's best w and p scores (SPLIT only)
    part_index_ptr,  # int32 [B, S, 2]: their columns (SPLIT only)
    B,
    K,
    V,
    CHUNK,  # columns per program along the vocabulary: program (i, s) races s*CHUNK ..
    NO_DRAFT_PROBS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    SPLIT: tl.constexpr,  # S > 1 chunks per row: write the winners for race_combine_kernel
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    split = tl.program_id(1)
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, V)
    row_ok = rows < B
    r = rows.to(tl.int64)
    m = tl.load(num_accepted_ptr + r, mask=row_ok, other=0)
    # A draft at m means it was rejected (verify stopped there); none means bonus.
    x = tl.load(draft_ids_ptr + r * K + m, mask=row_ok & (m < K), other=-1)
    rejected = x >= 0
    p_row = target_probs_ptr + (r * (K + 1) + m) * V  # [BLOCK_R] row starts
    q_row = draft_probs_ptr + (r * K + m) * V
    e_row = exp_noise_ptr + r * V

    # Running winners: best score so far and its column, over w and over p. Scores of real
    # columns are >= 0, so -1 marks "nothing seen yet" and also masks padding columns.
    best_w = tl.full([BLOCK_R], -1.0, dtype=tl.float32)
    best_p = tl.full([BLOCK_R], -1.0, dtype=tl.float32)
    idx_w = tl.full([BLOCK_R], 0, dtype=tl.int32)
    idx_p = tl.full([BLOCK_R], 0, dtype=tl.int32)
    for start in range(lo, hi, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        ok = row_ok[:, None] & (cols < hi)[None, :]  # [BLOCK_R, BLOCK_V]
        p = tl.load(p_row[:, None] + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        e = tl.load(e_row[:, None] + cols[None, :], mask=ok, other=1.0)
        if NO_DRAFT_PROBS:
            # max(p - onehot(x), 0) is p with column x zeroed.
            w = tl.where(rejected[:, None] & (cols[None, :] == x[:, None]), 0.0, p)
        else:
            q_ok = ok & rejected[:, None]  # bonus rows: q = 0, so w = p
            q = tl.load(q_row[:, None] + cols[None, :], mask=q_ok, other=0.0).to(tl.float32)
            w = tl.maximum(p - q, 0.0)
        # div_rn: IEEE round-to-nearest division, bit-identical to torch's w / e. (Plain `/`
        # may compile to an approximate division on the GPU and change an argmax.)
        s_w = tl.where(ok, tl.math.div_rn(w, e), -1.0)
        s_p = tl.where(ok, tl.math.div_rn(p, e), -1.0)
        # The tile's best score, and the first column that reaches it: ties go to the lowest
        # column, and a later tile must be strictly better, so the first maximum wins,
        # exactly like torch.argmax. (V is past every real column: never the minimum.)
        tile_w = tl.reduce(s_w, 1, _max)
        tile_p = tl.reduce(s_p, 1, _max)
        arg_w = tl.reduce(tl.where(s_w == tile_w[:, None], cols[None, :], V), 1, _min)
        arg_p = tl.reduce(tl.where(s_p == tile_p[:, None], cols[None, :], V), 1, _min)
        better_w = tile_w > best_w
        better_p = tile_p > best_p
        best_w = tl.where(better_w, tile_w, best_w)
        idx_w = tl.where(better_w, arg_w, idx_w)
        best_p = tl.where(better_p, tile_p, best_p)
        idx_p = tl.where(better_p, arg_p, idx_p)
    if SPLIT:
        part = (r * tl.num_programs(1) + split) * 2
        tl.store(part_score_ptr + part, best_w, mask=row_ok)
        tl.store(part_score_ptr + part + 1, best_p, mask=row_ok)
        tl.store(part_index_ptr + part, idx_w, mask=row_ok)
        tl.store(part_index_ptr + part + 1, idx_p, mask=row_ok)
    else:
        # No positive residual score anywhere (p == q up to rounding): the residual is p.
        token = tl.where(best_w > 0, idx_w, idx_p)
        tl.store(token_ids_ptr + r * (K + 1) + m, token.to(tl.int64), mask=row_ok)


@triton.jit
def race_combine_kernel(
    token_ids_ptr,  # int64 [B, K + 1]: the new token goes to position m
    num_accepted_ptr,  # int64 [B]
    part_score_ptr,  # float32 [B, S, 2], from race_kernel with SPLIT
    part_index_ptr,  # int32 [B, S, 2]
    B,
    K,
    V,
    S,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,  # >= S
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < B
    r = rows.to(tl.int64)
    s = tl.arange(0, BLOCK_S)
    ok = row_ok[:, None] & (s < S)[None, :]  # [BLOCK_R, BLOCK_S]
    part = (r[:, None] * S + s[None, :]) * 2
    s_w = tl.load(part_score_ptr + part, mask=ok, other=-1.0)
    s_p = tl.load(part_score_ptr + part + 1, mask=ok, other=-1.0)
    i_w = tl.load(part_index_ptr + part, mask=ok, other=0)
    i_p = tl.load(part_index_ptr + part + 1, mask=ok, other=0)
    # Chunks cover increasing columns and each holds its own first maximum, so the lowest
    # column among the chunks that reach the best score is the row's first maximum: the
    # token torch.argmax gives. (Every chunk holds a real column: its score is >= 0.)
    best_w = tl.reduce(s_w, 1, _max)
    best_p = tl.reduce(s_p, 1, _max)
    idx_w = tl.reduce(tl.where(ok & (s_w == best_w[:, None]), i_w, V), 1, _min)
    idx_p = tl.reduce(tl.where(ok & (s_p == best_p[:, None]), i_p, V), 1, _min)
    token = tl.where(best_w > 0, idx_w, idx_p)
    m = tl.load(num_accepted_ptr + r, mask=row_ok, other=0)
    tl.store(token_ids_ptr + r * (K + 1) + m, token.to(tl.int64), mask=row_ok)


def _interpreting(kernel) -> bool:
    return not isinstance(kernel, triton.runtime.JITFunction)


def kernel_for(kernel, device: torch.device):
    """Check that ``kernel`` can run on tensors on ``device`` and return it.

    Interpreted kernels run on CPU tensors (and, copying through the host, on CUDA tensors);
    compiled kernels run on CUDA tensors only. Raises ``ValueError`` otherwise.
    """
    if device.type == "cuda" or _interpreting(kernel):
        return kernel
    raise ValueError(
        f"the inputs are on {device}, but this process compiles Triton kernels for the GPU; "
        "move them to 'cuda', or start Python with TRITON_INTERPRET=1 to interpret on the CPU"
    )


# Programs per multiprocessor the race aims for, and the multiprocessor count assumed when
# a config is asked for a GPU this process cannot see (an H100's or H200's 132).
_PROGRAMS_PER_SM = 4
_DEFAULT_SMS = 132


def _sm_count(device: torch.device) -> int:
    if not torch.cuda.is_available():
        return _DEFAULT_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def launch_config(B: int, V: int, device: torch.device) -> tuple[int, int, int]:
    """``(BLOCK_R, BLOCK_V, S)``: rows per program, vocabulary tile width, chunks per row.

    CUDA: one row per program, tiles of up to 4096 columns (16 KB of float32 per tensor,
    enough in flight per program to stream at full bandwidth without spilling registers),
    and as many chunks per row as bring the race to about four programs per multiprocessor
    (tiles narrow to 1024 first for small batches, so a row spreads over more programs).
    Interpreter: the whole vocabulary in one tile (a loop step costs Python time), one
    chunk, and as many rows as keep one tile under 2**16 elements (numpy's sweet spot here;
    measured: larger blocks do not run faster), so a 100,000-row batch takes a few hundred
    programs.
    """
    vocab = triton.next_power_of_2(V)
    if device.type != "cuda":
        rows = max(1, min(triton.next_power_of_2(B), 2**16 // vocab, 4096))
        return rows, vocab, 1
    want = _PROGRAMS_PER_SM * _sm_count(device)
    block = min(vocab, 4096)
    while block > 1024 and B * triton.cdiv(V, block) < want:
        block //= 2
    tiles = triton.cdiv(V, block)
    per_chunk = triton.cdiv(tiles, max(1, min(tiles, triton.cdiv(want, max(B, 1)))))
    return 1, block, triton.cdiv(tiles, per_chunk)


def launch(
    inputs: VerifierInputs, *, block_rows: int, block_vocab: int, splits: int = 1
) -> RejectionResult:
    """Run the kernels on checked inputs with explicit sizes (tests pick small tiles).

    ``inputs`` come from ``verifier.prepare_inputs``; ``block_rows`` and ``block_vocab`` must
    be powers of two; ``splits`` (>= 1) chunks each row's vocabulary over that many
    programs, whole tiles each (fewer when the vocabulary has fewer tiles), and combines
    their winners in a third launch. Returns ``RejectionResult`` like the reference.
    """
    for name, v in (("block_rows", block_rows), ("block_vocab", block_vocab)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two >= 1; got {v}")
    if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
        raise ValueError(f"splits must be an int >= 1; got {splits!r}")
    ids, q, p, u, e = inputs
    B, K = ids.shape
    V = p.shape[2]
    token_ids = torch.empty((B, K + 1), dtype=torch.int64, device=p.device)
    num_accepted = torch.empty(B, dtype=torch.int64, device=p.device)
    if B == 0:
        return RejectionResult(token_ids, num_accepted)
    if K == 0:
        # Triton wants real storage behind every pointer; these are never read (m == K == 0).
        ids = ids.new_full((B, 1), -1)
        u = u.new_ones((B, 1))
    no_q = q is None
    q_arg = p if no_q else q  # a placeholder pointer when there are no draft probabilities
    tiles = triton.cdiv(V, block_vocab)
    chunk = triton.cdiv(tiles, min(splits, tiles)) * block_vocab
    S = triton.cdiv(V, chunk)
    on_gpu = p.device.type == "cuda"
    grid = (triton.cdiv(B, block_rows),)
    kernel_for(verify_kernel, p.device)[grid](
        token_ids,
        num_accepted,
        ids,
        q_arg,
        p,
        u,
        B,
        K,
        V,
        NO_DRAFT_PROBS=no_q,
        BLOCK_R=block_rows,
        **({"num_warps": 1} if on_gpu else {}),  # scalar work: one warp is plenty
    )
    score = torch.empty((B, S, 2) if S > 1 else (1,), dtype=torch.float32, device=p.device)
    index = torch.empty((B, S, 2) if S > 1 else (1,), dtype=torch.int32, device=p.device)
    kernel_for(race_kernel, p.device)[(grid[0], S)](
        token_ids,
        num_accepted,
        ids,
        q_arg,
        p,
        e,
        score,
        index,
        B,
        K,
        V,
        chunk,
        NO_DRAFT_PROBS=no_q,
        BLOCK_R=block_rows,
        BLOCK_V=block_vocab,
        SPLIT=S > 1,
        **({"num_warps": 8 if block_vocab >= 2048 else 4} if on_gpu else {}),
    )
    if S > 1:
        kernel_for(race_combine_kernel, p.device)[grid](
            token_ids,
            num_accepted,
            score,
            index,
            B,
            K,
            V,
            S,
            BLOCK_R=block_rows,
            BLOCK_S=triton.next_power_of_2(S),
            **({"num_warps": 1} if on_gpu else {}),
        )
    return RejectionResult(token_ids, num_accepted)


def rejection_sample_triton(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    exp_noise: torch.Tensor | None = None,
) -> RejectionResult:
    """``verifier.rejection_sample`` as Triton kernels: same arguments, checks and result.

    Inputs are checked and random numbers drawn by ``verifier.prepare_inputs`` (same order,
    so a seeded ``generator`` gives the reference's tokens too). CUDA tensors run natively;
    CPU tensors run under the Triton interpreter (slow: for teaching and testing). Returns
    ``RejectionResult(token_ids [B, K + 1], num_accepted [B])``; raises ``ValueError`` on
    bad input, like the reference.
    """
    inputs = prepare_inputs(
        draft_token_ids,
        draft_probs,
        target_probs,
        generator=generator,
        uniforms=uniforms,
        exp_noise=exp_noise,
    )
    B, V = inputs.exp_noise.shape
    block_rows, block_vocab, splits = launch_config(B, V, inputs.target_probs.device)
    return launch(inputs, block_rows=block_rows, block_vocab=block_vocab, splits=splits)
