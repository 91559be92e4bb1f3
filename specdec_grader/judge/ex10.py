"""Checks of exercise 10: block verification's coins, and the law of what one call emits.

Students implement, in ``exercises/ex10_block_thresholds.ipynb``, for one drafted block
(Sun et al. 2024, Algorithm 2; lesson 09, section 1):

- ``coin_thresholds(p, q, draft) -> (weights [k + 1], h [k])``: the prefix weights
  ``w_0 = 1, w_i = min(w_{i-1} p_i(x_i) / q_i(x_i), 1)`` and the coins' thresholds
  ``h_i = r_i / (r_i + 1 - w_i)``, ``r_i = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0)``, with
  ``h_k = w_k`` at the last draft;
- ``emitted_law(p, q, draft) -> [k + 1, V]``: the probability, given the block, that the
  call keeps exactly ``i`` drafts and emits token ``v`` after them (the longest prefix whose
  coin came up is kept; the new token is drawn from the weighted residual, or from the bonus
  row when every draft was kept). Lesson 09 samples it; nobody there writes it down.

Inputs: ``p`` float64 ``[k + 1, V]`` (row ``i``: the target's distribution after the first
``i`` drafts; row ``k`` the bonus row), ``q`` float64 ``[k, V]`` (row ``i``: the draft's,
which draft ``i + 1`` was drawn from), ``draft`` int64 ``[k]``.

References: the package's :func:`specdec_course.block_verifier.block_thresholds` on the
judge's own copies, and the emitted law by **exact enumeration** of the ``2**k`` outcomes of
the coins (the kept prefix is the longest success), times the residual of the position it
stops at. Where the threshold is ``0 / 0`` (weight 1 and no residual: the models agree
after that prefix) every later threshold is 1, so the block can never stop there and any
value in ``[0, 1]`` is exact: that position accepts any such number, never NaN. The emitted
law check also sums the student's law over every block a small draft can propose and
compares the output with the target's law (the rule is lossless). Every check is exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch

from specdec_course.block_verifier import block_thresholds

from ._support import as_vector, fmt
from .context import case_seed, fresh_cases
from .core import Case, call, register

# Not in the sandbox while ex10 is graded (judge.withheld): the package's weights
# and thresholds (``block_verify``, which the notebooks sample from, raises there).
# block_verify_row computes the same thresholds inline (one row, Python floats): uniforms
# of 2.0 and a bisection on one coin read each threshold off it. kept_law is the law of the
# number kept, the emitted law's first factor.
PUBLIC_IMPLEMENTATIONS = (
    "specdec_course.block_verifier.block_thresholds",
    "specdec_course.block_verifier.block_verify_row",
    "specdec_course.block_verifier.kept_law",
)
ALLOWED: dict[str, str] = {}

__all__ = ["random_block", "reference_law", "reference_thresholds"]

_TOL = 1e-9


# --------------------------------------------------------------------------- references


def reference_thresholds(p, q, draft) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [k + 1], h [k])`` of one block, through the package's batched rule."""
    w, h = block_thresholds(draft[None], q[None], p[None])
    return w[0], h[0]


def _free(p, q, w: torch.Tensor) -> torch.Tensor:
    """Positions j (coin of draft j + 1) whose threshold is 0 / 0: free in [0, 1]."""
    k = q.shape[0]
    free = torch.zeros(k, dtype=torch.bool)
    for j in range(k - 1):
        r = (w[j + 1] * p[j + 1] - q[j + 1]).clamp_min(0).sum()
        free[j] = bool(r + 1 - w[j + 1] <= 0)
    return free


def _residual(p_row, q_row, weight) -> torch.Tensor:
    res = (weight * p_row - q_row).clamp_min(0)
    s = res.sum()
    return res / s if s > 0 else p_row.clone()  # no mass: the block never stops here


def reference_law(p, q, draft) -> torch.Tensor:
    """``[k + 1, V]``: P(keep exactly i drafts, then emit v | block), by enumerating coins."""
    w, h = reference_thresholds(p, q, draft)
    k = q.shape[0]
    keep = torch.zeros(k + 1, dtype=torch.float64)
    for coins in itertools.product((False, True), repeat=k):
        pr = 1.0
        for j, up in enumerate(coins):
            pr *= float(h[j]) if up else 1.0 - float(h[j])
        tau = max((j + 1 for j, up in enumerate(coins) if up), default=0)
        keep[tau] += pr
    law = torch.empty(k + 1, p.shape[1], dtype=torch.float64)
    for i in range(k):
        law[i] = keep[i] * _residual(p[i], q[i], w[i])
    law[k] = keep[k] * p[k]
    return law


def random_block(g: torch.Generator, V: int, k: int, sharp: float = 2.0):
    """A random (p, q, draft): rows of random logits, some zeros in p, drafts drawn from q."""
    p = (sharp * torch.randn(k + 1, V, generator=g, dtype=torch.float64)).softmax(-1)
    q = (sharp * torch.randn(k, V, generator=g, dtype=torch.float64)).softmax(-1)
    p[torch.rand(k + 1, V, generator=g) < 0.15] = 0.0
    p[:, 0] += 1e-3  # never an empty row
    p = p / p.sum(-1, keepdim=True)
    draft = torch.stack([torch.multinomial(q[i], 1, generator=g)[0] for i in range(k)])
    return p, q, draft


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def _named_blocks():
    g = torch.Generator().manual_seed(case_seed(1))
    blocks = []
    p, q, d = random_block(g, 4, 1)
    blocks.append(("one draft: its threshold is its weight", p, q, d))
    p, q, _ = random_block(g, 4, 3)
    d = torch.tensor([1, 2, 0])
    p[0] = _t([0.3, 0.4, 0.2, 0.1])  # the first draft is kept with some weight ...
    p[1, 2] = 0.0  # ... the target never emits the second
    p = p / p.sum(-1, keepdim=True)
    blocks.append(("a draft the target never emits: weight 0 from there on", p, q, d))
    p = _t([[0.1, 0.6, 0.3], [0.5, 0.4, 0.1], [0.2, 0.2, 0.6]])
    q = _t([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    blocks.append(("a draft the target likes more than the draft: weight capped at 1", p, q,
                   torch.tensor([1, 2])))  # fmt: skip
    p, q, _ = random_block(g, 3, 3)
    p[0], q[0] = _t([0.2, 0.5, 0.3]), _t([0.5, 0.2, 0.3])
    p[1] = q[1]  # after the first draft the models agree: 0 / 0 in its threshold
    blocks.append(("the models agree after the first draft (0 / 0 in a threshold)", p, q,
                   torch.tensor([1, 0, 2])))  # fmt: skip
    p, q, d = random_block(g, 5, 4)
    q = torch.nn.functional.one_hot(d, 5).double()
    blocks.append(("a one-hot draft (a greedy draft model)", p, q, d))
    p, q, d = random_block(g, 4, 3)
    blocks.append(("p == q everywhere: every draft kept", torch.cat([q, p[-1:]]), q, d))
    p, q, d = random_block(g, 4, 2)
    q[0] = _t([1e-12, 0.5, 0.5 - 1e-12, 0.0])
    d = torch.tensor([0, int(d[1])])
    blocks.append(("a draft the draft barely proposes (q(x) a trillionth)", p, q, d))
    return blocks


def _random_blocks(seed: int, n: int):
    g = torch.Generator().manual_seed(case_seed(seed))
    out = []
    for _ in range(n):
        V = int(torch.randint(2, 7, (), generator=g))
        k = int(torch.randint(1, 5, (), generator=g))
        sharp = float(torch.rand((), generator=g)) * 3 + 0.5
        out.append(random_block(g, V, k, sharp))
    return out


def _label(name, draft) -> str:
    return f"{name}: draft {draft.tolist()}"


def _args(p, q, d):  # the student's own copies (call copies tensors too; this is explicit)
    return p.clone(), q.clone(), d.clone()


# --------------------------------------------------------------------------- thresholds


def _close(got: torch.Tensor, exp: torch.Tensor) -> bool:
    return bool(((got - exp).abs() <= _TOL).all())


def _diagnose_thresholds(p, q, d, w, h, gw, gh, free) -> str:
    k = len(d)
    if not torch.isfinite(gw).all():
        return "NaN or inf in the weights: something you divide by can be 0"
    if not _close(gw, w):
        px = p[torch.arange(k), d]
        qx = q[torch.arange(k), d]
        ratio = torch.where(px >= qx, 1.0, px / qx)
        if (gw > 1 + _TOL).any():
            return "a weight above 1: the weight of a prefix is capped at 1"
        if _close(gw[1:], ratio):
            return (
                "each weight is its own draft's ratio: the weight carries the prefix's weight "
                "forward from one draft to the next"
            )
        if not abs(float(gw[0]) - 1) <= _TOL:
            return "the weight of the empty prefix (position 0) is 1"
        return "wrong weights (the running weight of each prefix)"
    if not torch.isfinite(gh).all():
        return (
            "NaN or inf in a threshold: where the weight is 1 and the models agree next, the "
            "formula is 0 / 0; a threshold must still be a probability (which value is exact "
            "there? look at the thresholds after it)"
        )
    if ((gh < -_TOL) | (gh > 1 + _TOL)).any():
        return "a threshold outside [0, 1]: it is the probability that a coin comes up"
    if not abs(float(gh[-1] - h[-1])) <= _TOL:
        return (
            "the last draft's coin: nothing comes after it to make up for a low weight, so "
            "its threshold is simply the weight of the whole block"
        )
    tokenwise = torch.where(
        p[torch.arange(k), d] >= q[torch.arange(k), d],
        1.0,
        p[torch.arange(k), d] / q[torch.arange(k), d],
    )
    if k > 1 and _close(gh[:-1], tokenwise[:-1]):
        return "these are token-wise verification's acceptance probabilities, not the block's"
    return (
        "wrong thresholds inside the block: the residual r_i is of the next position, "
        "weighted by the prefix's weight"
    )


@register(
    "ex10.coin_thresholds",
    points=5,
    needs="coin_thresholds",
    title="the prefix weights and the coins' thresholds of one block",
    hint="lesson 09, section 1, states the rule: walk the drafts in order carrying the "
    "weight; each coin's threshold compares the mass the next position could still give "
    "back (the weighted residual) with what the weight has lost so far; the last coin has "
    "nothing after it",
)
def check_coin_thresholds(fn) -> Iterator[Case]:
    for name, p, q, d in _named_blocks():
        yield _threshold_case(fn, _label(name, d), p, q, d)
    n = 200 if fresh_cases() else 100
    for i, (p, q, d) in enumerate(_random_blocks(2, n)):
        label = _label(f"random block {i} (V = {p.shape[1]}, k = {len(d)})", d)
        case = _threshold_case(fn, label, p, q, d)
        if not case.passed:
            yield Case(f"{n} random blocks: {label}", False, case.expected, case.got, case.message)
            return
    yield Case(f"{n} random blocks, k = 1 .. 4, V = 2 .. 6", True)


def _threshold_case(fn, label, p, q, d) -> Case:
    w, h = reference_thresholds(p, q, d)
    free = _free(p, q, w)
    raw = call(label, fn, *_args(p, q, d))
    k = len(d)
    if not (isinstance(raw, (tuple, list)) and len(raw) == 2):
        return Case(label, False, "(weights, h)", fmt(raw), "return a pair (weights, h)")
    gw, gh = as_vector(raw[0]), as_vector(raw[1])
    if gw is None or gw.shape != (k + 1,) or gh is None or gh.shape != (k,):
        why = "weights: one per prefix, the empty one included; h: one per draft"
        return Case(label, False, f"weights shape ({k + 1},), h shape ({k},)", fmt(raw), why)
    in_range = (gh >= 0) & (gh <= 1)
    ok = _close(gw, w) and bool(torch.where(free, in_range, (gh - h).abs() <= _TOL).all())
    exp = f"weights {fmt(w)}, h {fmt(h)}"
    got = f"weights {fmt(gw)}, h {fmt(gh)}"
    return Case(label, ok, exp, got,
                "" if ok else _diagnose_thresholds(p, q, d, w, h, gw, gh, free))  # fmt: skip


# --------------------------------------------------------------------------- emitted law


def _tokenwise_law(p, q, d) -> torch.Tensor:
    k = len(d)
    law = torch.zeros(k + 1, p.shape[1], dtype=torch.float64)
    alive = 1.0
    for i in range(k):
        a = min(1.0, float(p[i, d[i]] / q[i, d[i]]))
        law[i] = alive * (1 - a) * _residual(p[i], q[i], 1.0)
        alive *= a
    law[k] = alive * p[k]
    return law


def _diagnose_law(p, q, d, exp, got) -> str:
    k = len(d)
    if not torch.isfinite(got).all():
        return (
            "NaN or inf: a position the block can never stop at has no residual mass; its "
            "probability is 0, and so is every entry of its row (not 0 times 0 / 0)"
        )
    if (got < -_TOL).any():
        return "negative entries: these are probabilities"
    if not abs(float(got.sum()) - 1) <= 1e-7:
        return f"the law sums to {float(got.sum()):.6g}, not 1"
    if _close(got, _tokenwise_law(p, q, d)):
        return (
            "this is token-wise verification's law: in block verification a failed coin is "
            "not final, the longest prefix whose coin came up is kept"
        )
    if not _close(got.sum(1), exp.sum(1)):
        return (
            "the row sums (the probability of keeping exactly i drafts) are wrong: every "
            "coin is flipped, and the longest success wins"
        )
    if not _close(got[k], exp[k]):
        return "when every draft is kept the new token comes from the bonus row"
    return "the new token's law after i kept drafts: the residual carries the prefix's weight"


def _law_case(fn, label, p, q, d) -> Case:
    exp = reference_law(p, q, d)
    raw = call(label, fn, *_args(p, q, d))
    got = as_vector(raw)
    if got is None or got.shape != exp.shape:
        return Case(label, False, f"shape {tuple(exp.shape)}", fmt(raw),
                    "one row per number of kept drafts (0 .. k), one column per token")  # fmt: skip
    ok = _close(got, exp)
    return Case(label, ok, fmt(exp), fmt(got), "" if ok else _diagnose_law(p, q, d, exp, got))


def _toy(seed: int, V: int, k: int):
    """A target and a draft with one distribution per prefix (up to k tokens; k + 1 for p)."""
    g = torch.Generator().manual_seed(case_seed(seed))
    P = {pre: (1.5 * torch.randn(V, generator=g, dtype=torch.float64)).softmax(-1)
         for L in range(k + 1) for pre in itertools.product(range(V), repeat=L)}  # fmt: skip
    Q = {pre: (1.5 * torch.randn(V, generator=g, dtype=torch.float64)).softmax(-1)
         for L in range(k) for pre in itertools.product(range(V), repeat=L)}  # fmt: skip
    return P, Q


def _lossless_case(fn, seed: int, V: int, k: int) -> Case:
    """Sum the student's law over every block; complete each output with the target."""
    P, Q = _toy(seed, V, k)
    name = f"summed over all {V**k} blocks (V = {V}, k = {k}): the output follows the target"
    out = torch.zeros([V] * (k + 1), dtype=torch.float64)
    for block in itertools.product(range(V), repeat=k):
        qb = 1.0
        for i in range(k):
            qb *= float(Q[block[:i]][block[i]])
        p = torch.stack([P[block[:i]] for i in range(k + 1)])
        q = torch.stack([Q[block[:i]] for i in range(k)])
        d = torch.tensor(block)
        raw = call(f"{name}, block {list(block)}", fn, *_args(p, q, d))
        law = as_vector(raw)
        if law is None or law.shape != (k + 1, V):
            return Case(name, False, f"shape ({k + 1}, {V})", fmt(raw), "wrong shape")
        for seq in itertools.product(range(V), repeat=k + 1):
            tail = 0.0
            for i in range(k + 1):
                if i and seq[i - 1] != block[i - 1]:
                    break  # kept drafts are the block's own tokens
                rest = 1.0
                for t in range(i + 1, k + 1):
                    rest *= float(P[seq[:t]][seq[t]])
                tail += float(law[i, seq[i]]) * rest
            out[seq] += qb * tail
    target = torch.ones([V] * (k + 1), dtype=torch.float64)
    for seq in itertools.product(range(V), repeat=k + 1):
        for t in range(k + 1):
            target[seq] *= float(P[seq[:t]][seq[t]])
    diff = float((out - target).abs().max())
    ok = diff <= 1e-9
    msg = "" if ok else "the emitted text does not follow the target's law: the rule loses"
    return Case(name, ok, "largest difference <= 1e-9", f"{diff:.3g}", msg)


@register(
    "ex10.emitted_law",
    points=5,
    needs="emitted_law",
    title="the law of what one block-verification call emits, given the block",
    hint="first the probability of keeping exactly i drafts: all the coins are flipped, "
    "and the longest prefix whose coin came up wins (a failure is not final). Then the "
    "token that follows: drawn from the residual at that position, carrying the prefix's "
    "weight, or from the bonus row when nothing was rejected",
)
def check_emitted_law(fn) -> Iterator[Case]:
    for name, p, q, d in _named_blocks():
        yield _law_case(fn, _label(name, d), p, q, d)
    n = 150 if fresh_cases() else 80
    for i, (p, q, d) in enumerate(_random_blocks(3, n)):
        label = _label(f"random block {i} (V = {p.shape[1]}, k = {len(d)})", d)
        case = _law_case(fn, label, p, q, d)
        if not case.passed:
            yield Case(f"{n} random blocks: {label}", False, case.expected, case.got, case.message)
            return
    yield Case(f"{n} random blocks, k = 1 .. 4, V = 2 .. 6", True)
    yield _lossless_case(fn, 4, 3, 2)
    yield _lossless_case(fn, 5, 2, 3)
