"""The error that carries a case name: student code raised while a check (or a probe in the
kernel) called it. Shared by both sides, so it lives at the bottom."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["StudentError", "call_student"]


class StudentError(Exception):
    """Student code raised while a check called it; carries the case and the exception."""

    def __init__(self, case: str, exc: BaseException):
        super().__init__(case, exc)
        self.case = case
        self.exc = exc


def call_student(case: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)``, its exception (but ``NotImplementedError``, which means "not
    attempted", and a ``StudentError`` already named) wrapped as a :class:`StudentError`."""
    try:
        return func(*args, **kwargs)
    except (NotImplementedError, StudentError):
        raise
    except Exception as e:  # the student's bug, reported with the case that triggered it
        raise StudentError(case, e) from e
