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

The loop reads as Algorithm 1: propose, one target call, verify, commit and crop, record.
What is not the algorithm is a collaborator chosen once per run, each in its own module:

- ``scoring``: how the target scores the pending token and the drafts (its eager lean step,
  NumPy with ``executor="numpy"``, CUDA-graph replays, or split at the features for a proposer
  that reads them), with its cache and its input buffer;
- ``row_verifier``: how a row is verified (greedy; the token rule
  ``verifier.rejection_sample_row``; the block rule ``block_verifier.block_verify_row``),
  with the random numbers it consumes;
- ``dynamic``: how many drafts to ask for (a fixed ``k``, or a ``k_policy``; ``k="auto"``:
  ``auto_k``, from what the calls cost here);
- ``recorder``: ``SpecStats``, the seconds per stage with ``timings`` (the prefill, draft,
  target, verify and the rest) and the ``on_iteration`` callback.

Lesson 04 writes the same loop in cells, with tensors only; the package's commits go
through NumPy views on a CPU, where a tensor's item write costs microseconds.
"""

from __future__ import annotations

import torch

from .._validate import check_generator, check_int
from ..block_verifier import block_verify_row
from ..devices import with_native_cpu_kernels
from ..drafts.proposer import fitted_proposer
from ..model import CharGPT
from ..sampling import SamplingOptions
from ..verifier import rejection_sample_row
from . import auto_k
from .dynamic import FixedK, check_policy
from .plain import check_executor, check_prompt, check_stop_ids, first_stop
from .recorder import Recorder
from .row_verifier import row_verifier
from .scoring import target_scorer
from .spec_stats import SpecStats

__all__ = ["speculative_generate"]


@with_native_cpu_kernels
@torch.inference_mode()
def speculative_generate(
    target: CharGPT,
    draft,
    prompt_ids,
    max_new_tokens: int,
    *,
    k: int | str = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    timings=False,
    on_iteration=None,
    cuda_graphs: bool = False,
    k_policy=None,
    verify: str = "token",
    executor: str = "torch",
    stop_ids=None,
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
    (``fast.graphs``; the models must be on a CUDA GPU); ``executor="numpy"`` runs the
    target's steps in NumPy, as ``generate(..., executor="numpy")`` does. ``stop_ids``
    ends the output at the first of those ids committed, as ``generate`` does (the same
    law: what follows a stop is never looked at); ``SpecStats.emitted`` counts what is kept.

    ``k="auto"`` (``auto_k.AutoK``) picks each iteration's ``k`` from 0 (a plain step) to
    ``auto_k.K_MAX`` by the expected tokens per second, from the seconds this run's calls
    take on this machine and the acceptance it sees, remembered for ``draft`` from one call
    to the next; output exact, as with any policy (greedy: the target's text; sampled: the
    same law, though the text may change from run to run with the clock).
    ``k_policy`` (``decoding.dynamic``: ``HeuristicK``, ``ControllerK``, ``AutoK``, ...) picks
    each iteration's number of drafts, at most ``k``, from past outcomes only; ``verify="block"``
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
    rec = Recorder(k, timings, on_iteration)  # counts, seconds per stage, callbacks
    ids, proposer, k, policy = _checked(
        target, draft, prompt_ids, max_new_tokens, k, generator, verify, k_policy, cuda_graphs
    )
    rec.stats.k = k
    rec.feed(policy)  # a policy that measures (k="auto") hears each iteration's seconds
    smp = SamplingOptions(temperature, top_k, top_p)
    stop = check_stop_ids(stop_ids, target.config.vocab_size)
    dev = target.lm_head.weight.device
    n = n0 = ids.numel()
    end = n + max_new_tokens
    out = torch.empty(end, dtype=torch.long, device=dev)
    out[:n] = ids
    if max_new_tokens == 0:
        return out, rec.stats
    k = min(k, max_new_tokens - 1)  # never more drafts than could be kept: k' in the docstring
    # Chosen once: how the target scores (its step, its cache, and its input, whose draft
    # slots the proposer writes) and how a row is verified (the token rule or the block
    # rule, with the random numbers it will use, drawn now).
    scorer = target_scorer(target, proposer, k, cuda_graphs, check_executor(executor))
    rule = rejection_sample_row if verify == "token" else block_verify_row
    verifier = row_verifier(rule, smp, target, scorer.drafts, max_new_tokens, generator)
    rec.start(dev)
    proposer.start(out, n, smp, generator, max_new_tokens, k)
    scorer.prefill(out, n)  # the prompt but its last token, which is pending
    rec.lap("prefill")
    policy.start(k)
    # Commits write through NumPy views on a CPU (a tensor item write costs microseconds).
    seq, drafts = (
        (out.numpy(), scorer.drafts.numpy()) if dev.type == "cpu" else (out, scorer.drafts)
    )
    while n < end:
        rec.tick()
        # --- 1. propose: up to k tokens after out[:n], and the q each was drawn from
        ask = kk = min(k, end - n - 1, policy.next_k())  # never drafts that cannot be kept
        q = None
        if kk:
            kk, q = proposer.propose(out, n, kk, scorer.drafts)
        rec.lap("draft")
        # --- 2. score: one target call over the pending token and the kk drafts (p_1 .. p_kk+1)
        logits = scorer(kk)
        rec.lap("target")
        # --- 3. verify: a drafts accepted, then one token of the target's (recovered or bonus)
        a, token = verifier(kk, q, logits)
        rec.lap("verify")
        # --- 4. commit the accepted drafts and the token; the caches roll back to them
        seq[n : n + a] = drafts[:a]
        seq[n + a] = token
        n += a + 1
        scorer.commit(n, token)  # the next call's pending token; its cache cropped to n - 1
        proposer.commit(out, n)
        # --- 5. record: the policy and the recorder see the outcome
        policy.update(kk, a)
        cut = first_stop(seq, n - a - 1, n, stop)  # an end of turn among them ends the output
        if cut is not None:
            n = end = cut
        rec.record(kk, a, out, n, scorer.cache, proposer, asked=ask)
    return out[:n], rec.finish(n - n0)


def _checked(target, draft, prompt_ids, max_new_tokens, k, generator, verify, k_policy, graphs):
    # The entry checks: the prompt (as 1-D ids), the draft as a proposer that fits the
    # target, the options, and the k policy (a fixed k when none is given; with k="auto"
    # the draft's remembered AutoK, drafting up to auto_k.K_MAX).
    ids = check_prompt(target, prompt_ids, max_new_tokens, "target")
    proposer = fitted_proposer(draft, target, ids.numel() + max_new_tokens, cuda_graphs=graphs)
    if k == "auto":
        if k_policy is not None:
            raise ValueError(
                "k='auto' chooses k itself; pass an int k (the most drafts) with a k_policy, "
                "or k='auto' without one"
            )
        k, k_policy = auto_k.K_MAX, auto_k.remembered(draft, target)
    elif isinstance(k, str):
        raise ValueError(f"k must be an int >= 1 or 'auto'; got {k!r}")
    check_int(k, "k (drafts per iteration)")
    check_generator(generator)
    if verify not in ("token", "block"):
        raise ValueError(f"verify must be 'token' or 'block'; got {verify!r}")
    policy = FixedK() if k_policy is None else check_policy(k_policy)
    return ids, proposer, k, policy
