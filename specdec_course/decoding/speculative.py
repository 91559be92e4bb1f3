"""Speculative decoding at batch 1: draft, verify in one target call, commit, repeat.

Leviathan et al. 2023 (arXiv:2211.17192), Algorithm 1, with any proposer (the 1-layer draft
model, the n-gram draft, ...; see ``proposer``). The output is distributed exactly as
``generate``'s; at temperature 0 it is the same tokens.

The caches, and the invariant that makes rollback a pointer move. With ``n`` committed tokens
``x[0..n-1]`` at the start of an iteration, the target cache holds exactly ``x[0..n-2]``: the
last committed token is *pending* and is fed together with the drafts, so one target call
scores ``k + 1`` positions. After verification accepts ``a`` drafts, ``n`` grows by
``a + 1`` and the target cache is cropped to ``n - 1``: positions past it (the rejected
drafts) are simply overwritten by the next call. The proposer is told ``n`` and rolls back
its own state (the draft model crops its cache the same way).

The loop is lean on purpose (on a CPU at batch 1 every tensor op costs microseconds, and a
draft step costs about a hundred): one cached forward per draft token, one per target call,
the batch-1 verifier ``verifier.rejection_sample_row`` (a dozen ops and one transfer to
Python), and pointer moves. ``timings=True`` splits the wall time into the prefill (the
proposer's start and the target's prompt), draft, target, verify and the rest.
"""

from __future__ import annotations

import time

import torch

from .. import devices
from .._validate import check_generator, check_int, check_proposer_fits
from ..block_verifier import block_verify_row
from ..devices import check_same_device, with_native_cpu_kernels
from ..model import CharGPT
from ..sampling import NoiseBlocks, SamplingOptions, uniform_open_closed
from ..verifier import rejection_sample_row
from .dynamic import check_policy
from .graphs import steps_for
from .plain import check_prompt
from .proposer import ModelProposer, as_proposer
from .stats import SpecStats

__all__ = ["speculative_generate"]

# Noise rows drawn at a time (``sampling.NoiseBlocks``): an iteration uses one for the race,
# and a run of 200 new tokens takes 40 to 100 iterations.
_BLOCK = 32


@with_native_cpu_kernels
@torch.inference_mode()
def speculative_generate(
    target: CharGPT,
    draft,
    prompt_ids,
    max_new_tokens: int,
    *,
    k: int = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    timings=False,
    on_iteration=None,
    cuda_graphs: bool = False,
    k_policy=None,
    verify: str = "token",
) -> tuple[torch.Tensor, SpecStats]:
    """Speculative decoding: the draft proposes ``k`` tokens, the target verifies them at once.

    Same arguments and output as :func:`generate` (the 1-D sequence prompt + exactly
    ``max_new_tokens`` new ids), plus ``draft`` (a ``CharGPT`` with the same vocabulary, or
    any proposer, e.g. ``ngram.NgramDraft``) and ``k >= 1`` drafts per iteration. The draft
    samples each token from ``q`` after the same temperature / top-k / top-p processing as
    the target's ``p``; the batch-1 verifier keeps the accepted prefix and one recovered or
    bonus token, so the output is distributed exactly as ``generate(target, ...)``'s, and at
    ``temperature=0`` it is the same tokens. An iteration drafts at most the tokens still
    needed, so a large ``k`` costs nothing extra. ``timings=True`` fills
    ``SpecStats.seconds`` (prefill, draft, target, verify, rest) by the wall clock, or by
    ``timings`` itself where it is a clock (e.g. ``time.thread_time``, as the bench times);
    ``on_iteration(ids, target_cache, draft_cache, accepted)``, if given, is called after
    every iteration with the committed ids so far (``draft_cache`` is the draft model's
    cache, ``None`` for other proposers).
    ``cuda_graphs=True`` replays the target's steps and the draft model's as CUDA graphs
    (``decoding.graphs``; the models must be on a CUDA GPU).

    ``k_policy`` (``decoding.dynamic``: ``HeuristicK``, ``ControllerK``, ...) picks each
    iteration's number of drafts, at most ``k``, from past outcomes only; ``verify="block"``
    verifies the drafted block jointly (``block_verifier``; Sun et al. 2024) instead of token
    by token (``"token"``). Both keep the output exact; at temperature 0 both verifiers are
    the same argmax rule. A proposer with ``observe_target`` (``eagle.EagleProposer``) is
    passed the target's last hidden states after every target call (see ``proposer``); it
    needs ``cuda_graphs=False``.

    Random numbers, drawn from ``generator``: first float64 uniforms in (0, 1] ``[m, k']``
    for the accept tests (``m`` = ``max_new_tokens``: an iteration emits at least one token;
    ``k' = min(k, m - 1)``), then what the proposer draws in ``start``; during the run, one
    Exp(1) row ``[V]`` per iteration for the verifier's race and the proposer's own noise
    (the draft model: one Gumbel row per draft), each drawn in blocks as the run uses them
    (``sampling.NoiseBlocks``), so a run that accepts many drafts draws few rows.

    Models, proposer and the returned ids live on the target's device (the prompt may be
    anywhere). Returns ``(ids, SpecStats)``. Raises ValueError, on entry, for bad prompts or
    options, a draft that is neither a ``CharGPT`` nor a proposer, a vocabulary or a device
    that differs (``_validate.check_proposer_fits``: also ids that mean other characters, and
    a proposer built for another target), ``cuda_graphs`` off a CUDA GPU or with a proposer
    that observes the target; and, during the run, a ``k_policy`` whose ``next_k()`` is not
    an int >= 0.
    """
    wall = timings if callable(timings) else time.perf_counter
    wall0 = wall()
    ids = check_prompt(target, prompt_ids, max_new_tokens, "target")
    proposer = as_proposer(draft, cuda_graphs=cuda_graphs)
    check_proposer_fits(proposer, target)
    if isinstance(draft, CharGPT):
        check_prompt(draft, ids, max_new_tokens, "draft")
    dev = target.lm_head.weight.device
    if getattr(proposer, "device", dev) != dev:
        check_same_device("the draft", proposer.device, "the target", dev)
    V = target.config.vocab_size
    check_int(k, "k (drafts per iteration)")
    check_generator(generator)
    if verify not in ("token", "block"):
        raise ValueError(f"verify must be 'token' or 'block'; got {verify!r}")
    policy = None if k_policy is None else check_policy(k_policy)
    smp = SamplingOptions(temperature, top_k, top_p)
    greedy = smp.greedy
    n = ids.numel()
    end = n + max_new_tokens
    out = torch.empty(end, dtype=torch.long, device=dev)
    out[:n] = ids
    stats = SpecStats(k=k)
    if max_new_tokens == 0:
        return out, stats
    k = min(k, max_new_tokens - 1)  # never more drafts than could be kept: k' in the docstring

    host = dev.type == "cpu"  # CPU tensors are written and read through NumPy views
    U = None if greedy else uniform_open_closed((max_new_tokens, k), generator=generator).tolist()
    # One Exp(1) row per iteration for the race, drawn in blocks as iterations use them.
    R = None
    if not greedy:
        R = NoiseBlocks(V, max_new_tokens, block=_BLOCK, generator=generator, device=dev, host=host)
    clock = (timings if callable(timings) else devices.clock(dev)) if timings else None
    t_pre = clock() if clock else 0.0  # the prefill: the proposer's start and the target's
    proposer.start(out, n, smp, generator, max_new_tokens, k)
    t_pre = (clock() - t_pre) if clock else 0.0
    if policy is not None:
        policy.start(k)
    verify_row = block_verify_row if verify == "block" else rejection_sample_row
    draft_cache = proposer.cache if isinstance(proposer, ModelProposer) else None
    # An EAGLE-style draft reads the target's features: looked up once, so that proposers
    # without the hook keep the plain step (one branch per iteration is all they pay).
    observe = getattr(proposer, "observe_target", None)
    if observe is not None and cuda_graphs:
        raise ValueError("a proposer with observe_target runs eager steps; drop cuda_graphs")
    step = steps_for(target, "target", k + 1, cuda_graphs)  # logits of [1, T] new tokens
    tc = step.cache
    lean = step.lean if observe is not None else None  # eager here: graphs were refused
    wide = getattr(proposer, "feature_layers", 1)  # several blocks' outputs (EAGLE-3 style)
    w = target.lm_head.weight
    if n > 1:  # prefill everything but the pending last token
        t0 = clock() if clock else 0.0
        if observe is None:
            target(out[None, : n - 1], tc)
        else:  # the prompt's features too: the proposer need not compute them again
            observe(lean.hidden(out[: n - 1], tc, layers=wide), 0)
        t_pre += (clock() - t0) if clock else 0.0
    # The target's input: the pending token followed by the drafts, written in place.
    feed = torch.empty(1, k + 1, dtype=torch.long, device=dev)
    drafts = feed[0, 1:]
    feeds = [feed[:, : j + 1] for j in range(k + 1)]  # the call's input for kk drafts
    # p for kk drafts is written into probs[kk] (no allocation per iteration); xs[kk] are
    # the drafts as the verifier reads them (NumPy views on a CPU, for the token rule).
    pdt = w.dtype  # in the dtype the processed logits take (filters compute in float32)
    if smp.changes_logits and not greedy:
        pdt = smp.logits(torch.zeros(1, V, dtype=w.dtype, device=dev)).dtype
    probs = torch.empty(k + 1, V, dtype=pdt, device=dev)
    probs = [probs[: j + 1] for j in range(k + 1)]
    # The token rule reads p and q through NumPy views on a CPU: p's are made once here;
    # q's is remade only when the proposer returns another tensor (the n-gram draft returns
    # views of one buffer, the draft model a new softmax each time).
    probs_h = [t.numpy() for t in probs] if host and verify == "token" else None
    q_last = q_h = None
    spent = dict.fromkeys(("draft", "target", "verify"), 0.0)
    it = drafted = rejections = 0
    accepted = stats.accepted_per_iteration
    feed[0, 0] = out[n - 1]
    out_h, feed_h = (out.numpy(), feed.numpy()) if host else (None, None)
    xs = [(feed_h[0, 1:] if host and verify == "token" else drafts)[:j] for j in range(k + 1)]
    processed = smp.changes_logits  # temperature 1, no filters: the logits are p's own
    while n < end:
        # --- 1. draft: kk tokens and their q from the proposer
        t0 = clock() if clock else 0.0
        kk = min(k, end - n - 1)  # never draft tokens that could not be kept
        if policy is not None:
            kk = max(0, min(kk, policy.next_k()))
        q = None
        if kk:
            kk, q = proposer.propose(out, n, kk, drafts)
        # --- 2. score: one target call over the pending token and the kk drafts (p_1 .. p_kk+1)
        t1 = clock() if clock else 0.0
        if observe is None:
            logits = step(feeds[kk])
        else:  # the lean step's own arithmetic, with the features passed on first
            hidden = lean.hidden(feeds[kk][0], tc, layers=wide)
            observe(hidden, n - 1)
            if wide > 1:  # lm_head reads the last n_embd columns
                hidden = hidden[:, -lean.C :]
            logits = torch.mm(hidden, lean.w_t, out=step.out[: kk + 1])
        # --- 3. verify: accept drafts while the rule says so, then one token of the target's
        t2 = clock() if clock else 0.0
        if greedy:
            # One-hot p and q: the batch-1 verifier reduces to "accept while the draft is the
            # target's argmax, then emit the argmax" (tests pin it to rejection_sample).
            best = logits.argmax(-1).tolist()
            a = 0
            if kk:
                dl = xs[kk].tolist()
                while a < kk and dl[a] == best[a]:
                    a += 1
            new = best[:a] if not kk else dl[:a]
            new.append(best[a])
        else:
            p = torch.softmax(smp.logits(logits) if processed else logits, -1, out=probs[kk])
            if probs_h is not None:
                p = probs_h[kk]
                if q is not None and q is not q_last:
                    q_last, q_h = q, q.numpy()
                q = None if q is None else q_h
            new, a = verify_row(xs[kk], q, p, U[it], R.row())
        # --- 4. commit: the accepted drafts and the new token; the caches roll back to them
        t3 = clock() if clock else 0.0
        if host:  # NumPy writes: a tensor's item assignment costs microseconds each
            if a:
                out_h[n : n + a] = feed_h[0, 1 : a + 1]
            out_h[n + a] = feed_h[0, 0] = new[a]
        else:
            if a:
                out[n : n + a] = drafts[:a]
            out[n + a] = feed[0, 0] = new[a]  # the new token, and the next call's pending one
        n += a + 1
        it += 1
        tc.crop(n - 1)  # roll back: a pointer move (see the module docstring)
        proposer.commit(out, n)
        accepted.append(a)
        rejections += a < kk
        if policy is not None:
            policy.update(kk, a)
        drafted += kk
        if on_iteration is not None:
            on_iteration(out[:n], tc, draft_cache, a)
        if clock:
            spent["draft"] += t1 - t0
            spent["target"] += t2 - t1
            spent["verify"] += t3 - t2
    stats.iterations = stats.target_calls = it
    stats.drafted = stats.draft_calls = drafted
    stats.rejections = rejections
    stats.emitted = max_new_tokens
    if timings:
        spent["prefill"] = t_pre
        spent["rest"] = wall() - wall0 - sum(spent.values())
        stats.seconds = spent
    return out, stats
