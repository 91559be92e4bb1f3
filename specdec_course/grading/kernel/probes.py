"""Probes: the few operations the judge asks the kernel to do on a student object that only
lives there (a Triton kernel to launch, a class to build), returning plain data.

They hold no reference and decide nothing: the judge chose every input (drawn after the
notebook ran, never seen by it before the call), keeps its own copies, computes what the
answer should be with its own code and compares. A kernel whose student code patched these
functions can only lie about its own output, which the judge checks against its own values.
The agent runs only the functions listed in :data:`PROBES`.
"""

from __future__ import annotations

import torch
from torch import nn

from . import wire
from .errors import call_student

__all__ = ["PROBES", "launch_race", "load_head"]


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


def load_head(
    cls, w: torch.Tensor, n_layers: int, h: torch.Tensor, prev: torch.Tensor, weights
) -> dict:
    """Build the student's head from ``w``, run it on ``(h, prev)``, load the judge's
    ``weights`` (``((block weight, block bias), ...), embedding weight, lm_head weight``) into
    it and run it again.

    Returns plain data: its type, its blocks', embedding's and lm_head's types and shapes,
    whether its parameters are distinct tensors, whether lm_head shares ``w``, and the two
    outputs. An error of the constructor propagates; a later one is returned as plain data
    (with its case) and ends the probe.
    """
    C, V = w.shape[1], w.shape[0]
    w_before = w.clone()
    head = call_student(f"MedusaHead(weight [{V}, {C}], n_layers={n_layers})", cls, w, n_layers)
    out: dict = {"module": isinstance(head, nn.Module), "type": type(head).__name__}
    if not out["module"]:
        return out
    blocks, lm = getattr(head, "blocks", None), getattr(head, "lm_head", None)
    embed = getattr(head, "embed", None)
    listed = isinstance(blocks, nn.ModuleList)
    out["layers"] = (type(blocks).__name__, type(embed).__name__, type(lm).__name__)
    if not (
        listed
        and all(isinstance(b, nn.Linear) for b in blocks)
        and isinstance(embed, nn.Embedding)
        and isinstance(lm, nn.Linear)
    ):
        return out
    out["shapes"] = (
        tuple((tuple(b.weight.shape), b.bias is not None) for b in blocks),
        tuple(embed.weight.shape),
        (tuple(lm.weight.shape), lm.bias is None),
    )
    params = list(head.parameters())
    out["distinct"] = len({p.data_ptr() for p in params}) == len(params) == 2 * len(blocks) + 2
    out["blocks_distinct"] = len({id(b) for b in blocks}) == len(blocks)
    name = f"C={C}, V={V}, {n_layers} block(s)"
    try:
        with torch.no_grad():
            out["fresh"] = call_student(f"{name}: forward of a fresh head", head, h, prev)
        out["shared"] = lm.weight.data_ptr() == w.data_ptr() or not torch.equal(w, w_before)
        block_weights, embed_w, lm_w = weights
        if len(block_weights) != len(blocks):
            return out
        with torch.no_grad():
            for b, (bw, bb) in zip(blocks, block_weights):
                b.weight.copy_(bw)
                b.bias.copy_(bb)
            embed.weight.copy_(embed_w)
            lm.weight.copy_(lm_w)
            out["random"] = call_student(f"{name}: forward with trained weights", head, h, prev)
    except Exception as e:  # noqa: BLE001 - the student's, reported when the check gets there
        out["error"] = wire.error_info(e)
    return out


# The only functions the agent runs as probes, by name.
PROBES = {"launch_race": launch_race, "load_head": load_head}
