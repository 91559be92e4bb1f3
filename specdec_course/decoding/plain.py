"""Plain autoregressive decoding with the KV cache: the baseline every speedup is measured
against, and the checks every decoding loop shares.
"""

from __future__ import annotations

import torch

from .._validate import check_generator, check_ids, check_int
from ..devices import with_native_cpu_kernels
from ..fast import FoldedCache, steps_for
from ..model import CharGPT, KVCache, check_model
from ..sampling import SamplingOptions, exp_noise

__all__ = [
    "check_prompt",
    "check_executor",
    "check_stop_ids",
    "first_stop",
    "generate",
    "caches_consistent",
    "gumbel",
]


# ------------------------------------------------------------------------------ input checks


def check_prompt(model: CharGPT, prompt_ids, max_new_tokens: int, name="model") -> torch.Tensor:
    """The prompt as 1-D int64 ids, checked against ``model`` and ``max_new_tokens``.

    Accepts a 1-D integer tensor or array (or ``[1, T]``) or a list of ints
    (``_validate.check_ids``: a float is refused, never truncated). Raises ValueError when
    ``model`` is not a ``CharGPT``, the prompt is empty, not integer ids or holds ids outside
    the vocabulary, ``max_new_tokens`` is not an int >= 0, or prompt plus
    ``max_new_tokens`` exceeds the model's context.
    """
    check_model(model, name)
    V = model.config.vocab_size
    ids = check_ids(prompt_ids, "prompt_ids", V)
    if ids.numel() == 0:
        raise ValueError("prompt_ids is empty; give at least one token (e.g. a newline)")
    check_int(max_new_tokens, "max_new_tokens", minimum=0)
    total = ids.numel() + max_new_tokens
    if total > model.config.block_size:
        raise ValueError(
            f"prompt ({ids.numel()} tokens) + max_new_tokens ({max_new_tokens}) = {total} "
            f"exceeds the context of {model.config.block_size} positions the model was "
            "trained on; shorten the prompt or generate fewer tokens"
        )
    return ids.to(torch.long)


def check_stop_ids(stop_ids, vocab_size: int) -> frozenset | None:
    """``stop_ids`` (ids that end a generation, e.g. a chat model's end of turn) as a set, or
    None for None; ValueError unless each is an int id of the vocabulary."""
    if stop_ids is None:
        return None
    if isinstance(stop_ids, (str, bytes)) or not hasattr(stop_ids, "__iter__"):
        raise ValueError(f"stop_ids must be a collection of token ids; got {stop_ids!r}")
    ids = list(stop_ids)
    for i, t in enumerate(ids):
        check_int(t, f"stop_ids[{i}]", minimum=0)
        if t >= vocab_size:
            raise ValueError(f"stop_ids[{i}] = {t} is outside the vocabulary of {vocab_size}")
    return frozenset(int(t) for t in ids)


def first_stop(seq, start: int, end: int, stop: frozenset | None) -> int | None:
    """The length that keeps ``seq[:j + 1]``, where ``seq[j]`` is the first id of
    ``seq[start:end]`` in ``stop``; None when there is none (or ``stop`` is None)."""
    if stop:
        for j in range(start, end):
            if int(seq[j]) in stop:
                return j + 1
    return None


def gumbel(exp_draws: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise from Exp(1) draws: ``-log(E)`` (finite: the draws are > 0)."""
    return exp_draws.log().neg_()


# ------------------------------------------------------------------------------------ decoding


@with_native_cpu_kernels
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
    cuda_graphs: bool = False,
    executor: str = "torch",
    stop_ids=None,
) -> torch.Tensor:
    """Plain autoregressive decoding with the KV cache: one model call per new token.

    ``prompt_ids``: 1-D int64 ids (non-empty), on any device. Each new token is sampled from
    the model's next-token distribution after temperature, top-k and top-p (as
    ``sampling.process_logits``; ``temperature=0`` is greedy and draws no random numbers),
    with Gumbel noise drawn from ``generator`` on its own device (a CPU generator gives the
    same noise whatever device the model is on). Each step is ``fast.lean_step(model)``
    (``fast.lean``), the same one-token step the draft model takes in speculative decoding,
    so a speedup over this loop is not a speedup over a slower step. ``cuda_graphs=True``
    replays each step as a CUDA graph (``fast.graphs``; the model must be on a CUDA
    GPU); ``executor="numpy"`` runs each step in NumPy (``fast.numpy_steps``; a CPU model of
    dtype float32 or float64), as ``bench speedup --target-executor numpy`` times both arms.
    Returns the 1-D
    sequence ``prompt + max_new_tokens`` new ids on the model's device; with ``stop_ids``
    (e.g. a chat model's end-of-turn ids) it ends at the first of them, which it keeps.
    Raises ValueError for an empty or out-of-vocabulary prompt, bad options, a total length
    beyond the model's block size, or ``cuda_graphs`` with a model that is not on a CUDA GPU.
    """
    ids = check_prompt(model, prompt_ids, max_new_tokens)
    smp = SamplingOptions(temperature, top_k, top_p)
    check_generator(generator)
    stop = check_stop_ids(stop_ids, model.config.vocab_size)
    dev = model.lm_head.weight.device
    n0 = ids.numel()
    end = n0 + max_new_tokens
    out = torch.empty(end, dtype=torch.long, device=dev)
    out[:n0] = ids
    if max_new_tokens == 0:
        return out
    V = model.config.vocab_size
    noise = None
    if not smp.greedy:
        noise = gumbel(exp_noise((max_new_tokens, V), generator=generator, device=dev))
    # One-token steps: the lean step (fast.lean; NumPy with executor="numpy") or, with
    # graphs, a graph replay.
    steps = steps_for(model, "target", 1, cuda_graphs, numpy=check_executor(executor))
    cache = steps.cache
    logits = model(out[None, :n0], cache)[0, -1:]  # [1, V]
    for i in range(n0, end):
        slot = out[i : i + 1]
        if smp.greedy:
            torch.argmax(logits, dim=-1, out=slot)
        else:
            torch.argmax(smp.logits(logits) + noise[i - n0], dim=-1, out=slot)
        if stop and int(slot) in stop:
            return out[: i + 1]
        if i + 1 < end:
            logits = steps(slot[None])
    return out


def check_executor(executor) -> bool:
    """True for ``executor="numpy"`` (the target's chain steps in NumPy), False for
    ``"torch"`` (tensor ops, the default); ValueError for anything else."""
    if executor not in ("torch", "numpy"):
        raise ValueError(f"executor must be 'torch' or 'numpy'; got {executor!r}")
    return executor == "numpy"


def crop_caches(target_cache: KVCache, draft_cache: KVCache, n: int) -> None:
    """Roll both caches of a one-row speculative loop back after a verification that left
    ``n`` committed tokens (step 4 of lesson 04's loop): the target's cache keeps every
    committed token but the newest, which is pending (the next call feeds it with the next
    drafts); the draft's keeps no more than that, and catches up at its next call on what
    it lacks. Exercise 04 works out the rule, for a batch."""
    target_cache.crop(n - 1)
    draft_cache.crop(min(draft_cache.length, n - 1))


def caches_consistent(
    model: CharGPT, cache: KVCache, ids: torch.Tensor, atol: float = 1e-5
) -> bool:
    """True when ``cache`` holds exactly the keys/values of a fresh run over ``ids[:length]``.

    A ``FoldedCache`` (a one-layer draft's ``fast.draft_step``) is compared in its own layout:
    the fresh run's keys transposed, its values times the output projection, per head."""
    fresh = model.new_cache(1)
    with torch.inference_mode():
        model(ids[None, : cache.length].to(fresh.k.device), fresh)
    L = cache.length
    if isinstance(cache, FoldedCache):
        nh, C = model.config.n_head, model.config.n_embd
        w = model.transformer.h[0].attn.c_proj.weight.detach().view(C, nh, C // nh)
        k = fresh.k[0, 0, :, :L].transpose(0, 1).reshape(L, C)  # [L, C], head by head
        vp = torch.einsum("hjd,chd->jhc", fresh.v[0, 0, :, :L], w).reshape(L, nh * C)
        return torch.allclose(cache.k[:L], k, atol=atol) and torch.allclose(
            cache.v[:L], vp, atol=atol
        )
    return torch.allclose(cache.k[..., :L, :], fresh.k[..., :L, :], atol=atol) and torch.allclose(
        cache.v[..., :L, :], fresh.v[..., :L, :], atol=atol
    )
