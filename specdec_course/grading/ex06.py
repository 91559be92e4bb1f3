"""Checks of exercise 06: a Medusa head, the weighted multi-head loss, the tree attention mask.

Students implement, in ``exercises/ex06_medusa.ipynb``:

- ``MedusaHead(lm_head_weight)``: an ``nn.Module`` with ``self.linear`` (``nn.Linear(C, C)``,
  weight and bias zero) and ``self.lm_head`` (``nn.Linear(C, V, bias=False)``, a *copy* of
  ``lm_head_weight [V, C]``); ``forward(h [..., C])`` returns
  ``lm_head(h + SiLU(linear(h)))`` ``[..., V]``;
- ``medusa_loss(head_logits, ids)``: ``head_logits [K, B, T, V]`` are the heads' logits at
  every position of the windows ``ids [B, T]``; head ``k`` (1-based) at position ``t``
  predicts ``ids[:, t + 1 + k]`` (positions whose label lies past the window are left out);
  return ``sum_k 0.8^k * CE_k``, ``CE_k`` the mean cross-entropy of head ``k``;
- ``tree_attention_mask(paths)``: the bool ``[T, T]`` mask of a tree given as a list of
  paths; node 0 is the root, nodes ``1..`` are the paths sorted by ``(len(path), path)``,
  and ``mask[i, j]`` is True when ``j`` is ``i`` or an ancestor of ``i``.

The reference is :mod:`specdec_course.medusa` (``MedusaHead``, ``head_targets`` +
``medusa_loss``, ``tree_attention_mask``). Everything is exact arithmetic on seeded random
inputs (no sampling), compared to 1e-5.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from specdec_course import medusa

from ._support import as_number, as_vector, fmt
from .context import case_seed, fresh_cases
from .core import Case, call, register

ATOL = 1e-5


# ------------------------------------------------------------------------------------ the head


def _reference_head(weights) -> medusa.MedusaHead:
    lin_w, lin_b, lm_w = weights
    ref = medusa.MedusaHead(lin_w.shape[1], lm_w.shape[0])
    with torch.no_grad():
        ref.block.linear.weight.copy_(lin_w)
        ref.block.linear.bias.copy_(lin_b)
        ref.lm_head.weight.copy_(lm_w)
    return ref


def probe_head(cls, w: torch.Tensor, h: torch.Tensor, g: torch.Generator) -> dict:
    """Build the student's head from ``w`` and report on it as plain data (a probe: under
    the batch grader it runs in the kernel, where the class is; the check judges the data).

    Its layers, their shapes, its output on ``h`` fresh, whether ``w`` was shared or changed,
    and, after its parameters were redrawn from ``g``, its weights and its output again. An
    error of the constructor propagates; a later one is reported, as plain data, with the
    case it belongs to, and ends the probe.
    """
    from . import wire

    C, V = w.shape[1], w.shape[0]
    w_before = w.clone()
    head = call(f"MedusaHead(weight [{V}, {C}])", cls, w)
    out: dict = {"module": isinstance(head, nn.Module), "type": type(head).__name__}
    if not out["module"]:
        return out
    lin, lm = getattr(head, "linear", None), getattr(head, "lm_head", None)
    out["layers"] = (type(lin).__name__, type(lm).__name__)
    if not (isinstance(lin, nn.Linear) and isinstance(lm, nn.Linear)):
        return out
    out["shapes"] = (
        tuple(lin.weight.shape),
        lin.bias is not None,
        tuple(lm.weight.shape),
        lm.bias is None,
    )
    if out["shapes"] != ((C, C), True, (V, C), True):
        return out
    name = f"C={C}, V={V}"
    try:
        with torch.no_grad():
            out["fresh"] = call(f"{name}: forward of a fresh head", head, h)
        out["shared"] = lm.weight.data_ptr() == w.data_ptr() or not torch.equal(w, w_before)
        with torch.no_grad():
            for p in head.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        out["weights"] = tuple(t.detach().clone() for t in (lin.weight, lin.bias, lm.weight))
        with torch.no_grad():
            out["random"] = call(f"{name}: forward with trained weights", head, h)
    except Exception as e:  # noqa: BLE001 - the student's, reported when the check gets there
        out["error"] = wire.error_info(e)
    return out


def _step(info: dict, key: str):
    """The probe's result for ``key``, or the student's error that stopped it before."""
    from . import wire

    if key not in info and "error" in info:
        raise wire.rebuild_error(info["error"])
    return info.get(key)


@register(
    "ex06.medusa_head",
    points=3,
    needs="MedusaHead",
    title="a Medusa head: ResBlock, then a copy of lm_head",
    hint="lesson 06, section 1, builds the head: one residual block that starts as the "
    "identity, then the target's output layer, copied. Ask what SiLU(0) is, and what a "
    "head that shares the target's weight does to the target when it trains",
)
def check_medusa_head(cls) -> Iterator[Case]:
    g = torch.Generator().manual_seed(case_seed(0))
    for C, V in ((8, 11), (24, 65)):
        w = torch.randn(V, C, generator=g)
        h = torch.randn(5, 3, C, generator=g)
        info = call(f"MedusaHead(weight [{V}, {C}])", probe_head, cls, w, h, g)
        if not isinstance(info, dict):
            raise TypeError("the head probe returned no report")
        name = f"C={C}, V={V}"
        if not info.get("module"):
            yield Case(
                name,
                False,
                "an nn.Module",
                fmt(str(info.get("type"))),
                "MedusaHead must subclass nn.Module (call super().__init__())",
            )
            return
        shapes = info.get("shapes")
        if shapes is None:
            lin, lm = (tuple(info.get("layers") or ()) + ("?", "?"))[:2]
            yield Case(
                name,
                False,
                "attributes linear and lm_head (nn.Linear)",
                f"linear={lin}, lm_head={lm}",
                "the layers are not named as the notebook asks (linear, lm_head)",
            )
            return
        if tuple(shapes) != ((C, C), True, (V, C), True):
            yield Case(
                name,
                False,
                f"linear [{C}, {C}] with bias, lm_head [{V}, {C}] no bias",
                fmt(tuple(shapes)),
                "linear maps C -> C (with bias); lm_head maps C -> V "
                "without bias, like the target's",
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
                "a fresh head is not the base head: its residual block is not the "
                "identity, or lm_head does not start from lm_head_weight",
            )
            return
        yield Case(f"{name}: a fresh head equals the base head", True)
        if _step(info, "shared") is not False:
            yield Case(
                f"{name}: lm_head holds its own copy",
                False,
                "a copy",
                "the same tensor as the target's lm_head",
                "lm_head shares the target's tensor: training a head would change the target",
            )
            return
        weights = _step(info, "weights")
        got = as_vector(_step(info, "random"))
        with torch.no_grad():
            exp = _reference_head(weights).forward(h).double()
        ok = got is not None and got.shape == exp.shape and torch.allclose(got, exp, atol=1e-4)
        yield Case(
            f"{name}: forward with random weights",
            ok,
            fmt(exp[0, 0]),
            fmt(None if got is None else got.flatten()[:V]),
            ""
            if ok
            else "forward differs once the weights are not zero: check where the "
            "residual adds h back and what lm_head reads",
        )


# ------------------------------------------------------------------------------------ the loss


def _reference_loss(logits: torch.Tensor, ids: torch.Tensor, decay: float = 0.8) -> float:
    K = logits.shape[0]
    targets, valid = medusa.head_targets(ids, K)
    return float(medusa.medusa_loss(logits.double(), targets, valid, decay)[0])


def _shifted_loss(logits, ids, shift):
    # Cross-entropies with the labels shifted by k + shift instead of k + 1 (diagnosis only).
    K, B, T, V = logits.shape
    total = 0.0
    for k in range(1, K + 1):
        s = k + shift
        if s >= T or s < 0:
            continue
        ce = nn.functional.cross_entropy(
            logits[k - 1, :, : T - s].reshape(-1, V).double(), ids[:, s:].reshape(-1)
        )
        total += 0.8**k * float(ce)
    return total


def _diagnose_loss(logits, ids, got: float) -> str:
    K = logits.shape[0]
    targets, valid = medusa.head_targets(ids, K)
    _, ce = medusa.medusa_loss(logits.double(), targets, valid)
    ce = ce.tolist()

    def close(x):
        return abs(got - x) <= 1e-5 * max(1.0, abs(x))

    if close(sum(ce)):
        return "every head has weight 1: the heads' cross-entropies are not weighted"
    if close(sum(0.8 ** (k - 1) * c for k, c in enumerate(ce, 1))):
        return "the weights are one power of 0.8 off: head 1 (k = 1) has weight 0.8"
    if close(sum(ce) / K) or close(sum(0.8**k * c for k, c in enumerate(ce, 1)) / K):
        return "you averaged over the heads: the loss is a weighted sum"
    if close(_shifted_loss(logits, ids, 0)):
        return (
            "off by one: each head's labels are shifted one position too little (the "
            "base head predicts t + 1, head 1 the token after)"
        )
    if close(_shifted_loss(logits, ids, 2)):
        return "shifted one too far: each head's labels are one position too late"
    return "wrong loss, and not by a known slip (weights, averaging, a shift by one)"


@register(
    "ex06.medusa_loss",
    points=3,
    needs="medusa_loss",
    title="the weighted multi-head loss",
    hint="for one head, write down which token is its label at position t, and which "
    "positions have a label inside the window; lesson 06, section 1 (the loss), gives the weights",
)
def check_medusa_loss(fn) -> Iterator[Case]:
    g = torch.Generator().manual_seed(case_seed(6))
    for K, B, T, V in ((3, 2, 9, 13), (1, 2, 6, 5), (3, 4, 32, 65), (4, 1, 12, 7)):
        logits = 2 * torch.randn(K, B, T, V, generator=g)
        ids = torch.randint(V, (B, T), generator=g)
        name = f"K={K} heads, ids [{B}, {T}], V={V}"
        got_raw = call(name, fn, logits.clone(), ids.clone())
        got = as_number(got_raw)
        exp = _reference_loss(logits, ids)
        if got is None:
            yield Case(
                name,
                False,
                f"{exp:.6g}",
                fmt(got_raw),
                "return a scalar (a number or a 0-d tensor)",
            )
            return
        ok = abs(got - exp) <= 1e-5 * max(1.0, abs(exp))
        yield Case(
            name, ok, f"{exp:.6g}", f"{got:.6g}", "" if ok else _diagnose_loss(logits, ids, got)
        )
        if not ok:
            return


# ------------------------------------------------------------------------------------ the mask

TREES = {
    "a single node": [(0,)],
    "a chain of three": [(0,), (0, 0), (0, 0, 0)],
    "two children of the root": [(1,), (0,)],
    "paths given out of order": [(0, 0, 0), (1,), (0,), (0, 1), (0, 0), (1, 0)],
    "TREE_SMALL": list(medusa.TREE_SMALL),
    "TREE_LARGE, reversed": list(reversed(medusa.TREE_LARGE)),
}


def _random_tree(seed: int) -> list[tuple[int, ...]]:
    """Paths of a random tree (depth up to 4, up to 3 children a node), in random order."""
    g = torch.Generator().manual_seed(seed)
    paths, frontier = [], [()]
    while frontier and len(paths) < 24:
        parent = frontier.pop(0)
        for child in range(int(torch.randint(0 if parent else 1, 4, (), generator=g))):
            path = (*parent, child)
            paths.append(path)
            if len(path) < 4:
                frontier.append(path)
    order = torch.randperm(len(paths), generator=g).tolist()
    return [paths[i] for i in order]


def _diagnose_mask(paths, got: torch.Tensor, exp: torch.Tensor) -> str:
    if got.shape != exp.shape:
        return (
            f"the mask is [T, T] with T = len(paths) + 1 = {exp.shape[0]}: row and column "
            "0 are the root"
        )
    if torch.equal(got, exp & ~torch.eye(len(exp), dtype=torch.bool)):
        return "a node may attend to itself: set the diagonal"
    if torch.equal(got[:, 1:], exp[:, 1:]) and not got[:, 0].all():
        return "every node attends to the root (column 0 is all True)"
    if torch.equal(got, exp.T):
        return "transposed: row i is the query node, column j the key it may attend to"
    unsorted = [()] + [tuple(p) for p in paths]
    if len(unsorted) == len(exp):
        T = len(unsorted)
        alt = torch.zeros(T, T, dtype=torch.bool)
        for i, p in enumerate(unsorted):
            for d in range(len(p) + 1):
                if p[:d] in unsorted:
                    alt[i, unsorted.index(p[:d])] = True
        if torch.equal(got, alt):
            return "the nodes are not in the mask's order: sort the paths as the notebook says"
    if torch.equal(got, exp.tril()) or torch.equal(got, torch.ones_like(exp).tril()):
        return (
            "a causal (lower-triangular) mask lets siblings see each other; a node sees "
            "only its ancestors"
        )
    return (
        "wrong mask: a node attends to itself and its ancestors only (the root is an "
        "ancestor of every node)"
    )


@register(
    "ex06.tree_attention_mask",
    points=4,
    needs="tree_attention_mask",
    title="the tree attention mask",
    hint="draw a small tree (lesson 06, section 3): for one node, list the nodes on its path "
    "to the root; how do you tell from two paths whether one node is an ancestor of the other?",
)
def check_tree_attention_mask(fn) -> Iterator[Case]:
    trees = dict(TREES)
    if fresh_cases():  # the batch grader's: a tree drawn for this run
        trees["a random tree"] = _random_tree(case_seed(60))
    for name, paths in trees.items():
        exp = medusa.tree_attention_mask(paths)
        got_raw = call(name, fn, [tuple(p) for p in paths])
        got = as_vector(got_raw)
        if got is None:
            yield Case(
                name,
                False,
                f"bool tensor {tuple(exp.shape)}",
                fmt(got_raw),
                "return a tensor (bool, or 0/1)",
            )
            return
        got = got != 0
        ok = got.shape == exp.shape and torch.equal(got, exp)
        yield Case(
            name, ok, fmt(exp.int()), fmt(got.int()), "" if ok else _diagnose_mask(paths, got, exp)
        )
        if not ok:
            return
