"""What a check runs under: the grading run's seed, the check's deadline, the seeded block.

Plain context variables, set by the runner and the judge and read by the checks and by the
calls that go to a kernel. Inline ``check()`` sets none of them: its cases are the visible
ones (``case_seed(n) == n``) and its time limit is an alarm in the notebook's own process.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import itertools
import time
from collections.abc import Iterator

__all__ = [
    "case_seed",
    "deadline",
    "fresh_cases",
    "grading_seed",
    "seed_block",
    "seeded_block",
    "time_left",
]

_RUN_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar("run_seed", default=None)
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("deadline", default=None)
_BLOCK: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "seed_block", default=None
)
_BLOCKS = itertools.count(1)


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
    """Calls into a kernel inside the block must end within ``seconds`` from now."""
    token = _DEADLINE.set(None if seconds is None else time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def time_left() -> float | None:
    """Seconds left before the current deadline (``None``: no deadline)."""
    d = _DEADLINE.get()
    return None if d is None else d - time.monotonic()


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
