"""Decoding a batch of prompts at once: plain, and speculative with ragged acceptance.

Serving engines decode many requests together: one forward call scores a token (or a block of
drafts) for every row, so a call's fixed cost is shared by ``B`` rows. That changes when
speculation pays. At batch 1 on a small model the target's ``(k + 1)``-token call costs
little more than a one-token step (the call's cost is its kernel launches); as ``B`` grows
the call's work grows with ``B * (k + 1)`` tokens and stops being nearly free, while the
drafts it verifies are still worth only ``alpha`` tokens each. Lesson 08 measures the ``B``
where speculation stops paying.

``generate_batch`` is the baseline: ``B`` rows of equal-length prompts, one call per token
for all rows (one shared cache length). ``speculative_generate_batch`` runs Leviathan et
al.'s loop on every row at once: the draft model proposes ``k`` tokens per row, one target
call scores every row's block, the batched verifier (``verifier.rejection_sample``, or
``block_verifier.block_verify``) accepts a different number in each row, and each row's
caches roll back to its own length (``model.ragged``). Rows that finish early ride along
(their work is discarded) until the last one is done. The batch-1 loop
(``speculative_generate``) stays the fast path for one sequence: this loop pays for its
generality with a few dozen batched ops per iteration.

Draft cache invariant: with ``n_b`` tokens committed in row ``b``, the draft's cache holds
``x[0 .. n_b - 3]`` and each proposal starts by feeding the last two committed tokens (the
batch-1 ``ModelProposer`` feeds one or two; here every row feeds two, so the call has one
shape for all rows). The target's cache holds ``x[0 .. n_b - 2]``, as at batch 1.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .._validate import check_generator, check_ids, check_int, check_proposer_fits
from ..block_verifier import block_verify
from ..devices import with_native_cpu_kernels
from ..model import CharGPT, check_model
from ..model.ragged import RaggedCache, ragged_forward
from ..sampling import SamplingOptions, exp_noise
from ..verifier import rejection_sample
from .plain import gumbel
from .stats import SpecStats

__all__ = ["check_prompts", "generate_batch", "speculative_generate_batch"]


def check_prompts(model: CharGPT, prompts, max_new_tokens: int, extra: int = 0) -> torch.Tensor:
    """``prompts`` as int64 ``[B, T]`` (equal lengths), checked against ``model``.

    ``prompts``: a tensor, array or list of equal-length rows of integer ids
    (``_validate.check_ids``). Raises ValueError for a non-2-D, ragged or empty batch, ids
    that are not integers or lie outside the vocabulary, or
    ``T + max_new_tokens + extra`` beyond the model's context (``extra``: positions a loop
    may write past the last kept token, e.g. ``k`` drafts of a finished row).
    """
    check_model(model)
    if isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], torch.Tensor):
        prompts = [p.tolist() if isinstance(p, torch.Tensor) else p for p in prompts]
    prompts = check_ids(prompts, "prompts", model.config.vocab_size, dim=2)
    if prompts.numel() == 0:
        raise ValueError(
            "prompts is empty; give a [B, T] batch of equal-length prompts, one per row "
            "(torch.stack a list of 1-D prompts)"
        )
    check_int(max_new_tokens, "max_new_tokens", minimum=0)
    total = prompts.shape[1] + max_new_tokens + extra
    if total > model.config.block_size:
        raise ValueError(
            f"prompt ({prompts.shape[1]}) + max_new_tokens ({max_new_tokens})"
            + (f" + {extra} positions of drafts" if extra else "")
            + f" = {total} exceeds the context of {model.config.block_size}; shorten the "
            "prompts or generate fewer tokens"
        )
    return prompts.to(torch.long)


@with_native_cpu_kernels
@torch.inference_mode()
def generate_batch(
    model: CharGPT,
    prompts,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Plain decoding of ``B`` prompts at once: one model call per new token for all rows.

    ``prompts`` int64 ``[B, T]``. Each row is sampled as ``generate`` samples one sequence
    (Gumbel-max over the processed logits; ``temperature=0`` is greedy). Returns ``[B, T +
    max_new_tokens]``. Raises ValueError for bad prompts or options.
    """
    ids = check_prompts(model, prompts, max_new_tokens)
    smp = SamplingOptions(temperature, top_k, top_p)
    check_generator(generator)
    B, n0 = ids.shape
    out = torch.empty(B, n0 + max_new_tokens, dtype=torch.long)
    out[:, :n0] = ids
    if max_new_tokens == 0:
        return out
    V, w = model.config.vocab_size, model.lm_head.weight
    noise = None if smp.greedy else gumbel(exp_noise((max_new_tokens, B, V), generator=generator))
    cache = model.new_cache(B)
    logits = model(ids, cache)[:, -1]
    for i in range(max_new_tokens):
        row = logits if smp.greedy else smp.logits(logits) + noise[i]
        out[:, n0 + i] = row.argmax(-1)
        if i + 1 < max_new_tokens:
            logits = F.linear(model.decode_hidden(out[:, n0 + i : n0 + i + 1], cache)[:, -1], w)
    return out


@with_native_cpu_kernels
@torch.inference_mode()
def speculative_generate_batch(
    target: CharGPT,
    draft: CharGPT,
    prompts,
    max_new_tokens: int,
    *,
    k: int = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    verify: str = "token",
) -> tuple[torch.Tensor, SpecStats]:
    """Speculative decoding of ``B`` prompts at once, each row accepting its own drafts.

    ``prompts`` int64 ``[B, T]`` with ``T >= 2`` (the draft feeds the last two committed
    tokens); ``draft`` a ``CharGPT`` with the target's vocabulary. Every row is decoded as
    ``speculative_generate`` decodes one sequence, with the batched verifier (``verify``
    ``"token"`` or ``"block"``): each row's output is distributed exactly as plain
    decoding's, and at ``temperature=0`` it is the target's greedy text. Returns ``(ids [B, T
    + max_new_tokens], SpecStats)``: ``iterations`` counts (row, iteration) pairs of rows
    still decoding, ``target_calls`` and ``draft_calls`` the batched forward calls,
    ``emitted`` all rows' new tokens. Random numbers come from ``generator``, per iteration:
    the draft's Gumbel noise ``[B, V]`` per step, then the verifier's uniforms and noise.
    Raises ValueError for bad prompts, options or models, or ``T + max_new_tokens + k``
    beyond the context (a finished row's drafts still take positions).
    """
    check_int(k, "k (drafts per iteration)")
    ids = check_prompts(target, prompts, max_new_tokens, extra=k)
    check_model(draft, "draft")
    check_proposer_fits(draft, target)
    check_generator(generator)
    V = target.config.vocab_size
    if ids.shape[1] < 2:
        raise ValueError("prompts must hold at least 2 tokens per row (the draft feeds two)")
    if verify not in ("token", "block"):
        raise ValueError(f"verify must be 'token' or 'block'; got {verify!r}")
    check_prompts(draft, ids, max_new_tokens, extra=k)
    smp = SamplingOptions(temperature, top_k, top_p)
    B, n0 = ids.shape
    end = n0 + max_new_tokens
    # k + 1 spare columns: a row's commit may write past `end` into them (then discarded),
    # so one scatter serves every row without clamping indices.
    out = torch.zeros(B, end + k + 1, dtype=torch.long)
    out[:, :n0] = ids
    stats = SpecStats(k=k)
    if max_new_tokens == 0:
        return out[:, :end], stats
    verifier = block_verify if verify == "block" else rejection_sample
    tc, dc = RaggedCache(target, B), RaggedCache(draft, B)
    ragged_forward(target, ids[:, : n0 - 1], tc)
    if n0 > 2:
        ragged_forward(draft, ids[:, : n0 - 2], dc)
    wt, wd = target.lm_head.weight, draft.lm_head.weight
    n = torch.full((B,), n0, dtype=torch.long)
    rows = torch.arange(B)
    cols = torch.arange(k + 1)
    while True:
        active = n < end
        n_active = int(active.sum())
        if n_active == 0:
            break
        kk = torch.where(active, (end - n - 1).clamp(max=k), 0)  # drafts per row
        K = int(kk.max())
        # --- draft: K steps for every row (the first feeds the last two committed tokens)
        drafts = torch.zeros(B, K, dtype=torch.long)
        q = None if smp.greedy or K == 0 else torch.empty(B, K, V)
        if K:
            nxt = out[rows[:, None], n[:, None] + torch.tensor([-2, -1])]
            for j in range(K):
                h = ragged_forward(draft, nxt, dc)[:, -1]
                logits = smp.logits(F.linear(h, wd))
                if smp.greedy:
                    drafts[:, j] = logits.argmax(-1)
                else:
                    drafts[:, j] = (logits + gumbel(exp_noise((B, V), generator=generator))).argmax(
                        -1
                    )
                    q[:, j] = logits.softmax(-1)
                nxt = drafts[:, j : j + 1]
            stats.draft_calls += K
        # --- target: every row's pending token and its drafts in one call
        feed = torch.cat([out[rows, n - 1][:, None], drafts], dim=1)
        logits = F.linear(ragged_forward(target, feed, tc), wt)  # [B, K + 1, V]
        stats.target_calls += 1
        p = smp.probs(logits)
        padded = torch.where(cols[None, :K] < kk[:, None], drafts, -1)
        res = verifier(padded, q, p.float(), generator=generator)
        a = res.num_accepted
        # --- commit: row b writes its a_b + 1 tokens at n_b .. n_b + a_b (finished rows: none)
        write = (cols[None, : K + 1] <= a[:, None]) & active[:, None]
        idx = n[:, None] + cols[None, : K + 1]
        old = out.gather(1, idx)
        out.scatter_(1, idx, torch.where(write, res.token_ids.clamp_min(0), old))
        n = torch.where(active, n + a + 1, n)
        tc.crop(n - 1)
        if K:  # with no drafts the draft was not fed; every row is then done
            dc.crop(n - 2)
        acc = a[active].tolist()
        stats.accepted_per_iteration.extend(acc)
        stats.iterations += n_active
        stats.drafted += int(kk.sum())
        stats.rejections += int(((a < kk) & active).sum())
    stats.emitted = B * max_new_tokens
    return out[:, :end], stats
