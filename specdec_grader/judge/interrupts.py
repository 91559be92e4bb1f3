"""The judge's control-flow exceptions, below everything that raises or catches them."""

from __future__ import annotations

from ..student_side.errors import StudentError

__all__ = ["CheckTimeout", "KernelLost", "StudentError"]


class CheckTimeout(BaseException):
    """A check ran past its deadline. A BaseException, so a student's ``except Exception:``
    cannot swallow it."""


class KernelLost(BaseException):
    """The kernel running the student's code was lost during a check (raised by sessions:
    :class:`.session.KernelGone` is one); ``status`` is "crashed" or "timeout"."""

    why: str = ""
    status: str = "crashed"
