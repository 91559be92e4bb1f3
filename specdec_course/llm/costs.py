"""What one call of the real model costs on this machine, against the tokens it scores.

:func:`call_costs` times the call the decoding loops make (the model's cached step over ``T``
new tokens after a ``context``-token prefix) for each ``T``, interleaved: one call of each size
per round, the cache cropped back before each, the median of the rounds kept. Lesson 11 draws
it beside the stored record's, and ``bench llm`` (``bench.llm_calls``) times the same calls.
A speculative loop sends calls of exactly these sizes (k + 1 for k drafted tokens), so a bump
in this curve is a draft length that costs more than the curve's neighbours.

:func:`read_limit` is the floor under a one-token call: the bytes of weights it reads over the
read bandwidth measured here. On the course's 2-core AMD EPYC (one thread, thread CPU time,
a busy machine): 538 MB at 26.6 GB/s, 20 ms, where the call took 56 ms (0.36 of the limit);
oneDNN's products were about 45 ms of it, attention 4 ms, norms, rotary and the per-layer
Python the rest (``torch.profiler`` over ten calls).
"""

from __future__ import annotations

import statistics
import time

import torch

from .. import devices
from ..fast import lean_step

__all__ = ["call_costs", "call_timer", "read_limit"]


def call_timer(model, context: int, max_new: int, clock=time.perf_counter):
    """A function ``once(T)`` that times one cached call of ``model``'s loop step (any course
    decoder: ``fast.lean_step``) over ``T <= max_new`` new tokens after ``context`` cached ones,
    by ``clock``, and returns the seconds. The context is fed once; each call crops the cache
    back to it first."""
    ids = torch.randint(
        model.config.vocab_size, (context + max_new,), generator=torch.Generator().manual_seed(0)
    )
    step = lean_step(model)
    cache = step.new_cache()
    with torch.inference_mode():
        step.feed(ids[:context], cache)
    new, out = ids[context:], torch.empty(max_new, model.config.vocab_size)

    @devices.with_native_cpu_kernels
    @torch.inference_mode()
    def once(T: int) -> float:
        cache.crop(context)
        t0 = clock()
        step.step(new[:T], cache, out[:T])
        return clock() - t0

    return once


def call_costs(
    model, sizes=range(1, 17), *, context: int = 300, repeats: int = 5, clock=time.perf_counter
) -> dict:
    """``{T: median seconds}`` of one cached call scoring ``T`` new tokens after ``context``
    tokens, for each ``T`` in ``sizes``, interleaved over ``repeats`` rounds after one warm-up
    round. On the thread count torch has now (``torch.set_num_threads(1)`` for the course's
    one-thread figures); ``clock=time.thread_time`` counts this thread's CPU time instead of
    the wall clock (on one thread, time the scheduler gives to other work is left out). SmolLM2
    after 300 tokens takes about 50-60 ms a call on a 2-core server CPU: 16 sizes, 5 rounds,
    about 6 s."""
    sizes = [int(T) for T in sizes]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be call sizes >= 1; got {sizes}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats}")
    if context < 0 or context + max(sizes) > model.config.block_size:
        raise ValueError(
            f"context must be >= 0 with context + {max(sizes)} tokens <= the model's "
            f"{model.config.block_size}; got {context}"
        )
    once = call_timer(model, context, max(sizes), clock)
    runs: dict = {T: [] for T in sizes}
    for r in range(repeats + 1):
        for T in sizes:
            s = once(T)
            if r:  # the first round warms the allocator and the caches
                runs[T].append(s)
    return {T: statistics.median(v) for T, v in runs.items()}


def read_limit(model, *, buffer_mb: int = 256, repeats: int = 5) -> dict:
    """The memory floor of one call scoring one token: ``{"bytes": weight bytes a call reads
    (every block's products and the head, in the compute dtype), "bandwidth": bytes/s read
    (the best of ``repeats`` sums over a ``buffer_mb`` MB buffer, larger than a CPU's caches,
    on torch's threads), "seconds": bytes / bandwidth}``."""
    if buffer_mb < 1 or repeats < 1:
        raise ValueError(f"buffer_mb and repeats must be >= 1; got {buffer_mb}, {repeats}")
    size = model.compute_dtype.itemsize
    n = model.head_weight.numel()
    for block in model.layers:
        for part in (block.attention, block.feed_forward):
            n += sum(lin.in_features * lin.out_features for lin in part.children())
    buf = torch.ones(buffer_mb * 2**20 // 4)
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        best = max(best, buf.numel() * 4 / (time.perf_counter() - t0))
    return {"bytes": n * size, "bandwidth": best, "seconds": n * size / best}
