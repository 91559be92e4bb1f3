"""The error that carries a case name (student code raised while a check, or a probe in the
kernel, called it), and any exception as plain data for the wire and back (``error_info``,
``rebuild_error``). Shared by both sides, so it lives at the bottom."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["RemoteError", "StudentError", "call_student", "error_info", "rebuild_error"]

_MAX_MESSAGE = 2000  # characters of an exception's message that cross the wire


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


def error_info(exc: BaseException) -> dict:
    """An exception as plain data: ``{"type", "bases", "message", "where"}``.

    ``bases`` are the names of its builtin base classes (most derived first), ``where`` the
    last line of student code in its traceback. A check's ``StudentError`` (``case``, ``exc``)
    becomes its inner exception plus ``"case"``. Never raises, whatever the exception does.
    """
    case = getattr(exc, "case", None) if type(exc).__name__ == "StudentError" else None
    inner = getattr(exc, "exc", None)
    if isinstance(case, str) and isinstance(inner, BaseException):
        info = error_info(inner)
        info["case"] = case[:300]
        return info
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a student exception whose __str__ raises
        message = "<unprintable>"
    # str.__getitem__: a str subclass from student code may override slicing.
    message = str.__getitem__(message, slice(0, _MAX_MESSAGE)) if isinstance(message, str) else ""
    try:
        name = str.__getitem__(str(type(exc).__name__), slice(0, 80))
        bases = [str(c.__name__) for c in type(exc).__mro__ if c.__module__ == "builtins"]
    except Exception:  # noqa: BLE001 - an exception class with a broken metaclass
        name, bases = "Exception", ["Exception"]
    try:
        where = _where(exc.__traceback__)
    except Exception:  # noqa: BLE001
        where = ""
    return {"type": name, "bases": bases[:12], "message": message, "where": where}


def _where(tb) -> str:
    # The last frame outside the course's and the grader's packages (a notebook cell), so
    # that the student knows which line. The walk is bounded: a runaway recursion leaves
    # millions of frames.
    last, n = None, 0
    while tb is not None and n < 200_000:
        name = tb.tb_frame.f_code.co_filename
        if "specdec_course" not in name and "specdec_grader" not in name:
            last = tb
        tb, n = tb.tb_next, n + 1
    if last is None:
        return ""
    (f,) = traceback.extract_tb(last, limit=1)
    line = (f.line or "")[:200]
    return f" (line {f.lineno}: {line})" if line else f" (line {f.lineno})"


class RemoteError(Exception):
    """Base of the exceptions rebuilt from plain data (:func:`rebuild_error`)."""


_REBUILT: dict[tuple[str, type], type] = {}


def rebuild_error(info: dict) -> BaseException:
    """An exception like the one :func:`error_info` described: the same name, its nearest
    builtin base (so that ``except ValueError`` still works), the same message and line.
    With a ``"case"``, the check's ``StudentError`` around it (not for NotImplementedError,
    which means "not attempted" wherever it comes from)."""
    import builtins

    info = info if isinstance(info, dict) else {}
    base: type = Exception
    for name in info.get("bases") or ():
        cls = getattr(builtins, str(name), None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            base = cls
            break
    name = str(info.get("type") or "Exception")
    name = name if name.isidentifier() else "Exception"
    key = (name, base)
    if key not in _REBUILT:
        # RemoteError is an Exception already: (Exception, RemoteError) has no valid MRO.
        _REBUILT[key] = type(
            name,
            (RemoteError,) if base is Exception else (base, RemoteError),
            {"__str__": lambda self: self.args[0] if self.args else "", "__module__": "student"},
        )
    exc = _REBUILT[key](str(info.get("message", "")))
    exc._specdec_where = str(info.get("where", ""))[:300]
    case = info.get("case")
    if isinstance(case, str) and not isinstance(exc, NotImplementedError):
        return StudentError(case, exc)
    return exc
