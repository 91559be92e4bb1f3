"""Block verification: the drafted block judged as a whole, lossless and never worse.

Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro & Suresh, "Block Verification Accelerates
Speculative Decoding" (2024, arXiv:2403.10444), Algorithm 2. Token-wise verification
(``verifier``) stops at the first draft it rejects, and so throws away a block whose later
drafts would have made up for an unlucky early one. Block verification carries a running
weight instead: with ``p_0 = 1`` and draft ``x_i`` drawn from ``q_i``,

    p_i = min(p_{i-1} * p_i(x_i) / q_i(x_i), 1)                  (the prefix's weight)
    h_i = r_i / (r_i + 1 - p_i),   r_i = sum_x max(p_i * p_{i+1}(x) - q_{i+1}(x), 0)
    h_g = p_g                                                    (at the last draft, g)

(``p_{i+1}``, ``q_{i+1}``: the target's and the draft's next-token distributions after the
first ``i`` drafts). Each position ``i`` flips its own coin, ``eta_i <= h_i``, and the block
keeps the **longest** prefix whose coin came up: ``tau = max{i : eta_i <= h_i}`` (0 when
none did). A rejection at ``i`` is not final: a later success overrides it. The new token is
drawn from ``norm(max(p_tau * p_{tau+1} - q_{tau+1}, 0))`` (the residual, with the prefix's
weight) or, when every draft was kept, from the bonus row.

Three facts the tests pin: the emitted text is distributed exactly as the target's (the
paper's Theorem 1; here also by exact enumeration of every draft block); the expected number
of kept drafts is never below token-wise verification's (Theorem 2: it is optimal among
lossless verifiers of one block); with one draft, or with a one-hot target (temperature 0),
it is token-wise verification, token for token.

``block_verify`` has ``verifier.rejection_sample``'s signature and output layout (ragged rows,
``-1`` padding, one-hot drafts, the same random numbers: ``uniforms[b, j]`` is the coin of
draft ``j``, ``exp_noise[b]`` the race of the new token). ``block_verify_row`` is the same
rule at batch 1, for the decoding loop (``speculative_generate(..., verify="block")``).
"""

from __future__ import annotations

import torch

from .sampling import residual_race
from .verifier import RejectionResult, VerifierInputs, prepare_inputs

__all__ = [
    "block_verify",
    "block_verify_prepared",
    "block_verify_row",
    "block_thresholds",
    "kept_law",
    "weighted_residual",
]


def block_verify(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    exp_noise: torch.Tensor | None = None,
) -> RejectionResult:
    """Verify a batch of drafted blocks jointly; return the tokens each row emits.

    Inputs, checks, random numbers and output exactly as :func:`verifier.rejection_sample`:
    ``draft_token_ids`` int64 ``[B, K]`` (``-1`` ends a row's drafts), ``draft_probs``
    ``[B, K, V]`` or ``None`` (one-hot drafts), ``target_probs`` ``[B, K + 1, V]``,
    ``uniforms`` float64 ``[B, K]`` in (0, 1] (the coins ``eta``), ``exp_noise`` float32
    ``[B, V]``; drawn from ``generator`` when not given. Returns ``RejectionResult(token_ids
    [B, K + 1], num_accepted [B])``: the ``tau`` kept drafts, one new token, then ``-1``.

    The rule is the module docstring's, in float64 for the weights and coins and float32 for
    the race (as token-wise verification). A draft the target gives probability 0 gets
    weight 0, so it is never kept. ``0 / 0`` in ``h_i`` (weight 1 and no residual mass: the
    models agree after this prefix) counts as 1: that position can then never be where the
    block stops, so any value would be exact, and 1 keeps the later positions in play.
    Raises ``ValueError`` as ``rejection_sample`` does.
    """
    inputs = prepare_inputs(
        draft_token_ids,
        draft_probs,
        target_probs,
        generator=generator,
        uniforms=uniforms,
        exp_noise=exp_noise,
    )
    return block_verify_prepared(inputs)


def block_thresholds(
    draft_token_ids: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's weights and coin thresholds: ``(weights [B, K + 1], h [B, K])``, float64.

    ``weights[b, i]`` is ``p_i`` of the module docstring (``p_0 = 1``; 0 past a row's
    drafts), ``h[b, j]`` the threshold of the coin of draft ``j`` (position ``i = j + 1``;
    0 past a row's drafts). Inputs as :func:`block_verify`, unchecked (pass what
    ``verifier.prepare_inputs`` returned). Given the drafts, the block keeps ``i`` of them
    with probability ``h_i * prod_{j > i} (1 - h_j)`` (:func:`kept_law`).
    """
    ids, q, p = draft_token_ids, draft_probs, target_probs
    B, K = ids.shape
    dev = p.device
    has = ids >= 0  # [B, K]
    n = has.sum(dim=1)  # [B] drafts per row
    x = ids.clamp_min(0).unsqueeze(2)  # [B, K, 1], a safe index where there is no draft
    p_x = p[:, :K].gather(2, x).squeeze(2).double()  # [B, K]
    q_x = torch.ones_like(p_x) if q is None else q.gather(2, x).squeeze(2).double()

    # 1. The prefix weights p_i, in order (K is small; each step is over the batch).
    weight = torch.zeros(B, K + 1, dtype=torch.float64, device=dev)  # column i: p_i
    weight[:, 0] = 1.0
    for j in range(K):
        num = weight[:, j] * p_x[:, j]
        # min(num / q, 1) without dividing by a zero q (a draft q never proposes: weight 1).
        w = torch.where(num >= q_x[:, j], 1.0, num / q_x[:, j].clamp_min(1e-300))
        weight[:, j + 1] = torch.where(has[:, j] & (p_x[:, j] > 0), w, 0.0)

    # 2. The coins' thresholds h_i: r_i / (r_i + 1 - p_i) inside the block, p_g at its end.
    w_in = weight[:, 1:K]  # p_1 .. p_{K-1}
    if q is None:
        # One-hot q_{i+1} at the next draft: sum max(p_i p(.) - 1[x], 0) = p_i (1 - p(x)).
        r = w_in * (1.0 - p_x[:, 1:])
    else:
        r = (w_in.unsqueeze(2) * p[:, 1:K].double() - q[:, 1:K].double()).clamp_min(0).sum(2)
    den = r + 1.0 - w_in
    h_in = torch.where(den > 0, r / den.clamp_min(1e-300), 1.0)
    h = torch.cat([h_in, torch.zeros(B, 1, dtype=torch.float64, device=dev)], dim=1)[:, :K]
    last = torch.arange(K, device=dev).unsqueeze(0) == (n - 1).unsqueeze(1)
    h = torch.where(last, weight[:, 1:], h)
    return weight, torch.where(has, h, 0.0)


def kept_law(h: torch.Tensor) -> torch.Tensor:
    """The law of ``tau``, the number of drafts the block keeps, given its coin thresholds
    ``h`` ``[B, K]`` (:func:`block_thresholds`): ``[B, K + 1]``, column ``i`` the chance
    that coin ``i`` came up and none after it, ``h_i * prod_{j > i} (1 - h_j)`` with
    ``h_0 = 1`` (the longest prefix whose coin came up). Lesson 09 enumerates the rule with
    it; exercise 10 derives it."""
    hh = torch.cat([torch.ones_like(h[:, :1]), h], dim=1)  # [B, K + 1]: h_0 = 1
    # none_after[:, i] = prod_{j > i} (1 - h_j): a reversed cumulative product, shifted.
    tail = (1 - hh).flip(1).cumprod(1).flip(1)
    none_after = torch.cat([tail[:, 1:], torch.ones_like(h[:, :1])], dim=1)
    return hh * none_after


def block_verify_prepared(inputs: VerifierInputs) -> RejectionResult:
    """:func:`block_verify` on inputs already checked by ``verifier.prepare_inputs``."""
    ids, q, p, u, e = inputs
    B, K = ids.shape
    V = p.shape[2]
    dev = p.device
    n = (ids >= 0).sum(dim=1)
    weight, h = block_thresholds(ids, q, p)

    # 3. The longest prefix whose coin came up (0 when none did).
    kept = (ids >= 0) & (u <= h)
    tau = (kept * torch.arange(1, K + 1, device=dev)).amax(dim=1) if K else n  # [B]
    m = tau.unsqueeze(1)  # [B, 1]
    rejected = m < n.unsqueeze(1)  # the block stopped before its end: residual, not bonus

    # 4. The new token at tau: race over the weighted residual, or over the bonus row.
    m_v = m.unsqueeze(2).expand(B, 1, V)
    p_m = p.gather(1, m_v).squeeze(1).float()  # [B, V]
    w_tau = weight.gather(1, m)  # [B, 1]: p_tau
    ids_pad = torch.cat([ids, ids.new_full((B, 1), -1)], dim=1)  # [B, K + 1]
    if q is None:
        res = weighted_residual(w_tau, p_m, None, ids_pad.gather(1, m).clamp_min(0))
    elif K > 0:
        res = weighted_residual(w_tau, p_m, q.gather(1, m_v.clamp(max=K - 1)).squeeze(1), None)
    else:
        res = p_m
    w_race = torch.where(rejected, res, p_m)
    token = residual_race(w_race, e, p_m).unsqueeze(1)  # no residual mass: a race over p

    pos = torch.arange(K + 1, device=dev)
    token_ids = torch.where(pos < m, ids_pad, -1).scatter_(1, m, token)
    return RejectionResult(token_ids, tau)


def weighted_residual(w_tau, p_m, q_m, x_m):
    """The race weights after the block stops at ``tau`` before its end, the one residual of
    both block paths: ``max(p_tau * p_m - q_m, 0)`` in float64, then float32; for one-hot
    drafts (``q_m`` None) ``p_tau * p_m`` with the draft ``x_m``'s entry zeroed. One row
    (``p_m [V]``, ``w_tau`` a float, ``x_m`` an int) or a batch (``[B, V]``, ``w_tau [B,
    1]``, ``x_m [B, 1]``)."""
    if q_m is not None:
        return (w_tau * p_m.double() - q_m.double()).clamp_min(0).float()
    w = (w_tau * p_m.double()).float()
    if w.dim() == 1:
        w[x_m] = 0.0
        return w
    return w.scatter_(1, x_m, 0.0)


def block_verify_row(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    uniforms,
    exp_noise: torch.Tensor,
) -> tuple[list[int], int]:
    """One row of :func:`block_verify`, for a batch-1 decoding loop: same rule, same tokens.

    Arguments and result as ``verifier.rejection_sample_row``: ``draft_ids`` int64 ``[k]``
    (no ``-1``), ``draft_probs`` ``[k, V]`` or ``None``, ``target_probs`` ``[k + 1, V]``,
    ``uniforms`` at least ``k`` Python floats in (0, 1], ``exp_noise`` float32 ``[V]``.
    Returns ``(new_ids, tau)``: the ``tau`` kept drafts, then the one new token, as Python
    ints. Unchecked (the loop passes what it produced); tests pin it to ``block_verify``.

    The weights are a chain of ``k`` Python float products (one transfer of ``2k`` numbers),
    the residual sums one ``[k - 1, V]`` op, the race one more: three round trips to the
    tensors, against token-wise verification's one, because each step needs the last. A
    second path of the block rule, kept for speed: ``block_verify_prepared`` on a one-row
    batch gives the same tokens but costs about twice as much per call on a CPU.
    """
    k = draft_ids.shape[0]
    p, e = target_probs, exp_noise
    if not isinstance(e, torch.Tensor):  # the loop's NumPy noise rows (CPU)
        e = torch.from_numpy(e)
    if k == 0:
        return [int((p[0].float() / e).argmax())], 0
    idx = draft_ids + torch.arange(k) * p.shape[1]
    p_x = p.take(idx)
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs.take(idx)
    f = torch.cat((p_x, q_x)).tolist()
    ids = draft_ids.tolist()
    weight = [1.0]
    for j in range(k):
        num = weight[-1] * f[j]
        qx = f[k + j]
        w = 1.0 if num >= qx else num / qx
        weight.append(w if f[j] > 0.0 else 0.0)
    h = [0.0] * k
    if k > 1:
        w_in = torch.tensor(weight[1:k], dtype=torch.float64)
        if draft_probs is None:
            r = (w_in * (1.0 - p_x[1:].double())).tolist()
        else:
            r = (w_in[:, None] * p[1:k].double() - draft_probs[1:k].double()).clamp_min(0)
            r = r.sum(1).tolist()
        for j in range(k - 1):
            den = r[j] + 1.0 - weight[j + 1]
            h[j] = r[j] / den if den > 0 else 1.0
    h[k - 1] = weight[k]
    tau = 0
    for j in range(k):
        if uniforms[j] <= h[j]:
            tau = j + 1
    p_m = p[tau].float()
    if tau == k:
        w_race = p_m
    else:
        q_m = None if draft_probs is None else draft_probs[tau]
        w_race = weighted_residual(weight[tau], p_m, q_m, ids[tau])
    # (no residual mass at tau, by rounding: a race over p itself, as block_verify's)
    return ids[:tau] + [residual_race(w_race, e, p_m)], tau
