"""Batched speculation against batched plain decoding on the CPU (lesson 08, section 4).

Part of ``specdec-course bench beyond`` (``bench.dynamic_and_block`` holds the rest and writes the
record):

- ``batch_call_costs``: at each ``B``, the target's calls over 1 to 7 new tokens per row and
  the draft's call, the steps the batched loops take (``fast.batch_steps``), each
  timed warm.
- ``measure_batch``: tokens per second of plain and speculative decoding for ``B`` rows at
  once (``decoding.batched``), at several ``k``, as a static batch and in the steady state
  (until the first row is done), in the decode phase.
- ``batch_ceiling``: what a loop without overhead of its own could gain at each ``B``, from
  those call costs and the measured acceptance.

Times are the decoding thread's CPU time (``time.thread_time``), as in ``bench.dynamic_and_block``.
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import numpy as np
import torch

from .._validate import check_int
from ..devices import native_cpu_kernels
from ._args import check_run

__all__ = ["BATCH_SIZES", "BATCH_KS", "batch_call_costs", "batch_ceiling", "measure_batch"]

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BATCH_KS = (1, 2, 4)
_clock = time.thread_time  # the decoding thread's CPU time


def batch_call_costs(
    target,
    draft,
    batch_sizes=BATCH_SIZES,
    sizes=(1, 2, 3, 5),
    repeats: int = 30,
    *,
    warm: bool = True,
) -> dict:
    """At each ``B``: seconds of the calls the batched loops make, after a 64-token context.

    The same steps ``decoding.batched`` takes (``fast.batch_steps``), logits
    included: size 1 is plain decoding's one-token step (every row at one position), a
    larger size the speculative loop's target call over that many tokens per row at the
    rows' own positions; ``draft_s`` the loop's one-token draft step (at ``B = 1`` the
    folded step of a one-layer draft, as the loop takes). Round-robin over everything,
    median kept. ``warm``: each timed call follows an untimed call of itself, as in a
    decoding loop, which repeats one step; ``warm=False`` times each call right after the
    previous job's (another ``B``'s, whose buffers evict this one's from the CPU's caches).
    Returns ``{"batch_sizes", "sizes", "target_s" [B][size], "draft_s" [B], "ratio", "steps",
    "warm"}`` (``ratio``: the largest size's call over the one-token call; near 1 means
    verifying drafts is nearly free)."""
    with torch.inference_mode():
        return _batch_call_costs(target, draft, batch_sizes, list(sizes), repeats, warm)


def _batch_call_costs(target, draft, batch_sizes, sizes, repeats, warm=True):
    from ..fast import FoldedStep, batch_steps, draft_step
    from ..sampling import SamplingOptions

    V = target.config.vocab_size
    table = callable(getattr(draft, "propose_rows", None))  # an n-gram table as the draft
    jobs = []  # (B index, is_draft, size, call, drafted positions it stands for)
    for bi, B in enumerate(batch_sizes):
        ids = torch.randint(V, (B, 64 + max(sizes)))
        slots = torch.full((B, 1), 64) + torch.arange(max(sizes))
        ts = batch_steps(target, B)
        ts.prefill(ids[:, :64])
        out = torch.empty(B * max(sizes), V, dtype=target.lm_head.weight.dtype)
        for n in sizes:
            if n == 1:
                call = partial(ts.step_shared, ids[:, 64:65], 64, out[:B])
            else:
                call = partial(ts.step, ids[:, 64 : 64 + n], slots[:, :n], 64 + n, out[: B * n])
            jobs.append((bi, False, n, call, 1))
        if table:  # K drafts per row and their q rows, as the loop takes them; per draft
            K = max(sizes) - 1
            smp = SamplingOptions(1.0)
            q_rows, ids_h, n_h = draft.sampling_rows(smp), ids.numpy(), np.full(B, 64)
            u = np.random.default_rng(0).random((B, K))
            toks, rows = np.empty((B, K), np.int64), np.empty((B, K), np.int64)

            def call(ids_h=ids_h, n_h=n_h, u=u, toks=toks, rows=rows, q_rows=q_rows, smp=smp, K=K):
                draft.propose_rows(smp, ids_h, n_h, K, u, toks, rows)
                torch.from_numpy(q_rows[rows])

            jobs.append((bi, True, 1, call, K))
            continue
        fold = draft_step(draft) if B == 1 else None
        if isinstance(fold, FoldedStep):
            fc = fold.new_cache()
            fold.feed(ids[0, :64], fc)

            def call(fold=fold, fc=fc, t=int(ids[0, 64]), out=out[:1]):
                fc.length = 64
                fold.step(t, fc, out)
        else:
            dstep = batch_steps(draft, B)
            dstep.prefill(ids[:, :64])
            call = partial(dstep.step, ids[:, 64:65], slots[:, :1], 65, out[:B])
        jobs.append((bi, True, 1, call, 1))
    runs: list[list[float]] = [[] for _ in jobs]
    with native_cpu_kernels():  # as the decoding loops run
        for r in range(repeats + 3):
            for (_, _, _, call, _), sink in zip(jobs, runs):
                # Warm: one untimed call first. The jobs since this one's last call (every
                # other B's, up to B = 512) evict its weights and cache from the CPU's
                # caches, while a decoding loop repeats one step. Timed cold, the first job
                # of a round (B = 1's one-token call, right after B = 512's) paid for bringing
                # the target's weights back, and cost more than B = 1's five-token call,
                # which came after it and found them there.
                if warm:
                    call()
                t0 = _clock()
                call()
                if r >= 3:
                    sink.append(_clock() - t0)
    target_s = [[0.0] * len(sizes) for _ in batch_sizes]
    draft_s = [0.0] * len(batch_sizes)
    for (bi, is_draft, n, _, per), sink in zip(jobs, runs):
        if is_draft:
            draft_s[bi] = statistics.median(sink) / per
        else:
            target_s[bi][sizes.index(n)] = statistics.median(sink)
    return {
        "batch_sizes": list(batch_sizes),
        "sizes": sizes,
        "target_s": target_s,
        "draft_s": draft_s,
        "ratio": [t[-1] / t[0] for t in target_s],
        "steps": "decoding.batched's own (fast.batch_steps), logits included"
        + ("; the draft: a table's proposal, per drafted position" if table else ""),
        "warm": warm,
    }


def batch_ceiling(batch: dict, calls: dict) -> dict:
    """What a loop with no overhead of its own could gain at each ``B``, from measured costs.

    Theorem 3.8's expected tokens at the measured alpha of each ``B`` (``batch``, from
    :func:`measure_batch`), over the cost of an iteration: ``k`` draft calls and one ``(k +
    1)``-token target call, in one-token target calls (``calls``, from
    :func:`batch_call_costs`, measured at sizes ``k + 1``). Returns ``{"rows": [{"B",
    "ceiling": {k: ...}, "best_k", "best_ceiling"}], "crossover_B"}``: the smallest ``B``
    whose best ceiling is below 1 (``None`` if none). Where ``batch`` holds the steady runs'
    own split (``steady_per_call_s``), each row also has ``ceiling_in_loop`` ({k: ...}) and
    ``best_ceiling_in_loop``: the same bound with the calls priced as they cost inside the
    loop (its draft and target seconds per call) against plain decoding's step as it ran,
    so that the measured speedup over it is the share the loop's own work leaves. Raises
    ValueError when ``calls`` lacks a size ``k + 1`` or a batch size of ``batch``."""
    from .. import theory

    rows = []
    for r in batch["rows"]:
        if r["B"] not in calls["batch_sizes"]:
            raise ValueError(f"batch_call_costs has no B = {r['B']}; measure it at that B")
        bi = calls["batch_sizes"].index(r["B"])
        t = calls["target_s"][bi]
        ceiling = {}
        for k in batch["ks"]:
            if k + 1 not in calls["sizes"]:
                raise ValueError(f"batch_call_costs needs size {k + 1} for k = {k}")
            cost = (k * calls["draft_s"][bi] + t[calls["sizes"].index(k + 1)]) / t[0]
            ceiling[str(k)] = theory.expected_tokens(r["alpha"], k) / cost
        best = max(ceiling, key=ceiling.get)
        row = {"B": r["B"], "ceiling": ceiling, "best_k": int(best), "best_ceiling": ceiling[best]}
        if "steady_per_call_s" in r:
            split = r["steady_per_call_s"]
            inner = {
                str(k): theory.expected_tokens(r["alpha"], k)
                * r["plain_step_s"]
                / (split[str(k)]["draft"] + split[str(k)]["target"])
                for k in batch["ks"]
            }
            row["ceiling_in_loop"] = inner
            row["best_ceiling_in_loop"] = max(inner.values())
        rows.append(row)
    losing = [r["B"] for r in rows if r["best_ceiling"] < 1.0]
    return {"rows": rows, "crossover_B": min(losing) if losing else None}


def measure_batch(
    target,
    draft,
    prompts: torch.Tensor,
    *,
    batch_sizes=BATCH_SIZES,
    ks=BATCH_KS,
    temperature: float = 1.0,
    repeats: int = 3,
    max_new_tokens: int = 64,
    seed: int = 0,
    min_tokens: int = 0,
) -> dict:
    """Tokens per second of batched plain and speculative decoding against ``B``.

    ``prompts`` int64 ``[max(batch_sizes), T]``; batch ``B`` decodes its first ``B`` rows;
    ``draft`` a ``CharGPT`` or an n-gram table (``speculative_generate_batch``'s drafts).
    Per repeat (after one untimed round), every ``B`` runs plain and each ``k`` in turn, the
    speculative loop twice: to the end of every row (a static batch: rows that finish early
    wait for the slowest, ``speedup``) and until the first row is done (every row decoding:
    the steady state of continuous batching, ``steady_speedup``, which is what
    :func:`batch_ceiling` prices); each speedup is the median over rounds of the ratio within
    a round, and its spread the smallest and largest of those ratios. ``min_tokens``: a small
    ``B`` runs more rounds, up to four times ``repeats``, until a run kind has
    decoded about that many tokens in all (``B * max_new_tokens`` per round; its rounds are
    cheap, and its ratios the noisiest); 0 keeps ``repeats`` for every ``B``. The rates are
    the decode phase's: each round times the
    target's prefill of the prompts (the same calls open both arms) and takes it out of that
    round's runs (``prefill_s``: its median). Returns ``{"rows": [{"B", "plain_tok_s", "spec_tok_s",
    "speedup", "steady_speedup" (each {k: ...}), "spread", "steady_spread" (each {k: [min,
    max]} of the rounds' ratios), "utilization" {k: the fraction of row
    iterations a static batch spends on rows still decoding}, "best_k", "best_speedup",
    "best_steady_k", "best_steady_speedup", "alpha", "prefill_s", "rounds", "plain_step_s" (plain
    decoding's step as it ran), "steady_per_call_s" ({k: {"draft", "target", "verify", "rest"}}:
    a steady run's seconds per target call, from the loop's own ``timings``)}], "crossover_B",
    "steady_crossover_B", "min_tokens"}``:
    a crossover is the smallest ``B`` where no ``k`` beats plain decoding (``None`` if
    speculation pays at every measured ``B``).
    """
    check_run(target=target, drafts={"draft": draft}, prompts=prompts, prompt_dim=2, ks=ks)
    check_run(repeats=repeats, max_new_tokens=max_new_tokens, seed=seed, temperature=temperature)
    for i, B in enumerate(batch_sizes):
        check_int(B, f"batch_sizes[{i}]")
    check_int(min_tokens, "min_tokens", minimum=0)
    rounds = {
        B: min(4 * repeats, max(repeats, -(-min_tokens // (B * max_new_tokens))))
        for B in batch_sizes
    }
    from ..decoding import SpecStats
    from ..decoding.batched import generate_batch, speculative_generate_batch
    from ..fast import batch_steps

    runs = [(0, "all")] + [(k, until) for k in ks for until in ("all", "first")]
    times = {(B, k, u): [] for B in batch_sizes for k, u in runs}
    prefill = {B: [] for B in batch_sizes}  # the target's prefill, which both arms make
    tokens = {(B, k, u): [] for B in batch_sizes for k, u in runs}
    agg = {B: SpecStats(k=max(ks)) for B in batch_sizes}
    split = {(B, k): SpecStats(k=k) for B in batch_sizes for k in ks}  # steady runs' seconds
    busy = {(B, k): [0, 0] for B in batch_sizes for k in ks}  # row iterations, B * calls
    for rep in range(-1, max(rounds.values())):  # round -1 warms up every shape, untimed
        for B in batch_sizes:
            if rep >= rounds[B]:
                continue
            rows = prompts[:B]
            # Both arms start by building the target's steps and prefilling the prompt, the
            # same calls (fast.batch_steps): that is not what speculation changes,
            # and it weighs more in the shorter arm. Timed here in each round, it is taken
            # out of that round's runs: the rates are the decode phase's.
            with torch.inference_mode(), native_cpu_kernels():  # as the loops run
                t0 = _clock()
                batch_steps(target, B).prefill(rows[:, :-1])
                pre = _clock() - t0
            for k, until in runs:
                g = torch.Generator().manual_seed(seed + rep)
                t0 = _clock()
                if k == 0:
                    generate_batch(
                        target, rows, max_new_tokens, temperature=temperature, generator=g
                    )
                    n = B * max_new_tokens
                else:
                    _, st = speculative_generate_batch(
                        target,
                        draft,
                        rows,
                        max_new_tokens,
                        k=k,
                        temperature=temperature,
                        generator=g,
                        until=until,
                        timings=_clock if until == "first" else False,
                    )
                    n = st.emitted
                    if rep >= 0 and until == "all":
                        busy[B, k][0] += st.iterations
                        busy[B, k][1] += B * st.target_calls
                        if k == max(ks):
                            agg[B].add(st)
                    if rep >= 0 and until == "first":
                        split[B, k].add(st)
                if rep >= 0:
                    times[B, k, until].append(_clock() - t0 - pre)
                    tokens[B, k, until].append(n)
            if rep >= 0:
                prefill[B].append(pre)
    out = []
    for B in batch_sizes:
        # tokens per second of each run kind: all its tokens over the median run's share
        rate = {
            key: sum(tokens[key]) / (statistics.median(times[key]) * rounds[B])
            for key in times
            if key[0] == B
        }
        plain = rate[B, 0, "all"]

        def paired(k, until, B=B):
            # the median over rounds of the rate ratio within a round: the runs of a round
            # are adjacent in time, so a slow spell of the machine cancels out of it
            # (and min, max: how far one round's ratio strays, to tell noise from a gap)
            per = [
                (n / t) / (n0 / t0)
                for n, t, n0, t0 in zip(
                    tokens[B, k, until], times[B, k, until], tokens[B, 0, "all"], times[B, 0, "all"]
                )
            ]
            return statistics.median(per), [min(per), max(per)]

        speed, spread = {}, {}
        steady, steady_spread = {}, {}
        for k in ks:
            speed[k], spread[str(k)] = paired(k, "all")
            steady[k], steady_spread[str(k)] = paired(k, "first")
        # Where a steady run's time went, per target call: the calls (draft, target) and the
        # loop's own work (verify: the verifier and the commit; rest: bookkeeping), against
        # plain decoding's step as it ran (its decode phase over its tokens).
        plain_step = statistics.median(times[B, 0, "all"]) / max_new_tokens
        per_call = {}
        for k in ks:
            sp = split[B, k]
            calls = max(sp.target_calls, 1)
            per_call[str(k)] = {
                part: sp.seconds.get(part, 0.0) / calls
                for part in ("draft", "target", "verify", "rest")
            }
        best = max(ks, key=lambda k: speed[k])
        best_s = max(ks, key=lambda k: steady[k])
        out.append(
            {
                "B": B,
                "plain_tok_s": plain,
                "spec_tok_s": {str(k): rate[B, k, "all"] for k in ks},
                "speedup": {str(k): speed[k] for k in ks},
                "steady_speedup": {str(k): steady[k] for k in ks},
                "spread": spread,
                "steady_spread": steady_spread,
                "utilization": {str(k): busy[B, k][0] / busy[B, k][1] for k in ks},
                "best_k": best,
                "best_speedup": speed[best],
                "best_steady_k": best_s,
                "best_steady_speedup": steady[best_s],
                "alpha": min(agg[B].acceptance_rate, 1.0),
                "prefill_s": statistics.median(prefill[B]),
                "rounds": rounds[B],
                "plain_step_s": plain_step,
                "steady_per_call_s": per_call,
            }
        )
    losing = [r["B"] for r in out if r["best_speedup"] < 1.0]
    losing_s = [r["B"] for r in out if r["best_steady_speedup"] < 1.0]
    return {
        "temperature": temperature,
        "repeats": repeats,
        "max_new_tokens": max_new_tokens,
        "min_tokens": min_tokens,
        "ks": list(ks),
        "rows": out,
        "crossover_B": min(losing) if losing else None,
        "steady_crossover_B": min(losing_s) if losing_s else None,
    }
