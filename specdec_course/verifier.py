"""The batched verifier: rejection sampling for a whole batch of drafts, in PyTorch.

This is the reference implementation of what production engines run in one kernel launch
(vLLM's ``vllm/v1/sample/rejection_sampler.py``, FlashInfer's ``chain_speculative_sampling``).
It follows Leviathan et al. 2023 (arXiv:2211.17192), Algorithm 1: draft ``x_j`` is accepted
with probability ``min(1, p_j(x_j) / q_j(x_j))``; the first rejected position is resampled
from the residual ``norm(max(p_j - q_j, 0))``; when every draft is accepted one bonus token
is drawn from the next target row. ``specdec_course.kernels.rejection_sample_triton`` is the
same function as Triton kernels and returns exactly the same tokens for the same random
numbers.

Output layout (as in vLLM: accepted + recovered + bonus, placeholders after). Row ``b`` with
``n_b`` drafts and ``m_b = num_accepted[b]`` accepted drafts emits ``m_b + 1`` tokens::

    token_ids[b] = [x_0, ..., x_{m-1},  t,  -1, ..., -1]      # shape [K + 1]
                    accepted drafts     one new token, then -1 placeholders

    t = recovered token from the residual of row m      if m < n_b (draft m was rejected)
    t = token drawn from the target row m itself        if m == n_b (no draft at m: bonus)

Random numbers. ``uniforms[b, j]`` (float64, in (0, 1]) decides draft ``j``; one vector
``exp_noise[b]`` of Exp(1) draws (float32, length V) samples the one new token ``t`` by the
exponential race ``argmax(w / E)``, where ``w`` is the unnormalised residual
``max(p_m - q_m, 0)`` or, for the bonus, ``p_m`` itself. A row draws exactly one new token,
so one noise vector per row is all it needs, and the race makes the token exact without
normalising ``w``. Given the same ``uniforms`` and ``exp_noise``, the result is a
deterministic function of the inputs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .sampling import accepts, residual_race, uniform_open_closed
from .sampling import exp_noise as _exp_noise

__all__ = [
    "RejectionResult",
    "VerifierInputs",
    "prepare_inputs",
    "rejection_sample",
    "rejection_sample_prepared",
    "rejection_sample_row",
    "residual_weights",
    "greedy_accepted",
    "one_row",
]

# dtypes the probabilities may come in. Acceptance is decided in float64 and the race in
# float32 whatever the input dtype, so both implementations round the same way.
PROB_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# A probability can exceed 1 only by rounding; anything beyond this is not a probability
# (most often: logits passed where softmax outputs were expected).
_MAX_PROB = 1.0 + 1e-3


class RejectionResult(NamedTuple):
    """What :func:`rejection_sample` returns; unpacks as ``token_ids, num_accepted``.

    ``token_ids`` int64 ``[B, K + 1]``: per row the accepted drafts, then one recovered or
    bonus token, then ``-1``. ``num_accepted`` int64 ``[B]``: accepted drafts per row (the
    row emitted ``num_accepted + 1`` tokens).
    """

    token_ids: torch.Tensor
    num_accepted: torch.Tensor


class VerifierInputs(NamedTuple):
    """Checked inputs shared by the PyTorch and Triton verifiers (see ``prepare_inputs``)."""

    draft_token_ids: torch.Tensor  # int64 [B, K], -1 only as a suffix
    draft_probs: torch.Tensor | None  # [B, K, V] or None (one-hot drafts)
    target_probs: torch.Tensor  # [B, K + 1, V]
    uniforms: torch.Tensor  # float64 [B, K] in (0, 1]
    exp_noise: torch.Tensor  # float32 [B, V] > 0


def _fail(msg: str) -> None:
    raise ValueError(msg)


def _check_probs(t: torch.Tensor, name: str, shape: tuple[int, ...], shape_doc: str) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a torch.Tensor {shape_doc}, not {type(t).__name__}")
    if tuple(t.shape) != shape:
        _fail(f"{name} must have shape {shape_doc} = {shape}; got {tuple(t.shape)}")
    if t.dtype not in PROB_DTYPES:
        _fail(f"{name} must be a float tensor (float16/bfloat16/float32/float64); got {t.dtype}")
    if t.numel() == 0:
        return
    # One pass over the [B, K, V] tensor: min and max together. NaN propagates into both, so
    # `lo >= 0` is False for NaN; `hi <= 1` catches infinities and logits. Row sums are not
    # checked: that would be a second full pass on every call (see the module docstring of
    # sampling for the single-distribution checks that do it).
    lo, hi = (float(v) for v in torch.aminmax(t))
    if lo >= 0 and hi <= _MAX_PROB:
        return
    if torch.isnan(t).any():
        _fail(f"{name} contains NaN; check the logits that produced it (e.g. -inf everywhere)")
    if lo < 0:
        _fail(
            f"{name} has negative entries (min {lo:.4g}); probabilities must be >= 0 "
            "(did you pass logits? apply softmax first)"
        )
    _fail(
        f"{name} has entries above 1 (max {hi:.4g}); pass probabilities (apply softmax), not logits"
    )


def prepare_inputs(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    exp_noise: torch.Tensor | None = None,
) -> VerifierInputs:
    """Check the verifier's inputs once and draw the random numbers that were not given.

    Arguments as in :func:`rejection_sample`. Returns :class:`VerifierInputs` with the draft
    ids as int64 and every tensor contiguous on ``target_probs``'s device. Random numbers come
    from ``generator`` (or torch's default generator for that device) in this order: first
    ``uniforms`` ``[B, K]`` (float64, (0, 1], ``sampling.uniform_open_closed``), then
    ``exp_noise`` ``[B, V]`` (float32, ``sampling.exp_noise``); a tensor that is given is
    used as is and draws nothing. Cost: one pass over each probability tensor, O(B·K) and
    O(B·V) checks on the rest. Raises ``ValueError`` naming the argument that is wrong.
    """
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 3:
        got = (
            tuple(target_probs.shape)
            if isinstance(target_probs, torch.Tensor)
            else type(target_probs).__name__
        )
        _fail(f"target_probs must be a tensor of shape [B, K + 1, V]; got {got}")
    if not isinstance(draft_token_ids, torch.Tensor) or draft_token_ids.dim() != 2:
        got = (
            tuple(draft_token_ids.shape)
            if isinstance(draft_token_ids, torch.Tensor)
            else type(draft_token_ids).__name__
        )
        _fail(f"draft_token_ids must be an int64 tensor of shape [B, K]; got {got}")
    B, K = draft_token_ids.shape
    V = target_probs.shape[2]
    device = target_probs.device
    if V == 0:
        _fail("target_probs has an empty vocabulary (V = 0); it needs at least one token")
    if draft_token_ids.dtype not in (torch.int64, torch.int32):
        _fail(f"draft_token_ids must hold integer ids (int64); got {draft_token_ids.dtype}")
    if draft_token_ids.device != device:
        _fail(
            f"draft_token_ids is on {draft_token_ids.device} but target_probs on {device}; "
            "move them to one device"
        )
    _check_probs(target_probs, "target_probs", (B, K + 1, V), "[B, K + 1, V]")
    if draft_probs is not None:
        _check_probs(draft_probs, "draft_probs", (B, K, V), "[B, K, V]")
        if draft_probs.device != device:
            _fail(f"draft_probs is on {draft_probs.device} but target_probs on {device}")
    ids = draft_token_ids.to(torch.int64).contiguous()
    if ids.numel():
        lo, hi = (int(v) for v in torch.aminmax(ids))
        if lo < -1 or hi >= V:
            _fail(
                f"draft_token_ids must lie in [0, V) = [0, {V}) or be -1 (no draft); "
                f"got values from {lo} to {hi}"
            )
        # -1 ends a row's drafts: a real id after a -1 means the row was padded wrongly.
        if K > 1 and ((ids[:, 1:] >= 0) & (ids[:, :-1] < 0)).any():
            _fail(
                "draft_token_ids has a draft after a -1 in some row; -1 may only pad the end "
                "of a row (a row's drafts are the ids before its first -1)"
            )
    if generator is not None and (uniforms is None or exp_noise is None):
        if torch.device(generator.device).type != device.type:
            _fail(
                f"generator is a {generator.device} generator but the inputs are on {device}; "
                f"create it with torch.Generator(device={str(device)!r})"
            )
    if uniforms is None:
        uniforms = uniform_open_closed((B, K), generator=generator, device=device)
    else:
        if not isinstance(uniforms, torch.Tensor) or tuple(uniforms.shape) != (B, K):
            _fail(f"uniforms must be a float64 tensor of shape [B, K] = {(B, K)}")
        if uniforms.dtype != torch.float64:
            _fail(
                f"uniforms must be float64, not {uniforms.dtype}: float32 draws hit exactly "
                "0.0 too often, and u = 0 accepts a token the target gives probability 0"
            )
        if uniforms.device != device:
            _fail(f"uniforms is on {uniforms.device} but target_probs on {device}")
        if uniforms.numel():
            lo, hi = (float(v) for v in torch.aminmax(uniforms))
            if not (lo > 0 and hi <= 1):
                _fail(
                    f"uniforms must lie in (0, 1]; got values from {lo} to {hi} "
                    "(use specdec_course.sampling.uniform_open_closed)"
                )
    if exp_noise is None:
        exp_noise = _exp_noise((B, V), generator=generator, device=device)
    else:
        if not isinstance(exp_noise, torch.Tensor) or tuple(exp_noise.shape) != (B, V):
            _fail(f"exp_noise must be a float32 tensor of shape [B, V] = {(B, V)}")
        if exp_noise.dtype != torch.float32:
            _fail(f"exp_noise must be float32, not {exp_noise.dtype}")
        if exp_noise.device != device:
            _fail(f"exp_noise is on {exp_noise.device} but target_probs on {device}")
        if exp_noise.numel():
            lo, hi = (float(v) for v in torch.aminmax(exp_noise))
            if not (lo > 0 and hi < float("inf")):
                _fail(
                    "exp_noise must hold finite Exp(1) draws > 0 "
                    "(use specdec_course.sampling.exp_noise)"
                )
    return VerifierInputs(
        ids,
        None if draft_probs is None else draft_probs.contiguous(),
        target_probs.contiguous(),
        uniforms.contiguous(),
        exp_noise.contiguous(),
    )


def rejection_sample(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    exp_noise: torch.Tensor | None = None,
) -> RejectionResult:
    """Verify a batch of drafts; return the tokens each row emits (accepted + one new token).

    Inputs (``B`` rows, up to ``K`` drafts each, vocabulary ``V``):

    - ``draft_token_ids`` int64 ``[B, K]``: the drafted ids. ``-1`` ends a row's drafts
      (ragged rows); a row with ``n`` drafts has ``-1`` in positions ``n..K-1``.
    - ``draft_probs`` float ``[B, K, V]``: the draft distributions ``q_j`` the ids were
      sampled from, or ``None`` for one-hot drafts (greedy draft models, n-gram drafts):
      draft ``x`` is then accepted iff ``u <= p(x)`` and the residual is ``p`` with ``x``
      set to 0.
    - ``target_probs`` float ``[B, K + 1, V]``: the target distributions; row ``j`` scores
      draft ``j``, row ``K`` (or row ``n`` of a ragged row) is the bonus distribution.
    - ``uniforms`` float64 ``[B, K]`` in (0, 1] and ``exp_noise`` float32 ``[B, V]`` of
      Exp(1) draws: the random numbers; drawn from ``generator`` when not given (order:
      uniforms, then noise; see :func:`prepare_inputs`).

    Rules, for row ``b`` and position ``j`` with draft ``x``:

    - accept iff ``p_j(x) > 0`` and ``u[b, j] * q_j(x) <= p_j(x)`` in float64: this is
      ``u <= min(1, p/q)`` without a division (and without 0/0 when ``q_j(x) = 0``); a token
      the target gives probability 0 is never accepted.
    - stop at the first rejection or at the end of the drafts, position ``m``. The new token
      is ``argmax(w / exp_noise[b])`` (float32) with ``w = max(p_m - q_m, 0)`` after a
      rejection (``q_m`` one-hot at the draft when ``draft_probs`` is None) and ``w = p_m``
      for the bonus. When every score ``w / E`` is 0 (no residual mass: ``p == q`` up to
      rounding) the race runs over ``p_m`` instead, which is what ``sampling`` defines the
      residual to be in that case; so every emitted id lies in ``[0, V)``.

    Exactness: conditioned on a row reaching position ``j``, its token there is distributed
    exactly as ``target_probs[b, j]``, whatever the drafts were.

    Returns :class:`RejectionResult` ``(token_ids [B, K + 1] int64, num_accepted [B] int64)``
    on ``target_probs``'s device. Raises ``ValueError`` for wrong shapes, dtypes or devices,
    ids outside ``[0, V)`` other than ``-1`` padding, NaN, negative or > 1 probabilities,
    uniforms outside (0, 1], and non-positive noise.
    """
    inputs = prepare_inputs(
        draft_token_ids,
        draft_probs,
        target_probs,
        generator=generator,
        uniforms=uniforms,
        exp_noise=exp_noise,
    )
    return rejection_sample_prepared(inputs)


def rejection_sample_prepared(inputs: VerifierInputs) -> RejectionResult:
    """:func:`rejection_sample` on inputs already checked by :func:`prepare_inputs`.

    No checks and no random draws: what a benchmark times, and what a caller that checked
    its inputs once can call in a loop. The one batched rule: the same ops on tensors or on
    NumPy arrays (the batched loop's views of its CPU tensors: fewer dispatches), same result.
    """
    ids, q, p, u, e = inputs
    B, K = ids.shape
    tensors = isinstance(p, torch.Tensor)
    b = torch.arange(B, device=p.device) if tensors else np.arange(B)

    # 1. Accept/reject every drafted position at once, up to the first rejection. The test is
    # made in float64: u is float64, so u * q(x) and its comparison with p(x) promote exactly.
    x = ids.clamp_min(0) if tensors else np.maximum(ids, 0)  # a safe index where no draft
    if K:
        bj = (b[:, None], _arange(K, p), x)
        q_x = 1.0 if q is None else q[bj]
        ok = accepts(u, q_x, p[bj]) & (ids >= 0)
        if tensors:
            num_accepted = ok.cumprod(1).sum(1)  # [B]: the product is 1 until the first 0
        else:  # the first False, with a False column at K (NumPy's argmin takes bools)
            num_accepted = np.zeros((B, K + 1), dtype=bool)
            num_accepted[:, :K] = ok
            num_accepted = num_accepted.argmin(1)
    else:
        num_accepted = b * 0

    # 2. One new token per row, at m: a race over the residual, or over p for the bonus.
    m = num_accepted
    p_m = _float32(p[b, m])  # [B, V]
    if K:
        m_in = m.clamp(max=K - 1) if tensors else np.minimum(m, K - 1)
        rejected = (m < K) & (ids[b, m_in] >= 0)  # a draft sits at m and was not accepted
        q_m = None if q is None else _float32(q[b, m_in])
        w = residual_weights(p_m, q_m, None if q_m is not None else x[b, m_in], rejected)
    else:
        w = p_m
    token = residual_race(w, e, p_m)  # [B]

    # 3. Layout: accepted drafts, the new token at m, -1 after.
    token_ids = _padded(ids)  # [B, K + 1], -1 in the last column
    token_ids[_arange(K + 1, p) > m[:, None]] = -1
    token_ids[b, m] = token
    return RejectionResult(token_ids, num_accepted)


def residual_weights(p_m, q_m, x_m, rejected=None):
    """The race weights after draft ``x_m`` was rejected, the one residual of both Python
    verifiers: ``p_m - q_m`` unclamped (scores ``<= 0`` never win ``sampling.residual_race``),
    or for a one-hot draft (``q_m`` None) ``p_m`` with ``x_m``'s entry zeroed. One rejected
    row (``p_m [V]``, ``x_m`` an int) or a batch (``[B, V]``, ``x_m [B]``, ``rejected [B]``:
    rows without a rejection keep ``p_m``, the bonus row), tensors or NumPy arrays."""
    if q_m is not None:
        return p_m - (q_m if rejected is None else q_m * rejected[:, None])
    w = p_m.clone() if isinstance(p_m, torch.Tensor) else p_m.copy()
    if rejected is None:
        w[x_m] = 0.0
    else:
        w[_arange(len(w), w)[rejected], x_m[rejected]] = 0.0
    return w


def greedy_accepted(drafts, best):
    """The greedy case of every loop (one-hot ``p`` and ``q``): drafts are accepted while each
    is the target's argmax ``best``. How many: an int for one row (lists), or one count per
    row for ``[B, K]`` integer arrays (``best`` ``[B, K + 1]``)."""
    if isinstance(drafts, list):
        a, k = 0, len(drafts)
        while a < k and drafts[a] == best[a]:
            a += 1
        return a
    return (drafts == best[:, : drafts.shape[1]]).cumprod(1).sum(1)


def _float32(t):
    return t.float() if isinstance(t, torch.Tensor) else t.astype(np.float32, copy=False)


def _arange(n: int, like):
    return torch.arange(n, device=like.device) if isinstance(like, torch.Tensor) else np.arange(n)


def _padded(ids):  # ids [B, K] with a column of -1 after: [B, K + 1], a new array
    if isinstance(ids, torch.Tensor):
        return torch.cat((ids, ids.new_full((ids.shape[0], 1), -1)), 1)
    out = np.empty((ids.shape[0], ids.shape[1] + 1), ids.dtype)
    out[:, :-1] = ids
    out[:, -1] = -1
    return out


def one_row(draft_ids, draft_probs, target_probs, uniforms, exp_noise) -> VerifierInputs:
    """A row path's arguments as a one-row batch on ``target_probs``' device (unchecked)."""
    dev, k = target_probs.device, draft_ids.shape[0]
    e = exp_noise if isinstance(exp_noise, torch.Tensor) else torch.from_numpy(exp_noise)
    u = torch.as_tensor(uniforms[:k], dtype=torch.float64).to(dev)
    q = None if draft_probs is None else draft_probs[None]
    return VerifierInputs(draft_ids[None], q, target_probs[None], u[None], e.to(dev)[None])


def rejection_sample_row(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    uniforms,
    exp_noise: torch.Tensor,
) -> tuple[list[int], int]:
    """One row of :func:`rejection_sample`, for a batch-1 decoding loop: same rule, same tokens.

    ``draft_ids`` int64 ``[k]`` (``k >= 0``, no ``-1``), ``draft_probs`` ``[k, V]`` or
    ``None`` (one-hot drafts), ``target_probs`` ``[k + 1, V]`` (contiguous; on a CPU each
    of these may also be a NumPy array over the same memory), ``uniforms`` a
    sequence of at least ``k`` Python floats in (0, 1] (float64 values), ``exp_noise``
    float32 ``[V]`` (a tensor; a NumPy array with CPU tensors). Returns ``(new_ids,
    num_accepted)``: the ``num_accepted`` accepted drafts followed by the one recovered or
    bonus token, as Python ints. Given the same random numbers the tokens are those of
    ``rejection_sample`` on the one-row batch (tests pin it); it checks nothing (callers
    pass what their own loop produced).

    Why a row path: at batch 1 on a CPU even a few dozen NumPy calls cost more than the
    rest of the loop. Here the accept test reads ``2k`` scalars in float64 up to the first
    rejection, and the race runs over the one row where the new token is drawn, with the
    batched rule's ``residual_weights`` and ``sampling.residual_race``. Tensors off the CPU
    take the batched rule on a one-row batch (``_row_tensors``).
    """
    if isinstance(target_probs, np.ndarray) or target_probs.device.type == "cpu":
        return _row_host(draft_ids, draft_probs, target_probs, uniforms, exp_noise)
    return _row_tensors(draft_ids, draft_probs, target_probs, uniforms, exp_noise)


def _row_tensors(draft_ids, draft_probs, target_probs, uniforms, exp_noise):
    # rejection_sample_row off the CPU: the batched rule on one row, one transfer back.
    res = rejection_sample_prepared(
        one_row(draft_ids, draft_probs, target_probs, uniforms, exp_noise)
    )
    out = torch.cat((res.num_accepted, res.token_ids[0])).tolist()
    return out[1 : out[0] + 2], out[0]


def _row_host(draft_ids, draft_probs, target_probs, uniforms, exp_noise):
    # rejection_sample_row on CPU tensors, through NumPy views of their memory (no copies).
    P, E = _array(target_probs), _array(exp_noise)
    k = draft_ids.shape[0]
    xs = draft_ids.tolist()
    Q = None if draft_probs is None else _array(draft_probs)
    a = 0
    while a < k:  # the accept test on float64 values, as the batched rule
        x = xs[a]
        # .item: a Python float in one call
        if accepts(uniforms[a], 1.0 if Q is None else Q.item(a, x), P.item(a, x)):
            a += 1
        else:
            break
    # (Each NumPy call here runs just after the target's forward, with cold caches: a few
    # microseconds each, so the float32 rows are read as they are, without a no-op astype.)
    p_a = P[a] if P.dtype == np.float32 else P[a].astype(np.float32)
    if a == k:  # every draft accepted: the bonus token, a race over p itself
        return xs + [int((p_a / E).argmax())], a
    q_a = None if Q is None else (Q[a] if Q.dtype == np.float32 else Q[a].astype(np.float32))
    return xs[:a] + [residual_race(residual_weights(p_a, q_a, xs[a]), E, p_a)], a


def _array(t):
    # A NumPy view of a CPU tensor's memory (an array passes as it is).
    return t if isinstance(t, np.ndarray) else t.numpy()
