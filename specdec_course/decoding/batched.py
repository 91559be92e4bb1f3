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
call scores every row's block, the verifier (``verifier.rejection_sample_prepared`` on NumPy
views, ``_token_verify``; or ``block_verifier``) accepts a
different number in each row, and each row moves on by its own count. Rows that finish
early ride along (their work is discarded) until the last one is done. The loop has the
batch-1 loop's shape (propose, one target call, verify, commit, record); how each row
drafts is a drafter chosen once (``batch_drafts``: an n-gram table, the folded one-row
step, the ragged model step), the verdict a ``_BatchVerifier``, the seconds a
``recorder.Recorder``.

Both loops take the same lean steps (``fast.batch_steps``): for a batch,
``RaggedSteps`` (one ``index_copy_`` per layer writes every row's keys and values at its
own slots; the ragged mask is rows of the causal bias, selected, never built); for one row,
the batch-1 ``LeanStep``. Speculation on one row with the token rule is
``speculative_generate`` itself (its folded draft step, its verifier, its NumPy commits: a
batch of one has nothing to share out); with the block rule it takes the folded draft step.
So the baseline is never a slower step than the speculating arm's, and
``bench.batch_call_costs`` times these same calls. The
positions are the loop's committed lengths, so rollback is nothing at all; the per-row
bookkeeping (lengths, the commit as one indexed write, the accept counts) is NumPy on the
tensors' memory, with no Python per row.

Draft cache invariant: with ``n_b`` tokens committed in row ``b``, the draft's cache holds
``x[0 .. n_b - 3]`` and each proposal starts by feeding the last two committed tokens (the
batch-1 ``ModelProposer`` feeds one or two; here every row feeds two, so the call has one
shape for all rows). The target's cache holds ``x[0 .. n_b - 2]``, as at batch 1.
"""

from __future__ import annotations

import numpy as np
import torch

from .._validate import check_generator, check_ids, check_int, check_proposer_fits
from ..block_verifier import block_verify_prepared
from ..devices import with_native_cpu_kernels
from ..fast import batch_steps
from ..model import CharGPT, check_model
from ..sampling import SamplingOptions, exp_noise, uniform_open_closed
from ..verifier import VerifierInputs, greedy_accepted, rejection_sample_prepared
from .batch_drafts import batch_drafter
from .plain import gumbel
from .recorder import Recorder
from .spec_stats import SpecStats
from .speculative import speculative_generate

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
    if max_new_tokens == 0:
        return ids.clone()
    V = model.config.vocab_size
    noise = None if smp.greedy else gumbel(exp_noise((max_new_tokens, B, V), generator=generator))
    steps = batch_steps(model, B)  # the lean step for B rows (fast.ragged), as speculation's
    if n0 > 1:
        steps.prefill(ids[:, : n0 - 1])
    logits = torch.empty(B, V, dtype=model.lm_head.weight.dtype)
    steps.step_shared(ids[:, n0 - 1 :], n0 - 1, logits)
    new = torch.empty(max_new_tokens, B, dtype=torch.long)  # token i of every row: new[i]
    for i in range(max_new_tokens):
        row = logits if smp.greedy else smp.logits(logits) + noise[i]
        torch.argmax(row, -1, out=new[i])
        if i + 1 < max_new_tokens:
            steps.step_shared(new[i : i + 1].t(), n0 + i, logits)
    return torch.cat([ids, new.t()], dim=1)


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
    until: str = "all",
    timings=False,
) -> tuple[torch.Tensor, SpecStats]:
    """Speculative decoding of ``B`` prompts at once, each row accepting its own drafts.

    ``prompts`` int64 ``[B, T]`` with ``T >= 2`` (the draft feeds the last two committed
    tokens); ``draft`` a ``CharGPT`` with the target's vocabulary. Every row is decoded as
    ``speculative_generate`` decodes one sequence, with the batched verifier (``verify``
    ``"token"`` or ``"block"``): each row's output is distributed exactly as plain
    decoding's, and at ``temperature=0`` it is the target's greedy text. Returns ``(ids [B, T
    + max_new_tokens], SpecStats)``: ``iterations`` counts (row, iteration) pairs of rows
    still decoding, ``target_calls`` and ``draft_calls`` the batched forward calls,
    ``emitted`` all rows' new tokens. Random numbers come from ``generator`` in blocks of
    iterations (``_Noise``): the draft's Gumbel noise, then the verifier's uniforms and
    Exp(1) draws.
    ``draft``: a ``CharGPT`` (its lean steps), or an n-gram table (``ngram.NgramDraft``,
    ``distilled.load_distilled()``: every row's drafts looked up from its own context, ``q``
    the table rows they were drawn from).
    ``until="all"`` (the default) decodes until every row has ``max_new_tokens``: a static
    batch, where rows that finish early wait for the slowest. ``until="first"`` stops when
    the first row has them: the steady state of a continuously batched server, which hands a
    finished row's slot to the next request so that every row is always decoding (the bench
    measures it that way). Each row then holds what it committed (``stats.emitted`` in all;
    positions past a row's own tokens are ``-1``): the first tokens of the full run from
    the same seed, cut where the run stopped. Where it is cut depends on the rows' luck, so
    those rows are for timing, not for sampling.
    ``timings=True`` fills ``stats.seconds`` with the wall time of the prefills
    (``"prefill"``), the drafting (``"draft"``: the proposals and their random numbers), the
    target's calls (``"target"``), the verifier and the commit (``"verify"``) and the rest
    (``"rest"``), as ``speculative_generate`` does for one row (which a batch of one is);
    ``timings`` a clock (e.g. ``time.thread_time``, as the bench times) measures with it.
    Raises ValueError for bad prompts, options or models, or ``T + max_new_tokens + k``
    beyond the context (a finished row's drafts still take positions).
    """
    ids, table = _checked(target, draft, prompts, max_new_tokens, k, generator, verify, until)
    smp = SamplingOptions(temperature, top_k, top_p)
    B, n0 = ids.shape
    end = n0 + max_new_tokens
    if max_new_tokens == 0:
        return ids.clone(), SpecStats(k=k)
    if B == 1 and verify == "token":  # one row: the batch-1 loop itself (its steps, its rule)
        opts = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        out1, stats = speculative_generate(
            target, draft, ids[0], max_new_tokens, k=k, timings=timings, **opts
        )
        return out1[None], stats
    rec = Recorder(k, timings)  # the seconds per stage; the counts are made at the end
    stats = rec.stats
    V, dt = target.config.vocab_size, target.lm_head.weight.dtype
    rec.start("cpu")
    # k + 1 spare columns: a row's commit writes K + 1 tokens at n_b .. n_b + K (those past
    # its accepted ones land where it has not committed yet, and a later commit overwrites
    # them, or in the spare columns), so one indexed write serves every row.
    out = torch.zeros(B, end + k + 1, dtype=torch.long)
    out[:, :n0] = ids
    n = torch.full((B,), n0, dtype=torch.long)
    feed = torch.empty(k + 1, B, dtype=torch.long)  # the target's input: pending, drafts
    ts = batch_steps(target, B)  # the lean step for B rows and its cache (fast.ragged)
    ts.prefill(ids[:, : n0 - 1])
    drafter = batch_drafter(draft, table, smp, out, n, feed, k, dt)
    drafter.prefill(ids)
    rec.lap("prefill")
    noise = None if smp.greedy else _Noise(B, V, k, generator, table)
    # The loop's bookkeeping (lengths, accepted counts, commits) is NumPy on the tensors'
    # memory: a NumPy call on B numbers costs a microsecond or two, a tensor op four or more.
    n_h, out_h, feed_h = n.numpy(), out.numpy(), feed.numpy()
    offsets = torch.arange(-2, k + 1)  # slots n - 2 .. n + k of a row, relative to n
    cols, rows = np.arange(k + 1), np.arange(B)[:, None]
    t_logits = torch.empty(B * (k + 1), V, dtype=dt)
    verifier = _BatchVerifier(verify, smp, B, k)
    history = []  # (n, accepted) per iteration; the stats are counted once at the end
    while True:
        lo, hi = int(n_h.min()), int(n_h.max())
        if (lo if until == "all" else hi) >= end:
            break
        K = min(k, end - 1 - lo)  # drafts this iteration: what the furthest-behind row needs
        slots = n[:, None] + offsets[: K + 2]  # [B, K + 2]: positions n - 2 .. n + K - 1
        rec.tick()
        # --- 1. propose: K drafts for every row (the first feeds the last two committed)
        G, U, E = (None, None, None) if noise is None else noise.next()
        drafter.propose(K, lo, hi, slots, G)
        stats.draft_calls += K
        rec.lap("draft")
        # --- 2. score: every row's pending token and its drafts in one target call
        logits = ts.step(feed[: K + 1].t(), slots[:, 1:], hi + K, t_logits[: B * (K + 1)])
        stats.target_calls += 1
        rec.lap("target")
        # --- 3. verify: each row's accepted drafts and its one new token
        drafts = feed_h[1 : K + 1].T  # [B, K]
        if hi > end - 1 - K:  # a row with fewer tokens to go drafted too many: pad its tail
            drafts = np.where(cols[:K] < np.clip(end - 1 - n_h, 0, k)[:, None], drafts, -1)
        tok, a = verifier(drafts, logits.view(B, K + 1, V), drafter, U, E)
        # --- 4. commit: row b's a_b + 1 tokens at n_b .. n_b + a_b (one write; see `out`)
        out_h[rows, n_h[:, None] + cols[: tok.shape[1]]] = tok
        history.append((n_h.copy(), a))
        n_h += np.where(n_h < end, a + 1, 0)  # n (a tensor) sees it: the same memory
        # Rollback is nothing: the caches' positions are the loop's n (fast.ragged).
        rec.lap("verify")
    _count(stats, history, end, k)
    if until == "first":
        done = np.minimum(n_h, end)
        stats.emitted = int(done.sum()) - B * n0
        out_h[np.arange(end + k + 1)[None, :] >= done[:, None]] = -1
    else:
        stats.emitted = B * max_new_tokens
    rec.close()
    return out[:, :end], stats


def _checked(target, draft, prompts, max_new_tokens: int, k: int, generator, verify, until):
    # The entry checks: (ids [B, T], whether the draft is an n-gram table).
    check_int(k, "k (drafts per iteration)")
    ids = check_prompts(target, prompts, max_new_tokens, extra=k)
    # A table draft (ngram.NgramDraft, distilled.load_distilled()): no model, no cache.
    table = callable(getattr(draft, "propose_rows", None))
    if not table:
        if not isinstance(draft, CharGPT):
            raise ValueError(
                "draft must be a CharGPT or an n-gram table (ngram.NgramDraft, "
                f"distilled.load_distilled()); got {type(draft).__name__}"
            )
        check_model(draft, "draft")
    check_proposer_fits(draft, target)
    check_generator(generator)
    if ids.shape[1] < 2:
        raise ValueError("prompts must hold at least 2 tokens per row (the draft feeds two)")
    if verify not in ("token", "block"):
        raise ValueError(f"verify must be 'token' or 'block'; got {verify!r}")
    if until not in ("all", "first"):
        raise ValueError(f"until must be 'all' (every row done) or 'first'; got {until!r}")
    if not table:
        check_prompts(draft, ids, max_new_tokens, extra=k)
    return ids, table


class _BatchVerifier:
    """Every row's verdict: ``(tokens [B, K + 1], accepted [B])`` for drafts ``[B, K]``
    (``-1`` pads a row's tail) and the target's logits ``[B, K + 1, V]``; greedy at
    temperature 0, else the token rule (``_token_verify``) or the block rule
    (``block_verifier``) on ``p`` and the drafter's ``q``, with the iteration's uniforms
    ``U [B, k]`` and Exp(1) draws ``E [B, V]``."""

    def __init__(self, verify: str, smp: SamplingOptions, B: int, k: int):
        self.verify, self.smp = verify, smp

    def __call__(self, drafts, logits, drafter, U, E):
        K = drafts.shape[1]
        if self.smp.greedy:  # one-hot p and q: accept while the draft is the target's argmax
            best = logits.argmax(-1).numpy()  # [B, K + 1]
            return best, greedy_accepted(drafts, best)
        q = drafter.q(K)  # [B, K, V]: NumPy for a table, else a tensor
        p = self.smp.probs(logits).float()
        u, e = U[:, :K], E
        if self.verify == "block":
            ids_t = torch.from_numpy(np.ascontiguousarray(drafts))
            q_t = torch.from_numpy(q) if isinstance(q, np.ndarray) else q.contiguous()
            res = block_verify_prepared(VerifierInputs(ids_t, q_t, p, u.contiguous(), e))
            return res.token_ids.numpy(), res.num_accepted.numpy()
        # The token rule on NumPy views (_token_verify's): a few NumPy calls at these sizes.
        q_h = q if isinstance(q, np.ndarray) else q.numpy()
        res = rejection_sample_prepared(
            VerifierInputs(drafts, q_h, p.numpy(), u.numpy(), e.numpy())
        )
        return res.token_ids, res.num_accepted


class _Noise:
    """The loop's random numbers, drawn from ``generator`` a block of iterations at a time
    (one draw per kind and block, not three per iteration): per block of ``nb`` iterations
    the draft's Gumbel noise ``[nb, k, B, V]``, then the verifier's uniforms ``[nb, B, k]``
    (float64, (0, 1]) and Exp(1) draws ``[nb, B, V]``; ``next()`` hands out one iteration's
    three. An iteration with ``K < k`` drafts uses the first ``K`` of each."""

    def __init__(self, B: int, V: int, k: int, generator, table: bool = False):
        self.shape, self.generator, self.table = (B, V, k), generator, table
        self.nb = max(1, min(16, 2**16 // (B * V * (k + 1))))  # a block of ~64K numbers
        self.i = self.nb

    def next(self):
        if self.i == self.nb:
            (B, V, k), g, nb = self.shape, self.generator, self.nb
            if self.table:  # a table draft's inverse-CDF uniforms [nb, B, k], in [0, 1)
                self.G = torch.rand((nb, B, k), dtype=torch.float64, generator=g).numpy()
            else:
                self.G = gumbel(exp_noise((nb, k, B, V), generator=g))
            self.U = uniform_open_closed((nb, B, k), generator=g)
            self.E = exp_noise((nb, B, V), generator=g)
            self.i = 0
        self.i += 1
        return self.G[self.i - 1], self.U[self.i - 1], self.E[self.i - 1]


def _token_verify(x, q, p, u, e):
    """``verifier.rejection_sample_prepared`` (the one batched rule) on NumPy views:
    ``(accepted [B], new token [B])``.

    ``x`` int64 ``[B, K]`` drafts (``-1`` pads a row's tail), ``q`` ``[B, K, V]`` (any
    strides), ``p`` ``[B, K + 1, V]``, ``u`` float64 ``[B, K]`` in (0, 1], ``e`` float32
    ``[B, V]`` Exp(1) draws. NumPy, because at these sizes a few NumPy calls cost less than
    the same ops on tensors; the same rule, the same tokens (tests pin it)."""
    res = rejection_sample_prepared(VerifierInputs(x, q, p, u, e))
    a = res.num_accepted
    return a, res.token_ids[np.arange(len(a)), a]


def _count(stats: SpecStats, history, end: int, k: int) -> None:
    # Iterations, drafts, rejections and accepts per (row, iteration) of rows still decoding.
    if not history:
        return
    ns = np.stack([h[0] for h in history])  # [I, B]
    acc = np.stack([h[1] for h in history])
    active = ns < end
    kk = np.clip(end - 1 - ns, 0, k)
    stats.accepted_per_iteration.extend(acc[active].tolist())
    stats.iterations += int(active.sum())
    stats.drafted += int(kk.sum())
    stats.rejections += int(((acc < kk) & active).sum())
