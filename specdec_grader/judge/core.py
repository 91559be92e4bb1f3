"""The check registry and the check runner (judge side: never in the sandbox).

A *check* is a generator function registered under an id ``"exNN.name"``. It receives the
student's object(s), calls them through :func:`call`, and yields one :class:`Case` per thing
it verified. The runner turns the cases into a :class:`CheckResult`: full points when every
case passed, 0 otherwise (one wrong case means the function is wrong; partial credit would
reward code that is right only on easy inputs).

Nothing here imports torch; the exercise modules do, when they are loaded. Inline feedback
(:func:`specdec_grader.check`) uses this module in the notebook's own process.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import pkgutil
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..student_side.results import STATUSES, Case, CheckResult, ExerciseReport
from . import context
from .interrupts import CheckTimeout, KernelLost, StudentError

__all__ = [
    "Case",
    "CheckResult",
    "CheckSpec",
    "ExerciseReport",
    "StudentError",
    "call",
    "call_inplace",
    "call_repeat",
    "CheckTimeout",
    "KernelLost",
    "checks_for",
    "public_implementations",
    "exercises",
    "grade_namespace",
    "register",
    "run_check",
    "STATUSES",
]

_ID_RE = re.compile(r"^(ex\d{2,})\.([a-z_][a-z0-9_]*)$")
_EX_RE = re.compile(r"^ex\d{2,}$")


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class CheckSpec:
    """A registered check: what it needs from the student's namespace and what it is worth."""

    id: str
    func: Callable[..., Iterator[Case]]
    points: float
    needs: tuple[str, ...]
    title: str
    hint: str

    @property
    def exercise(self) -> str:
        return self.id.split(".", 1)[0]


_REGISTRY: dict[str, CheckSpec] = {}


def register(
    check_id: str,
    *,
    points: float,
    needs: str | tuple[str, ...],
    title: str = "",
    hint: str = "",
) -> Callable[[Callable[..., Iterator[Case]]], Callable[..., Iterator[Case]]]:
    """Decorator: register a check function under ``check_id`` (``"exNN.name"``).

    ``needs`` names the object(s) the check looks up in a student's namespace (a string for one,
    a tuple for several; the check function receives them in that order). ``points`` is what
    the check is worth; ``title`` says in a few words what is checked; ``hint`` is the fuller
    hint a failed report shows when the student asks for it (``check(..., hint=True)``): a
    nudge towards the idea, never a line of the solution. The decorated function yields
    :class:`Case` objects and calls student code only through :func:`call`. Raises
    ``ValueError`` for a malformed id, a duplicate id or non-positive points.
    """
    m = _ID_RE.match(check_id)
    if not m:
        raise ValueError(
            f"check_id must look like 'ex01.residual_distribution' (exercise 'exNN', a dot, a "
            f"lower-case name); got {check_id!r}"
        )
    if not (isinstance(points, (int, float)) and points > 0):
        raise ValueError(f"points must be a number > 0; got {points!r}")
    names = (needs,) if isinstance(needs, str) else tuple(needs)
    if not names or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ValueError(f"needs must be a Python name or a tuple of names; got {needs!r}")

    def deco(func: Callable[..., Iterator[Case]]) -> Callable[..., Iterator[Case]]:
        old = _REGISTRY.get(check_id)
        # Re-running a module (autoreload, importlib.reload) re-registers the same function.
        if old is not None and old.func.__qualname__ != func.__qualname__:
            raise ValueError(f"check id {check_id!r} is already registered by {old.func!r}")
        _REGISTRY[check_id] = CheckSpec(check_id, func, float(points), names, title, hint)
        return func

    return deco


def exercises() -> list[str]:
    """The exercise ids that have a module in the judge side (``['ex01', ...]``)."""
    here = [os.path.dirname(os.path.abspath(__file__))]
    return sorted(m.name for m in pkgutil.iter_modules(here) if _EX_RE.match(m.name))


def _load(exercise: str) -> None:
    if exercise not in exercises():
        raise ValueError(
            f"unknown exercise {exercise!r}; known exercises are {', '.join(exercises())}"
        )
    importlib.import_module(f"{__package__}.{exercise}")


def checks_for(exercise: str) -> list[CheckSpec]:
    """The checks of ``exercise`` (``"ex01"``) in the order they were registered.

    Raises ``ValueError`` for an exercise that has no module in the grading package.
    """
    _load(exercise)
    return [s for s in _REGISTRY.values() if s.exercise == exercise]


def public_implementations(exercise: str) -> tuple[str, ...]:
    """The package's own functions that compute what ``exercise`` asks for (dotted paths, its
    module's ``PUBLIC_IMPLEMENTATIONS``): its sandbox holds none of them (:mod:`.withheld`)."""
    _load(exercise)
    found = getattr(sys.modules[f"{__package__}.{exercise}"], "PUBLIC_IMPLEMENTATIONS", ())
    return tuple(str(f) for f in found)


def _spec(check_id: str) -> CheckSpec:
    m = _ID_RE.match(check_id) if isinstance(check_id, str) else None
    if not m:
        raise ValueError(f"check id must look like 'ex01.residual_distribution'; got {check_id!r}")
    _load(m.group(1))
    if check_id not in _REGISTRY:
        known = ", ".join(s.id for s in checks_for(m.group(1)))
        raise ValueError(f"unknown check {check_id!r}; {m.group(1)} has: {known}")
    return _REGISTRY[check_id]


# --------------------------------------------------------------------------- running


def _is_remote(x: Any) -> bool:
    return getattr(x, "_sd_session", None) is not None


def _remote_among(func: Any, args: tuple, kwargs: dict) -> Any:
    for x in (func, *args, *kwargs.values()):
        if _is_remote(x):
            return x
    return None


def call(case: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call student code for the case named ``case``; wrap anything it raises.

    The student's code gets copies of the tensors and generators among the arguments (in a
    kernel, it never had anything else): what it does to them never reaches the check's
    values. ``NotImplementedError`` passes through unchanged (the runner reports "not
    attempted"); every other exception becomes a :class:`StudentError` naming the case.
    Under the batch grader the student's objects live in a kernel (:mod:`.remote`): a call to
    one runs there, and so does a probe called with one among its arguments.
    """
    return _call(case, func, args, kwargs, None, False)


def call_inplace(case: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple:
    """:func:`call`, returning ``(value, args)``: also the positional arguments as the call
    left them (the copies it was given), for a function whose output is written into its
    arguments. The check's own objects stay as they were."""
    return _call(case, func, args, kwargs, None, True)


def call_repeat(case: str, n: int, func: Callable[..., Any], *args: Any, **kwargs: Any) -> list:
    """``[func(*args, **kwargs) for _ in range(n)]``, as :func:`call` does one call.

    The same argument objects (copies of the check's) serve every call, as in a loop; under
    the batch grader the loop runs in the kernel, in one round trip.
    """
    return _call(case, func, args, kwargs, int(n), False)


def _copy(x: Any) -> Any:
    # What a kernel would receive: tensors and generators copied, anything else as it is.
    import torch  # (loaded whenever a check passes a tensor)

    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, torch.Generator):
        return torch.Generator(x.device).set_state(x.get_state())
    return x


def _call(
    case: str, func: Callable[..., Any], args: tuple, kwargs: dict, repeat: int | None, inplace
):
    try:
        remote = _remote_among(func, args, kwargs)
        if remote is not None:  # a student object in a kernel: the call runs there
            return remote._sd_call(func, args, kwargs, repeat, inplace)
        if "torch" in sys.modules:
            args = tuple(_copy(a) for a in args)
            kwargs = {k: _copy(v) for k, v in kwargs.items()}
        if repeat is None:
            value = func(*args, **kwargs)
        else:
            value = [func(*args, **kwargs) for _ in range(repeat)]
        return (value, args) if inplace else value
    except (NotImplementedError, CheckTimeout, KernelLost, StudentError):
        raise  # (a StudentError: a probe's call of student code, with its own case)
    except Exception as e:  # the student's bug, reported with the case that triggered it
        raise StudentError(case, e) from e


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    # SIGALRM interrupts pure-Python loops in the main thread (where notebook cells run).
    # Elsewhere, or on platforms without it, checks run without a limit.
    usable = (
        seconds is not None
        and seconds > 0
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    outer = signal.getitimer(signal.ITIMER_REAL)[0] if usable else 0.0
    if not usable or 0 < outer <= seconds:
        # An outer alarm (pytest-timeout, say) that fires first is left in charge.
        yield
        return

    def on_alarm(signum, frame):
        raise CheckTimeout()

    t0 = time.monotonic()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer > 0:  # put the outer alarm back, less the time we took
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer - (time.monotonic() - t0)))


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 300 else text[:297] + "..."


def _where(exc: BaseException) -> str:
    # The last frame of the student's code (a notebook cell), so they know which line.
    remote = getattr(exc, "_specdec_where", None)
    if isinstance(remote, str):  # raised in a grading kernel, which said where
        return remote
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if "specdec_course" not in f.filename
    ]
    if not frames:
        return ""
    f = frames[-1]
    return f" (line {f.lineno}: {f.line})" if f.line else f" (line {f.lineno})"


def run_check(
    check_id: str, *objs: Any, time_limit: float | None = 60.0, quiet: bool = False
) -> CheckResult:
    """Run check ``check_id`` on the student's object(s) and return its :class:`CheckResult`.

    Never raises for anything the student's code does (exceptions, NotImplementedError,
    wrong types, an endless loop up to ``time_limit`` seconds). ``quiet=True`` swallows what
    the student's code prints while it is checked. Raises ``ValueError`` only for an unknown
    ``check_id`` or a wrong number of objects (mistakes of the notebook's author).
    """
    spec = _spec(check_id)
    if len(objs) != len(spec.needs):
        raise ValueError(
            f"check {check_id!r} needs {len(spec.needs)} object(s) ({', '.join(spec.needs)}); "
            f"got {len(objs)}"
        )
    res = CheckResult(check_id, spec.title, "failed", 0.0, spec.points, hint=spec.hint)
    remote = any(_is_remote(o) for o in objs)
    for name, obj in zip(spec.needs, objs):
        ok = obj.is_callable if _is_remote(obj) else callable(obj)
        if not ok:
            kind = obj.type_name if _is_remote(obj) else type(obj).__name__
            res.status = "error"
            res.message = f"{name} should be a function, but it is a {kind}"
            return res
    t0 = time.perf_counter()
    sink = io.StringIO()
    redirect = (
        (contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink))
        if quiet
        else (contextlib.nullcontext(), contextlib.nullcontext())
    )
    # Student code in a kernel is stopped by the kernel (and, failing that, killed by the
    # session) within the deadline; an alarm here would only interrupt the judge's waiting.
    limit = context.deadline(time_limit) if remote else _time_limit(time_limit)
    try:
        with redirect[0], redirect[1], limit:
            for case in spec.func(*objs):
                res.cases.append(case)
                res.false_failure_rate += case.false_failure_rate
    except KernelLost as e:
        res.status = e.status
        if e.status == "timeout":
            res.message = (
                f"stopped after {time_limit:g} s: the kernel did not stop at the time limit "
                "and was killed (is there an endless loop that catches every exception?)"
            )
        else:
            res.message = f"the kernel died while this function was checked: {e.why}"
    except NotImplementedError:
        res.status = "not attempted"
        res.message = (
            f"{' / '.join(spec.needs)} still raises NotImplementedError: replace the stub "
            "with your code"
        )
    except CheckTimeout:
        res.status = "timeout"
        res.message = (
            f"stopped after {time_limit:g} s"
            + (" of CPU time" if remote else "")
            + "; the reference takes well under a second (is there an endless loop?)"
        )
    except StudentError as e:
        res.status = "error"
        res.message = f"raised {_short(e.exc)} on case '{e.case}'{_where(e.exc)}"
    except MemoryError:  # the checker's own memory (the student's errors are StudentErrors)
        res.status = "error"
        res.message = "the check's own work on what your function returned ran out of memory"
        for o in objs:  # under the batch grader, that is the judge's cap: the exercise scores 0
            if _is_remote(o):
                o._sd_session.judge_memory = True
    except Exception as e:  # noqa: BLE001 - a student object so odd that the check itself broke
        res.status = "error"
        res.message = f"the check could not use what your function returned: {_short(e)}"
    else:
        failed = [c for c in res.cases if not c.passed]
        if res.cases and not failed:
            res.status, res.points = "passed", spec.points
        else:
            res.status = "failed"
            first = failed[0] if failed else None
            res.message = (first.message or f"wrong result on case '{first.name}'") if first else ""
    res.seconds = time.perf_counter() - t0
    return res


def grade_namespace(
    exercise: str,
    namespace: Mapping[str, Any],
    *,
    time_limit: float | None = 60.0,
    quiet: bool = True,
    defined_note: str = "",
    only: str | None = None,
) -> ExerciseReport:
    """Run every check of ``exercise`` on the objects found by name in ``namespace``.

    This is how the batch grader grades: by name, so it does not matter which cells defined
    them. A name that is missing gives status ``"missing"`` (0 points), and a function
    imported from ``specdec_course`` instead of written is ``"failed"``; ``defined_note`` is
    added to that message (the grader says which cells raised); ``only`` runs just the check
    with that id. Raises ``ValueError`` for an unknown exercise.
    """
    results = []
    for spec in checks_for(exercise):
        if only is not None and spec.id != only:
            continue
        absent = [n for n in spec.needs if n not in namespace]
        if absent:
            results.append(
                CheckResult(
                    spec.id,
                    spec.title,
                    "missing",
                    0.0,
                    spec.points,
                    message=f"no {' or '.join(absent)} is defined: define a function with "
                    f"exactly that name" + (f"; {defined_note}" if defined_note else ""),
                    hint=spec.hint,
                )
            )
            continue
        imported = [n for n in spec.needs if _from_package(namespace[n])]
        if imported:
            # The lookup by name would otherwise grade the reference against itself.
            results.append(
                CheckResult(
                    spec.id, spec.title, "failed", 0.0, spec.points,
                    message=f"{imported[0]} is the course package's own function "
                    f"({namespace[imported[0]].__module__}), imported rather than written: "
                    "write your own",
                    hint=spec.hint,
                )
            )  # fmt: skip
            continue
        results.append(
            run_check(
                spec.id, *(namespace[n] for n in spec.needs), time_limit=time_limit, quiet=quiet
            )
        )
    return ExerciseReport(exercise, results)


def _from_package(obj: Any) -> bool:
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and module.split(".")[0] == "specdec_course"
