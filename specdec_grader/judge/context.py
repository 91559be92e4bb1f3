"""What a check runs under: the grading run's seed, the check's deadline, the seeded block.

Plain context variables, set by the runner and the judge and read by the checks and by the
calls that go to a kernel. Inline ``check()`` sets none of them: its cases are the visible
ones (``case_seed(n) == n``) and its time limit is an alarm in the notebook's own process.

A check's deadline counts CPU seconds of the kernels it calls (their cgroups' CPU time, read
by the judge: a busy machine slows a check, it does not use its time up), with a wall-clock
backstop (:func:`wall_backstop`) for code that waits instead of computing. Where a kernel's
CPU time cannot be read (no cgroup), the deadline counts wall time, as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import itertools
import time
from collections.abc import Iterator

__all__ = [
    "budget_left",
    "cache_writes",
    "cache_writes_accepted",
    "case_seed",
    "deadline",
    "fresh_cases",
    "grading_seed",
    "seed_block",
    "seeded_block",
    "time_left",
    "wall_backstop",
]

# The wall-clock backstop of a limit of ``s`` CPU seconds: a kernel that waits (sleeps,
# blocks) uses no CPU, and is stopped after this long. An honest check uses a small part of
# its CPU limit (a few seconds of 60), so it meets the backstop only on a machine that gives
# it far less than half a core; and a check that times out is re-run alone before it counts.
WALL_FACTOR = 2.0
WALL_SLACK_S = 10.0


def wall_backstop(seconds: float) -> float:
    """Wall seconds allowed for a limit of ``seconds`` CPU seconds."""
    return WALL_FACTOR * float(seconds) + WALL_SLACK_S


class _Budget:
    """A check's time: ``seconds`` of CPU across the kernels it calls, and a wall backstop."""

    def __init__(self, seconds: float):
        self.seconds = float(seconds)
        self.t0 = time.monotonic()
        self.wall_end = self.t0 + wall_backstop(seconds)
        self.start: dict[object, float] = {}  # kernel -> its CPU seconds at first use
        self.used: dict[object, float] = {}  # kernel -> CPU seconds used in this check
        self.clockless = False  # some kernel's CPU time could not be read: count wall time

    def left(self, key: object = None, cpu_now: float | None = None) -> tuple[float, float]:
        now = time.monotonic()
        if key is not None and cpu_now is None:
            self.clockless = True
        elif key is not None:
            self.used[key] = cpu_now - self.start.setdefault(key, cpu_now)
        used = sum(self.used.values())
        if self.clockless:
            used = max(used, now - self.t0)
        return self.seconds - used, self.wall_end - now


_RUN_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar("run_seed", default=None)
_DEADLINE: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("deadline", default=None)
_BLOCK: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "seed_block", default=None
)
_BLOCKS = itertools.count(1)
_CACHE_WRITES: contextvars.ContextVar[bool] = contextvars.ContextVar("cache_writes", default=False)


def case_seed(n: int) -> int:
    """The seed a check uses for its case ``n``: ``n`` itself (the visible cases), or, while
    the batch grader runs with seed ``s``, a number drawn from ``(s, n)`` (fresh cases)."""
    s = _RUN_SEED.get()
    if s is None:
        return n
    digest = hashlib.sha256(f"specdec-course:{s}:{n}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 2**31


def fresh_cases() -> bool:
    """True while the batch grader draws fresh cases (checks may then add random ones)."""
    return _RUN_SEED.get() is not None


@contextlib.contextmanager
def grading_seed(seed: int | None) -> Iterator[None]:
    """Draw every case from ``seed`` inside the block (``None``: the visible cases)."""
    token = _RUN_SEED.set(seed)
    try:
        yield
    finally:
        _RUN_SEED.reset(token)


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Calls into a kernel inside the block may use ``seconds`` of CPU from now, and end
    within :func:`wall_backstop` of it (``None``: no deadline)."""
    token = _DEADLINE.set(None if seconds is None else _Budget(seconds))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def budget_left(key: object = None, cpu_now: float | None = None) -> tuple[float, float] | None:
    """``(CPU seconds, wall seconds)`` left of the current deadline, counting the CPU time
    ``cpu_now`` of the kernel ``key`` (``None`` where it cannot be read: wall time counts);
    ``None`` when there is no deadline."""
    d = _DEADLINE.get()
    return None if d is None else d.left(key, cpu_now)


def time_left() -> float | None:
    """CPU seconds left of the current deadline, as last measured (``None``: no deadline)."""
    d = _DEADLINE.get()
    if d is None:
        return None
    cpu, wall = d.left()
    return min(cpu, wall)


@contextlib.contextmanager
def seeded_block(seed: int) -> Iterator[None]:
    """Mark calls made inside the block as one seeded block (the kernel seeds its global
    RNGs once, at the block's first call, as the notebook's process would)."""
    token = _BLOCK.set((int(seed), next(_BLOCKS)))
    try:
        yield
    finally:
        _BLOCK.reset(token)


def seed_block() -> tuple[int, int] | None:
    """``(seed, block id)`` of the innermost seeded block, or ``None``."""
    return _BLOCK.get()


@contextlib.contextmanager
def cache_writes() -> Iterator[None]:
    """Calls into a kernel inside the block may write into the ``k`` and ``v`` of the judge's
    caches they are handed (ex07's compaction, whose API is moving a cache's slots). Outside
    such a block the judge's caches are the judge's: the kernel reads copies of ``k`` and
    ``v``, and only the cache's own methods (``crop``, ``reset``, ``length``) change them."""
    token = _CACHE_WRITES.set(True)
    try:
        yield
    finally:
        _CACHE_WRITES.reset(token)


def cache_writes_accepted() -> bool:
    """True inside :func:`cache_writes`."""
    return _CACHE_WRITES.get()
