"""Checks of exercise 05: the recovered-token kernel (exponential race over vocabulary tiles).

Students write, in ``exercises/ex05_triton_race.ipynb``, a Triton kernel with this signature::

    @triton.jit
    def race_kernel(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V: tl.constexpr):

run with one program per batch row ``b`` (grid ``(B,)``). Row ``b`` was rejected at position
``m = pos[b]``; the kernel stores ``argmax_v max(p[b, m, v] - q[b, m, v], 0) / e[b, v]`` at
``token[b]``, reading the vocabulary in tiles of ``BLOCK_V`` columns. Tensors: ``token`` int64
``[B]`` (filled with -1 before the launch), ``pos`` int64 ``[B]``, ``p`` float32
``[B, K + 1, V]``, ``q`` float32 ``[B, K, V]``, ``e`` float32 ``[B, V]`` (Exp(1) draws).

Under the batch grader the kernel process that ran the notebook is not asked anything about
the kernel (its code could replace the launcher or Triton itself): the judge takes the
``@triton.jit def race_kernel`` out of the notebook's source (:mod:`.kernel_source`, which
refuses a body that names anything but Triton's language and its own variables) and
launches it in a fresh sandboxed kernel in which no student cell has run. Every launch of
the graded run is recorded as Triton's launcher keys it (each argument's type and
divisibility, the ``constexpr`` values; :func:`.kernel_source.record_launch`, from the
judge's own values), and after the cases the kernel is compiled for an NVIDIA H100
(``GPUTarget("cuda", 90, 32)``, no GPU needed) once per distinct specialisation: one that
does not compile fails the check, named with the case that launched it. So a
``tl.constexpr`` branch that only another block size takes is compiled wherever a case
takes it, and what the interpreter graded is what a GPU would run.

The expected tokens come from ``specdec_course.verifier.rejection_sample`` itself: drafts and
uniforms are chosen so that row ``b`` accepts its first ``pos[b]`` drafts and rejects the next,
and its recovered token is read off the result. Kernels run under the Triton interpreter on
CPU tensors (the exercise notebook switches it on). Nothing here is random beyond fixed seeds:
the checks are token-for-token comparisons with no false failures.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from specdec_course import verifier

from ..student_side.helpers import make_race_inputs
from ..student_side.probes import launch_race
from . import context
from ._support import RULE_IMPLEMENTATIONS
from .context import case_seed
from .core import Case, call, register
from .fresh import fresh_session
from .kernel_source import (
    COMPILE_TIMEOUT_S,
    Refused,
    compile_cell,
    is_stub,
    kernel_cell,
    record_launch,
)
from .remote import Remote

__all__ = ["PUBLIC_IMPLEMENTATIONS", "launch_race", "make_race_inputs", "reference_race"]

# Not in the sandbox while ex05 is graded (judge.withheld): the package's races, its
# Triton kernels among them. The judge's reference above keeps using the real verifier.
PUBLIC_IMPLEMENTATIONS = ("specdec_course.sampling.exponential_race", *RULE_IMPLEMENTATIONS)
ALLOWED = {
    "specdec_course.verifier.rejection_sample": "the whole rule, whose race "
    "(rejection_sample_prepared) is withheld",
}


def reference_race(
    pos: torch.Tensor, p: torch.Tensor, q: torch.Tensor, e: torch.Tensor
) -> torch.Tensor:
    """The recovered tokens, from ``verifier.rejection_sample``: ``[B]`` int64.

    Row ``b`` drafts the target's argmax before ``pos[b]`` with a tiny uniform (accepted),
    then at ``pos[b]`` the id where ``q`` most exceeds ``p`` with ``u = 1`` (rejected, since
    ``q(x) > p(x)``), then nothing.
    """
    B, K, V = q.shape
    rows = torch.arange(B)
    j = torch.arange(K)
    drafts = torch.where(j < pos[:, None], p[:, :K].argmax(-1), -1)
    worst = (q - p[:, :K]).argmax(-1)  # [B, K]
    drafts[rows, pos] = worst[rows, pos]
    # u = 1e-9 accepts any draft with p(x) >= 1e-9 q(x) (an argmax has p >= 1/V); u = 1
    # rejects x because q(x) > p(x).
    u = torch.where(j < pos[:, None], 1e-9, 1.0).double()
    out = verifier.rejection_sample(drafts, q, p, uniforms=u, exp_noise=e)
    assert torch.equal(out.num_accepted, pos), "internal: the reference did not stop at pos"
    return out.token_ids[rows, pos]


def _diagnose(got: torch.Tensor, exp: torch.Tensor, pos, p, q, e, V: int, block_v: int) -> str:
    if (got == -1).all():
        return "nothing was stored: every token is still -1"
    if ((got < 0) | (got >= V)).any():
        return f"an id outside [0, V) = [0, {V}): a padding column of the last tile won the race"
    if block_v < V and torch.equal(got, exp % block_v) and not torch.equal(exp, exp % block_v):
        return "the ids are right within their tile, but not as columns of the whole vocabulary"
    if torch.equal(got, reference_race(torch.zeros_like(pos), p, q, e)):
        return "you raced at position 0 of every row, not at the row's rejected position"
    if torch.equal(got, (p[torch.arange(len(pos)), pos] / e).argmax(-1)):
        return "you raced over p: the recovered token is raced over the residual"
    if block_v < V:
        return "wrong tokens with several tiles, though right within one"
    return "wrong tokens: the score of a column, or which column wins, is off"


def _race_case(
    name: str,
    kernel,
    B: int,
    K: int,
    V: int,
    block_v: int,
    seed: int,
    zero_tail: int = 0,
    launches: list | None = None,
) -> Case:
    pos, p, q, e = make_race_inputs(B, K, V, case_seed(seed), zero_tail)
    exp = reference_race(pos, p, q, e)
    if launches is not None:  # what launch_race passes, from the judge's own values
        token = torch.full((B,), -1, dtype=torch.int64)
        launches.append(record_launch(name, (token, pos, p, q, e, K, V), {"BLOCK_V": block_v}))
    got = call(name, launch_race, kernel, pos, p, q, e, block_v)
    if not isinstance(got, torch.Tensor) or got.shape != exp.shape:
        return Case(name, False, str(exp.tolist()), repr(got), "internal: unexpected output")
    ok = torch.equal(got, exp)
    bad = (got != exp).nonzero().flatten().tolist()
    return Case(
        name,
        ok,
        expected=str(exp.tolist())
        if B <= 8
        else f"row {bad[0]}: token {exp[bad[0]].item()}"
        if bad
        else "",
        got=str(got.tolist())
        if B <= 8
        else f"row {bad[0]}: token {got[bad[0]].item()}"
        if bad
        else "",
        message="" if ok else _diagnose(got, exp, pos, p, q, e, V, block_v),
    )


@register(
    "ex05.race_kernel",
    points=10,
    needs="race_kernel",
    title="the race at the rejected position, in one vocabulary tile and in several",
    hint="one program per row: it reads that row's rejected position first, then the target "
    "and draft rows at that position (the table of section 1 gives where they start); the "
    "padding columns past V must load harmless values and never win. A tile's best is a "
    "candidate, not the answer: what must survive from one tile to the next, and which "
    "column should win a tie?",
)
def check_race_kernel(race_kernel) -> Iterator[Case]:
    with contextlib.ExitStack() as stack:
        text, fresh = None, None
        if isinstance(race_kernel, Remote):
            text = race_kernel._sd_session.notebook[1]
            try:
                race_kernel, fresh = _on_its_own(race_kernel, stack)
            except Refused as e:
                yield Case("the kernel, taken from the notebook", False, message=str(e))
                return
        launches: list[dict] = []
        yield from _race_cases(race_kernel, launches)
        if fresh is not None and not is_stub(text):
            yield _compiled(fresh, text, launches)


def _on_its_own(student: Remote, stack: contextlib.ExitStack):
    """The notebook's ``race_kernel``, defined from its source (and nothing else) in a
    fresh kernel under the student's kernel's sandbox and limits, and that kernel's session;
    closed with ``stack``.

    Raises :class:`.kernel_source.Refused` (with the reason) when the source cannot run on
    its own or the definition raises; :class:`.session.KernelGone` when no kernel starts."""
    cell = kernel_cell(student._sd_session.notebook[1])
    fresh = fresh_session(student, stack, "race_kernel")
    left = context.time_left()
    # Starting the kernel is the grader's time, not the student's: the check's deadline
    # starts again once the kernel is defined.
    with context.deadline(None):
        fresh.start()
        reply = fresh.run_cell(cell, 60.0)
    stack.enter_context(context.deadline(left))
    if not reply.get("ok"):
        err = reply.get("error") or {}
        what = "timed out" if reply.get("timeout") else str(err.get("type", "an error"))
        raise Refused(f"defining race_kernel on its own raised {what}")
    return Remote(fresh, "race_kernel", {"callable": True}), fresh


_COMPILED = "compiled for an NVIDIA GPU (sm_90), as each case launched it"


def _compiled(fresh, text: str, launches: list[dict]) -> Case:
    """The kernel compiled by Triton's own compiler for ``GPUTarget("cuda", 90, 32)`` once
    for every specialisation the cases launched (:func:`.kernel_source.compile_cell`): the
    interpreter alone runs any Python it is handed, and a ``tl.constexpr`` branch that only
    another block size takes is compiled only where a case launches it. In the fresh
    kernel, so under the sandbox; the compiler's time is the grader's."""
    with context.deadline(None):
        built = fresh.run_cell(compile_cell(text, launches), COMPILE_TIMEOUT_S)
    if built.get("ok"):
        return Case(_COMPILED, True)
    err = built.get("error") or {}
    lines = [line for line in str(err.get("message", "")).strip().splitlines() if line.strip()]
    why = "it timed out" if built.get("timeout") else (lines[0][:400] if lines else "error")
    kind = next((x for x in lines if x.startswith("triton.compiler.errors.")), "")
    kind = kind[len("triton.compiler.errors.") :].split(":")[0]
    last = lines[-1].strip()[:300] if len(lines) > 1 else ""
    detail = "; ".join(x for x in (kind, last) if x)
    return Case(
        _COMPILED,
        False,
        message=f"race_kernel does not compile with Triton for an NVIDIA GPU (sm_90): {why}"
        + (f" ({detail})" if detail else "")
        + "; a Triton kernel's body is Triton's language only, and every block size a case "
        "launches is compiled",
    )


# (name, B, K, V, BLOCK_V, zero_tail): one tile first (a kernel that is wrong there is wrong
# everywhere, and the message says so before the tile loop comes into it), then several.
CASES = (
    ("V = 16 in one tile of 16, 8 rows, K = 4", 8, 4, 16, 16, 0),
    ("V = 65 in one tile of 128 (63 padding columns)", 8, 3, 65, 128, 0),
    ("V = 256 in 4 tiles of 64", 8, 4, 256, 64, 0),
    ("V = 1000 in tiles of 256 (the last one partial)", 8, 5, 1000, 256, 0),
    ("V = 65 in tiles of 16 (the last holds 1 id)", 16, 8, 65, 16, 0),
    ("V = 20 in tiles of 8, ids 16-19 have probability 0", 8, 2, 20, 8, 4),
    ("V = 8193 in tiles of 1024", 4, 3, 8193, 1024, 0),
)


def _race_cases(race_kernel, launches: list | None = None) -> Iterator[Case]:
    """Every case of :data:`CASES` in order; each launch is recorded in ``launches``."""
    for seed, (name, B, K, V, block_v, zero_tail) in enumerate(CASES):
        yield _race_case(name, race_kernel, B, K, V, block_v, seed, zero_tail, launches)
