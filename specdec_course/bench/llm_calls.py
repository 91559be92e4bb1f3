"""The real LLM on this CPU: what a call costs against the tokens it scores, and prompt lookup.

- :func:`call_costs`: one cached call scoring ``T`` new tokens after a ``context``-token
  prefix, for several models, interleaved round-robin (one call of each model and size per
  round; the median per cell kept; the timer is ``llm.costs.call_timer``, as in
  ``llm.call_costs``, the one-model curve lesson 11 draws), as ratios ``T(k) / T(1)``.
  SmolLM2 reads about 270 MB (bfloat16) or 540 MB (float32) of weights per call whatever
  ``T``: its curve stays nearly flat, the memory-bound regime speculative decoding is for.
  The character target's weights fit in the CPU's caches; its calls cost the ops they
  dispatch and grow with ``T``.
- :func:`dtype_costs`: the same call in float32 and bfloat16 at 1 and 2 threads (how
  ``llm.loading.default_dtype`` was chosen).
- every proposer's speedup, and the race against Hugging Face and llama.cpp:
  ``bench.llm_race``.
"""

from __future__ import annotations

import statistics
import time

import torch

from ..llm.costs import call_timer

__all__ = ["call_costs", "dtype_costs"]


def call_costs(
    models: dict,
    sizes=tuple(range(1, 33)),
    *,
    context: int = 300,
    repeats: int = 5,
    clock=time.perf_counter,
    progress=None,
) -> dict:
    """Median seconds of one cached call over ``T`` new tokens after ``context`` tokens, for
    each model (``{name: model}``; the context is cut to what a model's window holds),
    interleaved. Returns ``{name: {"context", "seconds": [...], "ratio": [T(k)/T(1)...]}}``
    with ``"sizes"``. ``clock=time.thread_time`` counts the CPU time of one thread (for
    ``torch.set_num_threads(1)`` on a busy machine: time spent descheduled is left out).
    ``progress()``, if given, is called after each of the ``repeats + 1`` rounds."""
    sizes = list(sizes)
    ctx = {n: min(context, m.config.block_size - max(sizes)) for n, m in models.items()}
    timers = {n: call_timer(m, ctx[n], max(sizes), clock) for n, m in models.items()}
    runs = {n: [[] for _ in sizes] for n in models}
    for r in range(repeats + 1):
        for n, once in timers.items():
            for i, T in enumerate(sizes):
                s = once(T)
                if r:  # the first round warms allocator and caches
                    runs[n][i].append(s)
        if progress is not None:
            progress()
    out: dict = {"sizes": sizes}
    for n in models:
        sec = [statistics.median(x) for x in runs[n]]
        out[n] = {"context": ctx[n], "seconds": sec, "ratio": [s / sec[0] for s in sec]}
    return out


def dtype_costs(
    models: dict,
    sizes=(1, 8),
    threads=(1, 2),
    *,
    context: int = 300,
    repeats: int = 5,
    clock=time.perf_counter,
    progress=None,
) -> dict:
    """``{(name, threads): {T: median seconds}}`` for one cached call of each model (e.g.
    ``{"float32": m32, "bfloat16": m16}``) at each thread count, interleaved; ``progress()``
    is called after each round."""
    before = torch.get_num_threads()
    timers = {n: call_timer(m, context, max(sizes), clock) for n, m in models.items()}
    runs = {(n, th): {T: [] for T in sizes} for n in models for th in threads}
    try:
        for r in range(repeats + 1):
            for th in threads:
                torch.set_num_threads(th)
                for n, once in timers.items():
                    for T in sizes:
                        s = once(T)
                        if r:
                            runs[n, th][T].append(s)
            if progress is not None:
                progress()
    finally:
        torch.set_num_threads(before)
    return {key: {T: statistics.median(v) for T, v in d.items()} for key, d in runs.items()}
