"""Check ``ex06.medusa_head``: a head that reads the token drafted before its own, its
residual blocks in order, then its own copy of ``lm_head``.

The head is built and run by :func:`specdec_grader.student_side.probes.head_report`, which
reports plain data only: the head's parameters by name (with which of them are one tensor),
its output when fresh and its output with the judge's random weights loaded by name. The
judge reads the structure off the names and shapes, and compares the outputs with the
package's ``ResBlock`` holding those weights. Under the batch grader the probe runs in a
fresh kernel where only the notebook's ``class MedusaHead`` was defined (:mod:`..fresh`,
:mod:`..class_source`): nothing another cell did (a probe replaced through
``os.sys.modules``, say) is there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from specdec_course import medusa

from ...student_side import wire
from ...student_side.probes import head_report
from .._support import as_vector, fmt
from ..class_source import class_cell
from ..context import case_seed
from ..core import Case, call, register
from ..fresh import DefineFailed, define_alone
from ..kernel_source import Refused
from ..remote import Remote

ATOL = 1e-5


def _reference_head(weights, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """The package's pieces holding the judge's weights: the previous token's embedding added
    to ``h``, ResBlocks in order, then lm_head."""
    blocks, embed_w, lm_w = weights
    C = lm_w.shape[1]
    layers = []
    for w, b in blocks:
        block = medusa.ResBlock(C)
        with torch.no_grad():
            block.linear.weight.copy_(w)
            block.linear.bias.copy_(b)
        layers.append(block)
    lm_head = nn.Linear(C, lm_w.shape[0], bias=False)
    with torch.no_grad():
        lm_head.weight.copy_(lm_w)
        return nn.Sequential(*layers, lm_head)(h + embed_w[prev])


def _step(info: dict, key: str):
    """The probe's result for ``key``, or the student's error that stopped it before."""
    if key not in info and "error" in info:
        raise wire.rebuild_error(info["error"])
    return info.get(key)


def _diagnose_forward(weights, h: torch.Tensor, prev: torch.Tensor, got: torch.Tensor) -> str:
    blocks, embed_w, lm_w = weights
    e = embed_w.double()[prev]
    h0 = h.double()
    h = h0 + e
    W = [(w.double(), b.double()) for w, b in blocks]

    def close(x):
        logits = x @ lm_w.double().T
        return got.shape == logits.shape and torch.allclose(got, logits, atol=1e-4)

    x = h0
    for w, b in W:
        x = x + torch.nn.functional.silu(x @ w.T + b)
    if close(x):
        return (
            "your head ignored the token drafted before it, as lesson 06's Head (which reads "
            "h alone) does: its embedding joins h before the blocks"
        )
    if close(x + e):
        return "the token's embedding was added after the blocks: it joins h before them"

    side = h + sum(torch.nn.functional.silu(h @ w.T + b) for w, b in W)
    if len(W) > 1 and close(side):
        return (
            "every block read the head's input h: the blocks come one after another, each "
            "reading what the one before it returned"
        )
    x = h
    for w, b in W:
        x = torch.nn.functional.silu(x @ w.T + b)
    if close(x) or close(h + x):
        return "a block's output replaces its input; a residual block adds to it"
    x = h
    for w, b in reversed(W):
        x = x + torch.nn.functional.silu(x @ w.T + b)
    if len(W) > 1 and close(x):
        return "the blocks ran in reverse order"
    return "wrong output with random weights: the blocks, in order, then lm_head"


@register(
    "ex06.medusa_head",
    points=3,
    needs="MedusaHead",
    title="a head that reads the previous token, n residual blocks, then a copy of lm_head",
    hint="lesson 06's head reads h alone; this one also reads what the token before its own "
    "guess was. Where can a token enter a vector of width C, and what must that entry start "
    "as so that a fresh head is still the target's own head? The same question holds for "
    "each block, each with weights of its own (repeating one module object repeats its "
    "weights too)",
)
def check_medusa_head(cls) -> Iterator[Case]:
    with contextlib.ExitStack() as stack:
        if isinstance(cls, Remote):
            try:
                cls = define_alone(
                    cls, stack, "head", class_cell(cls._sd_session.notebook[1], "MedusaHead")
                )
            except Refused as e:
                yield Case("MedusaHead, taken from the notebook", False, message=str(e))
                return
            except DefineFailed as e:
                yield Case(
                    "MedusaHead, taken from the notebook",
                    False,
                    message=f"defining MedusaHead on its own raised {e.why}",
                )
                return
        yield from _head_cases(cls)


def _param_names(n: int) -> list[str]:
    blocks = [f"blocks.{i}.{w}" for i in range(n) for w in ("weight", "bias")]
    return ["embed.weight", *blocks, "lm_head.weight"]


def _weights_by_name(weights) -> dict[str, torch.Tensor]:
    blocks, embed_w, lm_w = weights
    out = {"embed.weight": embed_w, "lm_head.weight": lm_w}
    for i, (w, b) in enumerate(blocks):
        out[f"blocks.{i}.weight"], out[f"blocks.{i}.bias"] = w, b
    return out


def _params(info: dict, key: str) -> dict[str, torch.Tensor] | None:
    items = info.get(key)
    if not isinstance(items, list):
        return None
    out = {}
    for item in items:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            return None
        name, value = item
        if not (isinstance(name, str) and isinstance(value, torch.Tensor)):
            return None
        out[name] = value
    return out


def _head_cases(cls) -> Iterator[Case]:
    g = torch.Generator().manual_seed(case_seed(0))
    cases = []  # every input drawn before the first call: the kernel cannot steer them
    for C, V, n in ((8, 11, 1), (24, 65, 2), (12, 7, 3)):
        w = torch.randn(V, C, generator=g)
        h = torch.randn(5, 3, C, generator=g)
        prev = torch.randint(0, V, (5, 3), generator=g)
        blocks = tuple(
            (torch.randn(C, C, generator=g), torch.randn(C, generator=g)) for _ in range(n)
        )
        embed_w = torch.randn(V, C, generator=g)
        cases.append((C, V, n, w, h, prev, (blocks, embed_w, torch.randn(V, C, generator=g))))
    for C, V, n, w, h, prev, weights in cases:
        info = call(
            f"MedusaHead(weight [{V}, {C}], n_layers={n})",
            head_report,
            cls,
            w,
            n,
            h,
            prev,
            _weights_by_name(weights),
        )
        if not isinstance(info, dict):
            raise TypeError("the head probe returned no report")
        name = f"C={C}, V={V}, n_layers={n}"
        params = _params(info, "params")
        if params is None:
            yield Case(
                name,
                False,
                "an nn.Module",
                fmt(str(info.get("type"))),
                "MedusaHead is not an nn.Module (did __init__ call super().__init__()?)",
            )
            return
        want_names = _param_names(n)
        shapes = {k: tuple(v.shape) for k, v in params.items()}
        if not {"embed.weight", "lm_head.weight"} <= set(params) or not any(
            k.startswith("blocks.") for k in params
        ):
            yield Case(
                name,
                False,
                "embed (an nn.Embedding), blocks (an nn.ModuleList of nn.Linear) and lm_head "
                "(an nn.Linear)",
                ", ".join(sorted(params)) or "no parameters",
                "the grader reads self.embed, self.blocks and self.lm_head: keep those names "
                "and types (lesson 06's Head has no embedding: this head reads the token "
                "drafted before its own)",
            )
            return
        n_blocks = len({k.split(".")[1] for k in params if k.startswith("blocks.")})
        if n_blocks != n:
            yield Case(
                name,
                False,
                f"{n} residual block(s)",
                f"{n_blocks}",
                f"n_layers={n} asks for {n} residual blocks",
            )
            return
        want = {k: (C, C) if k.endswith(".weight") else (C,) for k in want_names}
        want["embed.weight"] = want["lm_head.weight"] = (V, C)
        if shapes != want:
            yield Case(
                name,
                False,
                f"embed [{V}, {C}], blocks [{C}, {C}] with bias, lm_head [{V}, {C}] without",
                fmt(shapes),
                "embed holds a vector of width C per token; a block maps C -> C (with a "
                "bias); lm_head maps C -> V without a bias, like the target's",
            )
            return
        if info.get("same"):
            yield Case(
                f"{name}: every block has its own weights",
                False,
                f"{n} blocks, {2 * n + 2} distinct parameter tensors",
                "blocks that share their weights",
                "the blocks are one module repeated, so they share their weights: training "
                "one trains all",
            )
            return
        if "fresh" not in info and "error" in info:
            err = info["error"] if isinstance(info["error"], dict) else {}
            if "TypeError" in (err.get("bases") or ()) and "argument" in str(err.get("message")):
                yield Case(
                    f"{name}: forward(h, prev)",
                    False,
                    "forward takes h and prev",
                    f"TypeError: {str(err.get('message'))[:120]}",
                    "forward must take the token drafted before this head's (prev) beside h; "
                    "lesson 06's Head takes h alone",
                )
                return
        fresh = as_vector(_step(info, "fresh"))
        base = (h @ w.T).double()
        if fresh is None or fresh.shape != base.shape or not torch.allclose(fresh, base, atol=ATOL):
            yield Case(
                f"{name}: a fresh head equals the base head",
                False,
                fmt(base[0, 0]),
                fmt(None if fresh is None else fresh.flatten()[:V]),
                "a fresh head is not the target's own head: the embedding must start at zero, "
                "every block as the identity (its weight and its bias) and lm_head as a copy "
                "of lm_head_weight",
            )
            return
        yield Case(f"{name}: a fresh head equals the base head", True)
        after = _params(_step_info(info, "after"), "after")
        lm_after = None if after is None else after.get("lm_head.weight")
        kept = info.get("w_changed") is not False or (
            lm_after is None or lm_after.shape != w.shape or not torch.equal(lm_after, w)
        )
        if kept:
            yield Case(
                f"{name}: lm_head holds its own copy",
                False,
                "a copy",
                "the same tensor as the target's lm_head",
                "lm_head is the target's own tensor: training the head would change the target",
            )
            return
        got = as_vector(_step(info, "random"))
        exp = _reference_head(weights, h, prev).double()
        ok = got is not None and got.shape == exp.shape and torch.allclose(got, exp, atol=1e-4)
        yield Case(
            f"{name}: forward with random weights",
            ok,
            fmt(exp[0, 0]),
            fmt(None if got is None else got.flatten()[:V]),
            ""
            if ok
            else "forward returned no tensor"
            if got is None
            else _diagnose_forward(weights, h, prev, got),
        )
        if not ok:
            return


def _step_info(info: dict, key: str) -> dict:
    """``info`` itself once it holds ``key``; the student's error that stopped the probe
    before it, raised again."""
    _step(info, key)
    return info
