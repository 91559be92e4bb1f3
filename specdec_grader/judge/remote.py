"""A student's object as the judge sees it: a name in a kernel, called through a session.

The batch grader hands the checks :class:`Remote` objects instead of the student's own; the
checks call them exactly as they call a local function (through :func:`.core.call`), and
the call runs in the kernel, on the arguments the check chose, within the check's deadline.
A probe of :mod:`..student_side.probes` called with student objects among its arguments (ex05's
``launch_race``) runs in the kernel, since that is where those objects are.
"""

from __future__ import annotations

from typing import Any

from ..student_side.probes import PROBES
from . import context
from .interrupts import CheckTimeout
from .session import KernelGone, RemoteTimeout, Session

__all__ = ["KernelGone", "Remote", "remote_call"]


class Remote:
    """The student's object named ``name`` in the kernel of ``session``.

    ``info`` is what the kernel said about it (type, whether callable); it describes the
    student's object, not a fact the judge relies on for a verdict.
    """

    def __init__(self, session: Session, name: str, info: dict):
        self._sd_session = session
        self.name = name
        self.info = info
        self.__name__ = name

    @property
    def is_callable(self) -> bool:
        return bool(self.info.get("callable", False))

    @property
    def type_name(self) -> str:
        return str(self.info.get("type", "object"))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return remote_call(self, args, kwargs)

    def _sd_call(
        self, func: Any, args: tuple, kwargs: dict, repeat: int | None, inplace: bool
    ) -> Any:
        # How :func:`.core.call` reaches a kernel without importing this module.
        return remote_call(func, args, kwargs, repeat, inplace)

    def __repr__(self) -> str:
        return f"<your {self.name} (in the grading kernel)>"


def _session_of(func: Any, args: tuple, kwargs: dict) -> Session | None:
    for x in (func, *args, *kwargs.values()):
        if isinstance(x, Remote):
            return x._sd_session
    return None


def remote_call(
    func: Any, args: tuple, kwargs: dict, repeat: int | None = None, inplace: bool = False
) -> Any:
    """Run ``func(*args, **kwargs)`` (``repeat`` times: a list) where the student objects are.

    ``func`` is a :class:`Remote`, or a probe of :mod:`..student_side.probes` whose arguments
    include one (it then runs in the kernel). ``inplace``: return ``(value, args after the call)``.
    Raises what the student's code raised (rebuilt), :class:`.interrupts.CheckTimeout` past the
    check's deadline, or :class:`KernelGone` when the kernel was lost.
    """
    session = _session_of(func, args, kwargs)
    if session is None:
        raise TypeError("remote_call needs a student object")
    # The check's CPU time so far in this kernel (its cgroup's, which nothing in it can
    # change), and the wall backstop.
    left = context.budget_left((id(session), session.starts), session.cpu_seconds())
    if left is not None and min(left) <= 0:
        raise CheckTimeout()
    if isinstance(func, Remote):
        target = {"name": func.name}
    else:
        names = [n for n, f in PROBES.items() if f is func]
        if not names:
            raise TypeError(f"{func!r} cannot run in the kernel (not a probe of kernel.probes)")
        target = {"probe": names[0]}

    def student(obj):
        return {"$student": obj.name} if isinstance(obj, Remote) else None

    try:
        return session.call(
            target,
            args,
            kwargs,
            timeout=60.0 if left is None else left[0],
            wall=None if left is None else left[1],
            seed=context.seed_block(),
            repeat=repeat,
            student=student,
            inplace=inplace,
            cache_writes=context.cache_writes_accepted(),
        )
    except RemoteTimeout:
        raise CheckTimeout() from None
