"""A fresh kernel for one check: the student's definition, taken out of the notebook's source
by the judge, run where no other student cell has run.

The kernel that ran a notebook can have been changed by any of its cells (a probe replaced
through ``os.sys.modules``, a patched ``torch``), so what it reports about an object that
only lives there proves nothing. For the checks that need such a report (ex05's launch of a
Triton kernel, ex06's head), the judge writes a cell from the notebook's source that defines
the one object and nothing else, starts a kernel under the same sandbox and limits, runs
that cell, and asks its questions there. The answers are plain data, which the judge reads
and judges (:mod:`..student_side.probes` decides nothing).
"""

from __future__ import annotations

import contextlib

from . import context
from .remote import Remote
from .session import Session

__all__ = ["DefineFailed", "fresh_session", "define_alone"]


class DefineFailed(ValueError):
    """The definition cell did not run in the fresh kernel: ``reply`` says how."""

    def __init__(self, reply: dict):
        super().__init__("the definition did not run on its own")
        self.reply = reply

    @property
    def why(self) -> str:
        if self.reply.get("timeout"):
            return "it timed out"
        err = self.reply.get("error") or {}
        text = str(err.get("message", "")).strip().splitlines()
        kind = str(err.get("type", "an error"))
        return f"{kind}: {text[-1][:300]}" if text else kind


def fresh_session(student: Remote, stack: contextlib.ExitStack, suffix: str) -> Session:
    """A new kernel under ``student``'s kernel's sandbox, memory cap, limits and withheld
    modules, not started; closed with ``stack``."""
    mine = student._sd_session
    fresh = Session(
        mine.plan,
        tag=f"{mine.tag}-{suffix}",
        memory_mb=mine.memory_mb,
        limits=mine.limits,
        notebook_name=f"{suffix}.ipynb",
        notebook_text="",
        withhold=mine.withhold,
    )
    stack.callback(fresh.close)
    return fresh


def define_alone(
    student: Remote, stack: contextlib.ExitStack, suffix: str, cell: str, seconds: float = 60.0
) -> Remote:
    """``student``'s name, defined by ``cell`` (the judge's, written from the notebook's
    source) in a fresh kernel (:func:`fresh_session`); the stand-in the checks call.

    Starting the kernel and defining the object is the grader's time, not the check's:
    the check's deadline starts again after it (until ``stack`` closes).
    Raises :class:`DefineFailed` when the cell raises or times out, :class:`.session.
    KernelGone` when no kernel starts."""
    fresh = fresh_session(student, stack, suffix)
    left = context.time_left()
    with context.deadline(None):
        fresh.start()
        reply = fresh.run_cell(cell, seconds)
    # The check's deadline starts again once the object is defined, for the rest of ``stack``.
    stack.enter_context(context.deadline(left))
    if not reply.get("ok"):
        raise DefineFailed(reply)
    return Remote(fresh, student.name, {"callable": True})
