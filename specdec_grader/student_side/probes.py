"""Probes: the few operations the judge asks the kernel to do on a student object that only
lives there (a Triton kernel to launch, a class to build), returning plain data.

Under the batch grader a probe runs in a fresh kernel where only the student's object was
defined from the notebook's source (:mod:`specdec_grader.judge.fresh`), never in the
kernel that ran the notebook, whose cells could have replaced it.

They hold no reference and decide nothing: the judge chose every input (drawn after the
notebook ran, never seen by it before the call), keeps its own copies, computes what the
answer should be with its own code and compares. A kernel whose student code patched these
functions can only lie about its own output, which the judge checks against its own values.
The agent runs only the functions listed in :data:`PROBES`.
"""

from __future__ import annotations

import torch

from . import wire
from .errors import call_student

__all__ = ["PROBES", "head_report", "launch_race"]


def _is_triton_kernel(obj) -> bool:
    # A @triton.jit function: a JITFunction, or under TRITON_INTERPRET=1 the interpreter's
    # wrapper of one. Nothing else is launched (a Python object with a `[grid]` is not).
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    if isinstance(obj, JITFunction):
        return True
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False
    return isinstance(obj, InterpretedFunction)


def launch_race(
    kernel, pos: torch.Tensor, p: torch.Tensor, q: torch.Tensor, e: torch.Tensor, block_v: int
) -> torch.Tensor:
    """Launch a student's ``race_kernel`` with grid ``(B,)``; return the ``[B]`` int64 tokens.

    The output starts filled with -1, so a kernel that stores nothing returns -1s. A kernel
    whose body still raises ``NotImplementedError`` re-raises it (the interpreter wraps it).
    Raises ``TypeError`` for anything but a ``@triton.jit`` function.
    """
    B = pos.shape[0]
    K = q.shape[1]
    V = p.shape[2]
    token = torch.full((B,), -1, dtype=torch.int64)
    if not _is_triton_kernel(kernel):
        raise TypeError("race_kernel must be a Triton kernel: decorate it with @triton.jit")
    try:
        kernel[(B,)](token, pos, p, q, e, K, V, BLOCK_V=block_v)
    except Exception as err:  # the interpreter wraps what the kernel raised
        cause = err
        while cause is not None:
            if isinstance(cause, NotImplementedError) or "NotImplementedError" in repr(cause):
                raise NotImplementedError("race_kernel still raises NotImplementedError") from None
            cause = cause.__cause__
        raise
    return token


def head_report(
    cls, w: torch.Tensor, n_layers: int, h: torch.Tensor, prev: torch.Tensor, weights
) -> dict:
    """Build the student's head from ``w`` and report, as plain data, what it did: its
    parameters by name, its output on ``(h, prev)`` when fresh, and its output after the
    judge's ``weights`` (``{parameter name: tensor}``) were loaded by name.

    It judges nothing (no type, shape or value is compared here): the judge reads the names,
    shapes and values and decides. Under the batch grader this runs in a kernel where only
    the class was defined (:mod:`specdec_grader.judge.fresh`). An error of the
    constructor propagates; a later one is returned (``"error"``) and ends the report.

    Keys: ``type``; ``params`` (``[[name, value when fresh], ...]`` in the head's order,
    shared tensors listed once per name); ``same`` (groups of indices into ``params`` that
    are one tensor); ``fresh``; ``w_changed`` (the constructor or the forward wrote into
    ``w``); ``after`` (every parameter's value after ``w`` was changed in place: a head that
    kept ``w`` itself shows the change); ``random``.
    """
    V, C = w.shape
    w_before = w.clone()
    head = call_student(f"MedusaHead(weight [{V}, {C}], n_layers={n_layers})", cls, w, n_layers)
    out: dict = {"type": type(head).__name__}
    name = f"C={C}, V={V}, {n_layers} block(s)"
    try:
        named = list(head.named_parameters(remove_duplicate=False))
        out["params"] = [[str(k), p.detach().clone()] for k, p in named]
        groups: dict[int, list[int]] = {}
        for i, (_, p) in enumerate(named):
            groups.setdefault(p.data_ptr(), []).append(i)
        out["same"] = [g for g in groups.values() if len(g) > 1]
        with torch.no_grad():
            out["fresh"] = call_student(f"{name}: forward of a fresh head", head, h, prev)
        out["w_changed"] = not torch.equal(w, w_before)
        with torch.no_grad():
            w.add_(1.0)
        out["after"] = [[str(k), p.detach().clone()] for k, p in named]
        own = dict(head.state_dict())
        new = {k: v for k, v in weights.items() if k in own}
        with torch.no_grad():
            head.load_state_dict({**own, **new})
            out["random"] = call_student(f"{name}: forward with trained weights", head, h, prev)
    except Exception as e:  # noqa: BLE001 - the student's, reported when the check gets there
        out["error"] = wire.error_info(e)
    return out


# The only functions the agent runs as probes, by name.
PROBES = {"launch_race": launch_race, "head_report": head_report}
