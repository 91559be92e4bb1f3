"""Cost of one cached forward over 1, 2, 4, ... new tokens, as the decoding loops take it.

``bench speedup`` prints this table beside its speedups (lesson 04 section 5), lesson 06 and
07 time single calls with it, and ``bench gpu`` stores it with its record.
"""

from __future__ import annotations

import statistics

import torch

from .. import devices
from .._validate import check_int
from ..fast import draft_step, lean_step

__all__ = ["FORWARD_SIZES", "time_forward", "forward_costs"]

FORWARD_SIZES = (1, 2, 4, 8, 16)  # the sizes `bench speedup` prints


def _forward_timer(model, n_new: int, context: int, draft: bool = False, numpy: bool = False):
    """A function that runs one cached step over ``n_new`` tokens (the step the loops take,
    logits included) and returns seconds: ``fast.lean_step(model, numpy=numpy)``, or with
    ``draft`` and one token ``fast.draft_step(model)`` (a one-layer draft's ``FoldedStep``)."""
    dev = model.lm_head.weight.device
    clock = devices.clock(dev)
    ids = torch.randint(
        model.config.vocab_size, (context + n_new,), generator=torch.Generator().manual_seed(0)
    ).to(dev)
    lean = draft_step(model) if draft and n_new == 1 else lean_step(model, numpy=numpy)
    cache = lean.new_cache()
    with torch.inference_mode():
        lean.feed(ids[:context], cache)
    new = ids[context:]
    out = torch.empty(n_new, model.config.vocab_size, device=dev)

    @devices.with_native_cpu_kernels  # as the decoding loops run it
    @torch.inference_mode()
    def once() -> float:
        cache.crop(context)
        t0 = clock()
        lean.step(new, cache, out)
        return clock() - t0

    return once


def time_forward(model, n_new: int, *, context: int = 64, repeats: int = 200) -> float:
    """Median seconds of one cached forward over ``n_new`` new tokens after ``context`` ones."""
    check_int(n_new, "n_new")
    check_int(context, "context")
    check_int(repeats, "repeats")
    once = _forward_timer(model, n_new, context)
    for _ in range(10):  # warm up allocator and caches
        once()
    return statistics.median(once() for _ in range(repeats))


def forward_costs(
    target, draft, sizes=FORWARD_SIZES, repeats: int = 200, *, executor: str = "torch"
) -> dict:
    """Cost of one cached forward over 1, 2, 4, ... new tokens, for both models.

    The sizes and models are timed round-robin (one call each per round, ``repeats``
    rounds) and the median per size is kept, so a slow moment of the machine hits all of
    them alike. Each timed call follows an untimed call of itself, as in a decoding loop,
    which repeats a step: timed straight after the target's 16-token call, the draft's
    folded step paid to bring its tables back into the CPU's caches and measured about
    twice what it costs in the loop. Returns ``{"sizes", "target_s", "draft_s",
    "target_rel", "c"}``: seconds per call, the target's cost relative to one token (1.0 =
    extra tokens are free: the memory-bound premise), and ``c`` = draft call / target call
    for one token. ``executor="numpy"`` times the target's NumPy step (``fast.numpy_steps``).
    """
    sizes = list(sizes)
    numpy = executor == "numpy"
    for i, n in enumerate(sizes):
        check_int(n, f"sizes[{i}]")
    check_int(repeats, "repeats")
    timers = [
        (_forward_timer(target, n, 64, numpy=numpy), _forward_timer(draft, n, 64, True))
        for n in sizes
    ]
    runs = [([], []) for _ in sizes]
    for r in range(repeats + 10):
        for (tt, dt), (ts, ds) in zip(timers, runs):
            tt()  # warm: the call before a timed one is the same call (see the docstring)
            a = tt()
            dt()
            b = dt()
            if r >= 10:  # the first rounds warm up allocator and caches
                ts.append(a)
                ds.append(b)
    t = [statistics.median(ts) for ts, _ in runs]
    d = [statistics.median(ds) for _, ds in runs]
    return {
        "sizes": sizes,
        "target_s": t,
        "draft_s": d,
        "target_rel": [x / t[0] for x in t],
        "c": d[0] / t[0],
    }
