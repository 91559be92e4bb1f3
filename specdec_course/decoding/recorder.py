"""What the speculative loop records about a run: counts, seconds per stage, callbacks.

None of it is the algorithm; all of it is how a learner or a bench sees what a run did.
``Recorder`` counts iterations, drafts, accepted drafts and rejections into ``SpecStats``;
with ``timings`` it splits the wall time into the prefill (the proposer's start and the
target's prompt), draft, target, verify and the rest (``tick`` starts a lap, ``lap(stage)``
ends it; when off, both do nothing); and it calls ``on_iteration(ids, target_cache,
draft_cache, accepted)`` after every iteration. A k policy that measures calls (``auto_k.AutoK``:
an ``observe`` method) is fed each iteration's asked, drafted and accepted counts with the
seconds of its proposal and of the target's call with its verification (``feed``), read
from the policy's own ``clock`` or the device's wall clock, with or without ``timings``.
"""

from __future__ import annotations

import time

from .. import devices
from ..drafts.model_draft import ModelProposer
from .spec_stats import SpecStats

__all__ = ["Recorder"]


class Recorder:
    """The counts, laps and callbacks of one ``speculative_generate`` call.

    ``timings``: False, True (the wall clock; on a GPU synchronised, ``devices.clock``) or a
    clock (e.g. ``time.thread_time``). The run's wall time starts when it is built;
    ``start(device)`` picks the clock and starts the first lap.
    """

    __slots__ = (
        "stats", "timings", "on_iteration", "wall", "wall0", "clock", "spent", "t",
        "meter", "meter_clock", "m0", "m1",
    )  # fmt: skip

    def __init__(self, k: int, timings=False, on_iteration=None):
        self.stats = SpecStats(k=k)
        self.timings, self.on_iteration = timings, on_iteration
        self.wall = timings if callable(timings) else time.perf_counter
        self.wall0 = self.wall()
        self.clock = None
        self.spent = dict.fromkeys(("draft", "target", "verify", "prefill"), 0.0)
        self.t = 0.0
        self.meter = self.meter_clock = None
        self.m0 = self.m1 = 0.0

    def feed(self, policy) -> None:
        """Feed ``policy`` each iteration's counts and seconds if it measures them (has
        ``observe``; ``dynamic.check_policy``'s wrapper is looked through)."""
        policy = getattr(policy, "policy", policy)
        self.meter = getattr(policy, "observe", None)
        self.meter_clock = getattr(policy, "clock", None)

    def start(self, device) -> None:
        """Time on ``device`` from now on (with timings), and start a lap."""
        if self.timings:
            self.clock = self.timings if callable(self.timings) else devices.clock(device)
        if self.meter is not None and self.meter_clock is None:
            self.meter_clock = devices.clock(device)
        self.tick()

    def tick(self) -> None:
        if self.clock is not None:
            self.t = self.clock()
        if self.meter is not None:
            self.m0 = self.meter_clock()

    def lap(self, stage: str) -> None:
        if self.clock is not None:
            now = self.clock()
            self.spent[stage] += now - self.t
            self.t = now
        if self.meter is not None and stage == "draft":
            self.m1 = self.meter_clock()

    def record(
        self, drafted: int, accepted: int, ids, n: int, target_cache, proposer, asked: int = 0
    ) -> None:
        """One iteration: ``asked`` drafts asked for, ``drafted`` made, ``accepted`` of them
        kept, ``ids[:n]`` committed."""
        if self.meter is not None:
            m1 = self.m1
            self.meter(asked, drafted, accepted, m1 - self.m0, self.meter_clock() - m1)
        stats = self.stats
        stats.accepted_per_iteration.append(accepted)
        stats.iterations += 1
        stats.drafted += drafted
        stats.rejections += accepted < drafted
        if self.on_iteration is not None:
            draft_cache = proposer.cache if isinstance(proposer, ModelProposer) else None
            self.on_iteration(ids[:n], target_cache, draft_cache, accepted)

    def finish(self, emitted: int) -> SpecStats:
        """The run's ``SpecStats``: one target call per iteration, one draft call per draft."""
        stats = self.stats
        stats.target_calls, stats.draft_calls = stats.iterations, stats.drafted
        stats.emitted = emitted
        self.close()
        return stats

    def close(self) -> None:
        """With timings: ``stats.seconds`` gets the laps and the rest of the wall time."""
        if self.clock is not None:
            spent = self.spent
            spent["rest"] = self.wall() - self.wall0 - sum(spent.values())
            self.stats.seconds = spent
