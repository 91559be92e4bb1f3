"""The speedup benchmark (``specdec-course bench speedup``): measured ratios in one run.

Plain decoding and speculative decoding (and Medusa) decode the same fixed validation prompts
in alternation, batch 1, one thread, so that machine load hits every method alike; each
speedup is a ratio of medians measured in the same run, printed beside what Theorem 3.8
predicts from the measured acceptance rate and draft cost, and beside the cost-aware ceiling
that prices every forward at its measured cost (the (k + 1)-token target call, the drafted
tokens, the prompt's prefill).

The models' device decides where it runs: on a GPU every interval is read after waiting for
the queued work (``devices.clock``), a first untimed round captures any CUDA graphs, and
``cuda_graphs=True`` replays plain decoding's and the draft methods' steps as graphs
(Medusa's tree pass stays eager). The CPU record is ``speedup_cpu.json``; a GPU's is
``speedup-<gpu>-<date>.json``; ``bench.speedup_record`` writes, reads and prints them.
"""

from __future__ import annotations

import statistics

import torch

from .. import devices
from .._validate import check_int
from ._args import check_run

__all__ = ["SPEEDUP_KS", "SPLIT", "validation_prompts", "measure_speedup"]


SPEEDUP_KS = tuple(range(1, 9))


def validation_prompts(tokenizer, n: int = 4, length: int = 32) -> list[torch.Tensor]:
    """``n`` fixed ``length``-character prompts, evenly spaced through the validation split."""
    from ..data import corpus_split

    check_int(n, "n (prompts)")
    check_int(length, "length (characters per prompt)")
    _, val = corpus_split(tokenizer)
    step = (val.numel() - length) // n
    return [val[i * step : i * step + length].clone() for i in range(n)]


# Where an iteration's time goes; the prompt's prefill (once per run) is shared out over
# the run's iterations.
SPLIT = ("prefill", "draft", "target", "verify", "rest")
# Medusa's phases under the same names: the heads' guesses are its draft, the tree walk its
# verification, the cache compaction part of the rest.
_MEDUSA_SPLIT = {"heads": "draft", "target": "target", "walk": "verify", "cache": "rest"}


def _draft_row(k: int, reps: list, spec_s: list[float], plain_s: list[float], n_new: int) -> dict:
    """One row of the table from each repeat's totals ``reps``: acceptance, tokens per call
    and the time split over all of them. ``spec_s`` and ``plain_s`` are each repeat's seconds
    of this method and of the plain runs beside it (``n_new`` new tokens in all). Each
    repeat gives a measured speedup and predictions priced with its own costs and its own
    plain runs' cost per token; the row keeps the median of each over the repeats (costs
    likewise), so that a drift of the machine's speed between repeats cancels out."""
    from .. import theory
    from ..decoding import SpecStats

    st = SpecStats(k=k)
    for r in reps:
        st.add(r)
    its = max(1, st.iterations)
    alpha = min(st.acceptance_rate, 1.0)
    tokens = theory.expected_tokens(alpha, k)
    med = statistics.median
    # Per repeat: one drafted token (sampling included), one (k + 1)-token target call and
    # the prompt's prefill per new token (both runs pay one; the baseline's is inside its
    # per-token cost, so the prediction prices the speculative run's as measured).
    d = [r.seconds["draft"] / max(1, r.drafted) for r in reps]
    t_call = [r.seconds["target"] / max(1, r.target_calls) for r in reps]
    pre = [r.seconds["prefill"] / max(1, r.emitted) for r in reps]
    plain = [b / n_new for b in plain_s]
    c = [d_ / p_ for d_, p_ in zip(d, plain)]
    cost_aware = [
        p_ / (pr + (k * d_ + t_) / tokens) for p_, pr, d_, t_ in zip(plain, pre, d, t_call)
    ]
    measured = med(b / s_ for b, s_ in zip(plain_s, spec_s))
    return {
        "k": k,
        "alpha": alpha,
        "mean_accepted": st.mean_accepted,
        "tokens_per_target_call": st.tokens_per_target_call,
        "c": med(c),
        "predicted_speedup": theory.speedup(alpha, k, med(c)),
        "cost_aware_speedup": med(cost_aware),
        "measured_speedup": measured,
        "measured_over_cost_aware": measured / med(cost_aware),
        "plain_token_s": med(plain),
        "draft_token_s": med(d),
        "target_call_s": med(t_call),
        "prefill_token_s": med(pre),
        "split_s": {key: st.seconds[key] / its for key in SPLIT},
        "seconds": med(spec_s),
    }


def _timed(clock, seed: int, fn, *args, **kw):
    # (seconds, output) of one run, its generator seeded with ``seed``
    t0 = clock()
    out = fn(*args, generator=torch.Generator().manual_seed(seed), **kw)
    return clock() - t0, out


def measure_speedup(
    target,
    drafts: dict,
    prompts,
    *,
    ks=SPEEDUP_KS,
    medusa_heads=None,
    trees=None,
    temperature: float = 1.0,
    repeats: int = 3,
    max_new_tokens: int = 200,
    seed: int = 0,
    progress: bool = False,
    cuda_graphs: bool = False,
    executor: str = "torch",
) -> dict:
    """Plain decoding against every draft and k (and Medusa's trees), in one run.

    ``drafts`` maps a name to a draft for ``speculative_generate`` (a ``CharGPT``, an
    ``NgramDraft``, any proposer). Every repeat decodes every prompt with each draft at each
    ``k``, then with Medusa on each tree, and beside every one of those runs decodes the same
    prompt with plain decoding (``generate``), first or second in alternate repeats: a
    machine whose speed drifts within seconds (a shared one) slows a method and its baseline
    alike, and the measured speedup is the median over repeats of their ratio (times summed
    over the prompts; every run starts from the same seed). For each draft and ``k`` a row
    holds: acceptance alpha, mean accepted drafts, tokens per target call (over all
    repeats); the cost ratio ``c`` (seconds per drafted token inside the loop over seconds
    per token of the plain runs beside it); Theorem 3.8's speedup from those alpha and c;
    the cost-aware prediction (Theorem 3.8's expected tokens, with every model forward of the
    run priced at what it measured: the (k + 1)-token target calls, the drafted tokens, and
    the prompt's prefill, which the baseline's per-token cost includes too); the measured
    speedup and measured / cost-aware (what the loop's own work leaves: verification and
    bookkeeping, and how far the acceptances are from independent); and the per-iteration
    time split (prefill shared out, draft, target, verify, rest; means over all repeats).
    Costs are medians over the repeats. The prompts may live anywhere; the methods run on
    the target's device (see the module docstring for GPUs and ``cuda_graphs``), and the
    result records ``device`` and ``cuda_graphs``. ``trees``: Medusa's trees, names from
    ``medusa.TREES`` or ``{name: (paths, draft)}``; by default ``bench.bench_trees(
    medusa_heads, temperature)`` (for Hydra heads: Medusa's greedy trees over their measured
    acceptance, and at temperature > 0 chains of sampled drafts). Raises ValueError, before
    timing anything, for arguments that are not what they should be
    (``bench._args.check_run``). ``executor="numpy"`` runs the target's chain steps in NumPy
    in both arms (``generate`` and ``speculative_generate``'s ``executor``; Medusa refused).
    """
    if not drafts and medusa_heads is None:
        raise ValueError("nothing to measure: give drafts (a dict name -> draft) or medusa_heads")
    check_run(
        target=target,
        drafts=drafts or None,  # Medusa alone needs no draft
        prompts=prompts,
        ks=ks,
        repeats=repeats,
        max_new_tokens=max_new_tokens,
        seed=seed,
        temperature=temperature,
    )
    from ..decoding import SpecStats, generate, speculative_generate
    from ..medusa import medusa_generate
    from .medusa_trees import bench_trees

    ks = list(ks)
    names = list(drafts)
    dev = target.lm_head.weight.device
    clock = devices.clock(dev)
    graphs = {"cuda_graphs": cuda_graphs, "executor": executor}
    if executor != "torch" and medusa_heads is not None:
        raise ValueError("Medusa's tree passes are tensor ops: measure it with executor='torch'")
    spec_t = {(m, k): [] for m in names for k in ks}
    plain_t = {key: [] for key in spec_t}  # the plain runs beside each method's
    per_rep = {key: [] for key in spec_t}  # each repeat's totals over the prompts
    # Medusa's trees: {name: (paths, draft)}; by default those bench.bench_trees picks for
    # the heads (Hydra heads: greedy trees over their measured acceptance, sampled chains).
    if medusa_heads is not None and trees is None:
        trees = bench_trees(medusa_heads, temperature)
    elif trees is not None and not isinstance(trees, dict):
        trees = {name: (name, "top") for name in trees}
    tree_names = list(trees) if medusa_heads is not None else []
    med_t = {t: [] for t in tree_names}
    med_plain = {t: [] for t in tree_names}
    med_agg: dict = {}
    n_new = len(prompts) * max_new_tokens
    # On a GPU a first round is not timed: it captures graphs and warms up cuBLAS.
    rounds = range(-1 if dev.type == "cuda" else 0, repeats)
    bar = rounds
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(rounds, desc=f"speedup T={temperature}")
    for rep in bar:
        ts = dict.fromkeys(spec_t, 0.0)
        tp = dict.fromkeys(spec_t, 0.0)
        tm = dict.fromkeys(tree_names, 0.0)
        tmp = dict.fromkeys(tree_names, 0.0)
        rep_agg = {key: SpecStats(k=key[1]) for key in spec_t}
        for i, prompt in enumerate(prompts):
            run_seed = seed + 1000 * rep + i  # every method decodes this prompt from it

            def paired(fn, *args, _s=run_seed, _p=prompt, _first=rep % 2 == 0, **kw):
                # (plain seconds, method seconds, method output): the plain run goes first
                # in even repeats, second in odd ones, on the same prompt and seed.
                plain = (generate, target, _p, max_new_tokens)
                opts = {"temperature": temperature, **graphs}
                if _first:
                    b, _ = _timed(clock, _s, *plain, **opts)
                t, out = _timed(clock, _s, fn, *args, **kw)
                if not _first:
                    b, _ = _timed(clock, _s, *plain, **opts)
                return b, t, out

            for key in spec_t:
                name, k = key
                b, t, (_, st) = paired(
                    speculative_generate,
                    target,
                    drafts[name],
                    prompt,
                    max_new_tokens,
                    k=k,
                    temperature=temperature,
                    timings=True,
                    **graphs,
                )
                tp[key] += b
                ts[key] += t
                if rep >= 0:
                    rep_agg[key].add(st)
            for tree in tree_names:
                b, t, (_, st) = paired(
                    medusa_generate,
                    target,
                    medusa_heads,
                    prompt,
                    max_new_tokens,
                    tree=trees[tree][0],
                    draft=trees[tree][1],
                    temperature=temperature,
                    timings=True,
                )
                tmp[tree] += b
                tm[tree] += t
                if rep >= 0:
                    med_agg.setdefault(tree, st.__class__(k=st.k, tree_size=st.tree_size)).add(st)
        if rep < 0:
            continue  # the warm-up round
        for key in spec_t:
            spec_t[key].append(ts[key])
            plain_t[key].append(tp[key])
            per_rep[key].append(rep_agg[key])
        for tree in tree_names:
            med_t[tree].append(tm[tree])
            med_plain[tree].append(tmp[tree])
    # Plain decoding's seconds per token over all its runs: a median of each repeat's mean,
    # so that one slow repeat cannot inflate it.
    every = [list(v) for v in plain_t.values()] + [list(v) for v in med_plain.values()]
    base = statistics.median(statistics.fmean(col) for col in zip(*every))
    result = {
        "device": str(dev),
        "cuda_graphs": cuda_graphs,
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "prompts": len(prompts),
        "repeats": repeats,
        "baseline_seconds": base,
        "plain_token_s": base / n_new,
        "methods": {
            m: [_draft_row(k, per_rep[m, k], spec_t[m, k], plain_t[m, k], n_new) for k in ks]
            for m in names
        },
    }
    if tree_names:
        rows = []
        for tree in tree_names:
            st = med_agg[tree]
            its = max(1, st.iterations)
            split = dict.fromkeys(SPLIT, 0.0)
            for phase, s_ in st.seconds.items():
                split[_MEDUSA_SPLIT[phase]] += s_ / its
            ratios = [b / t for b, t in zip(med_plain[tree], med_t[tree])]
            rows.append(
                {
                    "tree": tree,
                    "heads": getattr(medusa_heads, "kind", "medusa"),
                    "paths": [list(p) for p in _paths(trees[tree][0])],
                    "draft": trees[tree][1],
                    "nodes": st.tree_size,
                    "mean_accepted_length": st.mean_accepted_length,
                    "tokens_per_target_call": st.tokens_per_target_call,
                    "measured_speedup": statistics.median(ratios),
                    "split_s": split,
                    "seconds": statistics.median(med_t[tree]),
                }
            )
        result["medusa"] = rows
    return result


def _paths(tree):
    # a Medusa tree argument (a name from medusa.TREES or a list of paths) as its paths
    from ..medusa import TREES

    return TREES[tree] if isinstance(tree, str) else tree
