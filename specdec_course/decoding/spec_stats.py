"""``SpecStats``: what one speculative decoding call did, and how to total several."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SpecStats"]


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
