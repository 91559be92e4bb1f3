"""Autoregressive and speculative generation with KV caches.

``generate`` is plain decoding with the cache, the baseline every speedup is measured
against. ``speculative_generate`` is Leviathan et al. 2022 (arXiv:2211.17192), Algorithm 1,
on two ``CharGPT`` models: the draft proposes ``k`` tokens one at a time, the target scores
all of them in one forward pass, and ``verifier.rejection_sample`` keeps the accepted prefix
plus one recovered or bonus token. The output is distributed exactly as ``generate``'s (and at
temperature 0 it is the same tokens).

The caches, and the invariant that makes rollback a pointer move. With ``n`` committed tokens
``x[0..n-1]`` at the start of an iteration:

* the target cache holds exactly ``x[0..n-2]``: the last committed token is *pending*, and is
  fed together with the drafts, so one target call scores ``k + 1`` positions;
* the draft cache holds a prefix ``x[0..m-1]`` with ``m`` in ``{n-2, n-1}``; its first call of
  the iteration feeds the missing one or two tokens (the catch-up) with no extra call.

After verification accepts ``a`` drafts, ``n`` grows by ``a + 1``; the target cache is cropped
to ``n - 1`` (it scored ``x[n-1]``'s predecessors, drafts past the rejection are dropped),
the draft cache to ``min(its length, n - 1)``: after full acceptance the draft never saw its
own last draft, which becomes part of the next catch-up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from ._validate import check_int
from .model import CharGPT, KVCache, check_model
from .sampling import SamplingOptions, exp_noise, uniform_open_closed
from .verifier import VerifierInputs, rejection_sample_prepared

__all__ = ["SpecStats", "check_prompt", "generate", "speculative_generate", "caches_consistent"]


@dataclass
class SpecStats:
    """Counts from one ``speculative_generate`` call.

    ``accepted_per_iteration[i]`` is the number of drafts accepted in iteration ``i`` (each
    iteration also emits one token of the target's own). Target and draft calls count forward
    passes after the prompt's prefill (one prefill call each, not counted).
    """

    k: int = 0
    iterations: int = 0
    drafted: int = 0
    accepted_per_iteration: list[int] = field(default_factory=list)
    target_calls: int = 0
    draft_calls: int = 0
    emitted: int = 0
    rejections: int = 0  # iterations that stopped at a rejected draft
    # Wall-clock seconds spent in each kind of work (for profiles; not used by the rule).
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_iteration)

    @property
    def mean_accepted(self) -> float:
        """Mean drafts accepted per iteration."""
        return self.accepted / max(1, self.iterations)

    @property
    def acceptance_rate(self) -> float:
        """Estimate of alpha: accepted drafts / drafts that were verified.

        A draft after the first rejection of its iteration is never looked at, so the
        denominator counts the accepted drafts plus one per rejection, not every drafted
        token (that would bias the estimate low). This is the maximum-likelihood estimate of
        a per-position acceptance probability.
        """
        return self.accepted / max(1, self.accepted + self.rejections)

    @property
    def tokens_per_target_call(self) -> float:
        return self.emitted / max(1, self.target_calls)

    def add(self, other: SpecStats) -> SpecStats:
        """Add the counts and seconds of ``other`` (another call) to these; returns ``self``.

        The one way to total several calls: ``total = SpecStats(k=k)`` then
        ``total.add(stats)`` for each; every ratio above is then over all of them (a mean of
        per-call ratios would weight short calls like long ones). ``k`` is kept.
        """
        self.iterations += other.iterations
        self.drafted += other.drafted
        self.accepted_per_iteration.extend(other.accepted_per_iteration)
        self.target_calls += other.target_calls
        self.draft_calls += other.draft_calls
        self.emitted += other.emitted
        self.rejections += other.rejections
        for key, seconds in other.seconds.items():
            self.seconds[key] = self.seconds.get(key, 0.0) + seconds
        return self

    def summary(self) -> str:
        return (
            f"k={self.k}: {self.emitted} tokens in {self.iterations} iterations, "
            f"{self.target_calls} target calls, {self.draft_calls} draft calls; "
            f"acceptance {self.acceptance_rate:.3f}, mean accepted {self.mean_accepted:.3f}, "
            f"tokens per target call {self.tokens_per_target_call:.3f}"
        )


# ------------------------------------------------------------------------------ input checks


def check_prompt(model: CharGPT, prompt_ids, max_new_tokens: int, name="model") -> torch.Tensor:
    """The prompt as 1-D int64 ids, checked against ``model`` and ``max_new_tokens``.

    Accepts a 1-D tensor (or ``[1, T]``) or a list of ints. Raises ValueError when ``model``
    is not a ``CharGPT``, the prompt is empty or holds ids outside the vocabulary, or prompt
    plus ``max_new_tokens`` exceeds the model's context.
    """
    check_model(model, name)
    if isinstance(prompt_ids, torch.Tensor):
        ids = prompt_ids
    else:
        try:
            ids = torch.tensor(list(prompt_ids), dtype=torch.long)
        except (TypeError, ValueError):
            raise ValueError(
                "prompt_ids must be a 1-D int64 tensor or a list of ints; encode text with "
                "CharTokenizer.encode"
            ) from None
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"prompt_ids must be a 1-D int64 tensor; got shape {tuple(ids.shape)} {ids.dtype}"
        )
    if ids.numel() == 0:
        raise ValueError("prompt_ids is empty; give at least one token (e.g. a newline)")
    V = model.config.vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= V:
        raise ValueError(
            f"prompt_ids holds ids outside the vocabulary [0, {V}); encode the prompt with "
            "the model's CharTokenizer"
        )
    check_int(max_new_tokens, "max_new_tokens", minimum=0)
    total = ids.numel() + max_new_tokens
    if total > model.config.block_size:
        raise ValueError(
            f"prompt ({ids.numel()} tokens) + max_new_tokens ({max_new_tokens}) = {total} "
            f"exceeds the context of {model.config.block_size} positions the model was "
            "trained on; shorten the prompt or generate fewer tokens"
        )
    return ids.to(torch.long)


def _next_logits(model: CharGPT, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits ``[V]`` after the last of ``ids`` ``[1, T]``, extending ``cache`` (unchecked)."""
    return F.linear(model.decode_hidden(ids, cache)[0, -1], model.lm_head.weight)


def _all_logits(model: CharGPT, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits ``[T, V]`` for every one of ``ids`` ``[1, T]``, extending ``cache`` (unchecked)."""
    return F.linear(model.decode_hidden(ids, cache)[0], model.lm_head.weight)


def _gumbel(exp_draws: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise from Exp(1) draws: ``-log(E)`` (finite: the draws are > 0)."""
    return exp_draws.log().neg_()


# ------------------------------------------------------------------------------------ decoding


@torch.inference_mode()
def generate(
    model: CharGPT,
    prompt_ids,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Plain autoregressive decoding with the KV cache: one model call per new token.

    ``prompt_ids``: 1-D int64 ids (non-empty). Each new token is sampled from the model's
    next-token distribution after temperature, top-k and top-p (as
    ``sampling.process_logits``; ``temperature=0`` is greedy and draws no random numbers).
    Returns the 1-D sequence ``prompt + max_new_tokens`` new ids. Raises ValueError for an
    empty or out-of-vocabulary prompt, bad options, or a total length beyond the model's
    block size.
    """
    ids = check_prompt(model, prompt_ids, max_new_tokens)
    smp = SamplingOptions(temperature, top_k, top_p)
    n0 = ids.numel()
    end = n0 + max_new_tokens
    out = torch.empty(end, dtype=torch.long)
    out[:n0] = ids
    if max_new_tokens == 0:
        return out
    V = model.config.vocab_size
    noise = None if smp.greedy else _gumbel(exp_noise((max_new_tokens, V), generator=generator))
    cache = model.new_cache(1)
    logits = model(ids[None], cache)[0, -1]
    for i in range(n0, end):
        if smp.greedy:
            torch.argmax(logits, dim=-1, keepdim=True, out=out[i : i + 1])
        else:
            torch.argmax(
                smp.logits(logits) + noise[i - n0], dim=-1, keepdim=True, out=out[i : i + 1]
            )
        if i + 1 < end:
            logits = _next_logits(model, out[i : i + 1][None], cache)
    return out


@torch.inference_mode()
def speculative_generate(
    target: CharGPT,
    draft: CharGPT,
    prompt_ids,
    max_new_tokens: int,
    *,
    k: int = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    timings: bool = False,
    on_iteration=None,
) -> tuple[torch.Tensor, SpecStats]:
    """Speculative decoding: the draft proposes ``k`` tokens, the target verifies them at once.

    Same arguments and output as :func:`generate` (the 1-D sequence prompt + exactly
    ``max_new_tokens`` new ids), plus ``draft`` (a ``CharGPT`` with the same vocabulary) and
    ``k >= 1`` drafts per iteration. The draft samples each token from ``q`` after the same
    temperature / top-k / top-p processing as the target's ``p``; acceptance and the
    recovered/bonus token come from ``verifier`` (the batched rejection sampler, B = 1), so
    the output is distributed exactly as ``generate(target, ...)``'s, and at
    ``temperature=0`` it is the same tokens. The last iteration drafts fewer tokens when
    fewer are left to produce. ``timings=True`` fills ``SpecStats.seconds``;
    ``on_iteration(ids, target_cache, draft_cache, accepted)``, if given, is called after
    every iteration with the committed ids so far (for tests and the lesson's pictures).

    Random numbers, drawn once up front from ``generator``: ``E`` ``[max_new_tokens, k + 1,
    V]`` Exp(1) draws (row ``j < k`` of iteration ``i`` is the Gumbel noise ``-log E`` of
    draft ``j``, row ``k`` the verifier's race noise) and ``U`` ``[max_new_tokens, k]``
    float64 uniforms in (0, 1] for the accept tests. An iteration emits at least one token,
    so there are never more than ``max_new_tokens`` iterations.

    Returns ``(ids, SpecStats)``. Raises ValueError for bad prompts or options, or models
    with different vocabularies.
    """
    ids = check_prompt(target, prompt_ids, max_new_tokens, "target")
    check_prompt(draft, ids, max_new_tokens, "draft")
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(
            f"target and draft must share a vocabulary; got sizes {target.config.vocab_size} "
            f"and {draft.config.vocab_size}"
        )
    check_int(k, "k (drafts per iteration)")
    smp = SamplingOptions(temperature, top_k, top_p)
    greedy = smp.greedy
    V = target.config.vocab_size
    n = ids.numel()
    end = n + max_new_tokens
    out = torch.empty(end, dtype=torch.long)
    out[:n] = ids
    stats = SpecStats(k=k)
    clock = time.perf_counter if timings else None
    spent = {"draft": 0.0, "target": 0.0, "verify": 0.0}
    if max_new_tokens == 0:
        return out, stats

    E = exp_noise((max_new_tokens, k + 1, V), generator=generator)
    U = uniform_open_closed((max_new_tokens, k), generator=generator)
    G = None if greedy else _gumbel(E[:, :k])
    tc, dc = target.new_cache(1), draft.new_cache(1)
    if n > 1:  # prefill everything but the pending last token
        target(out[None, : n - 1], tc)
        draft(out[None, : n - 1], dc)
    # Buffers reused by every iteration: the pending token followed by the drafts (the
    # target's input), and the draft's processed logits.
    feed_buf = torch.empty(1, k + 1, dtype=torch.long)
    draft_logits = torch.empty(k, V)
    no_draft = torch.full((1, 1), -1, dtype=torch.long)
    it = 0
    while n < end:
        kk = min(k, end - n - 1)  # never draft tokens that could not be kept
        t0 = clock() if clock else 0.0
        feed_buf[0, 0] = out[n - 1]
        # --- draft: kk calls; the first one also feeds the catch-up tokens.
        feed = out[dc.length : n][None]
        for j in range(kk):
            lg = smp.logits(_next_logits(draft, feed, dc))
            draft_logits[j] = lg
            slot = feed_buf[0, j + 1 : j + 2]
            if greedy:
                torch.argmax(lg, dim=-1, keepdim=True, out=slot)
            else:
                torch.argmax(lg + G[it, j], dim=-1, keepdim=True, out=slot)
            feed = feed_buf[:, j + 1 : j + 2]
        t1 = clock() if clock else 0.0
        # --- target: the pending token and the kk drafts in one forward pass.
        p = smp.probs(_all_logits(target, feed_buf[:, : kk + 1], tc))[None]  # [1, kk + 1, V]
        t2 = clock() if clock else 0.0
        # --- verify (B = 1): accepted prefix + one recovered or bonus token.
        if kk:
            q = (
                torch.nn.functional.one_hot(draft_logits[:kk].argmax(-1), V).float()
                if greedy
                else draft_logits[:kk].softmax(-1)
            )
            inputs = VerifierInputs(
                feed_buf[:, 1 : kk + 1], q[None], p, U[it : it + 1, :kk], E[it : it + 1, k]
            )
        else:  # nothing left to draft: the verifier's bonus path samples from p alone
            inputs = VerifierInputs(
                no_draft, p[:, :1], p.expand(1, 2, V), U[it : it + 1, :1], E[it : it + 1, k]
            )
        token_ids, num_accepted = rejection_sample_prepared(inputs)
        a = int(num_accepted[0])
        out[n : n + a + 1] = token_ids[0, : a + 1]
        n += a + 1
        it += 1
        # --- roll back: pointer moves only (see the module docstring for the invariant).
        tc.crop(n - 1)
        dc.crop(min(dc.length, n - 1))
        stats.accepted_per_iteration.append(a)
        stats.rejections += a < kk
        stats.drafted += kk
        if on_iteration is not None:
            on_iteration(out[:n], tc, dc, a)
        if clock:
            t3 = clock()
            spent["draft"] += t1 - t0
            spent["target"] += t2 - t1
            spent["verify"] += t3 - t2
    stats.iterations = stats.target_calls = it
    stats.draft_calls = stats.drafted
    stats.emitted = max_new_tokens
    if timings:
        stats.seconds = spent
    return out, stats


def caches_consistent(
    model: CharGPT, cache: KVCache, ids: torch.Tensor, atol: float = 1e-5
) -> bool:
    """True when ``cache`` holds exactly the keys/values of a fresh run over ``ids[:length]``."""
    fresh = model.new_cache(1)
    with torch.inference_mode():
        model(ids[None, : cache.length], fresh)
    L = cache.length
    return torch.allclose(cache.k[..., :L, :], fresh.k[..., :L, :], atol=atol) and torch.allclose(
        cache.v[..., :L, :], fresh.v[..., :L, :], atol=atol
    )
