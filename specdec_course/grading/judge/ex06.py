"""Checks of exercise 06: a head that reads the token before it, the weighted loss, the tree
pass's attention bias.

Students implement, in ``exercises/ex06_medusa.ipynb``:

- ``MedusaHead(lm_head_weight, n_layers=1)``: a head that, as Hydra's heads do (Ankner et
  al. 2024), also reads the token drafted just before its own. An ``nn.Module`` with
  ``self.embed`` (``nn.Embedding(V, C)``, zero), ``self.blocks``, an ``nn.ModuleList`` of
  ``n_layers`` residual blocks (``nn.Linear(C, C)`` each, weight and bias zero, none shared),
  and ``self.lm_head`` (``nn.Linear(C, V, bias=False)``, a *copy* of ``lm_head_weight [V,
  C]``); ``forward(h [..., C], prev [...])`` starts from ``x = h + embed(prev)``, applies
  ``x <- x + SiLU(block(x))`` for each block in order, then ``lm_head``;
- ``medusa_loss(head_logits, ids)``: ``head_logits [K, B, T, V]`` are the heads' logits at
  every position of the windows ``ids [B, T]``; head ``k`` (1-based) at position ``t``
  predicts ``ids[:, t + 1 + k]`` (positions whose label lies past the window are left out);
  return ``sum_k 0.8^k * CE_k``, ``CE_k`` the mean cross-entropy of head ``k`` (the stub
  asks for lesson 06's weights without giving them);
- ``tree_attention_bias(parents, prefix_len)``: the additive attention bias and the position
  ids of one tree pass after a cached prefix. Node 0 is the root (``parents[0] == -1``), the
  nodes come in any order (a parent may follow its child); ``bias [T, prefix_len + T]`` is 0
  where node ``i`` may attend (the whole prefix, itself, its ancestors) and ``-inf``
  elsewhere, and ``positions[i] = prefix_len + depth(i)``.

Lesson 06 builds a one-block head on ``h`` alone (its ``Head`` fails the check: it cannot
take the previous token) and the boolean mask of a breadth-first list of paths; the token
read beside ``h``, several blocks, a tree given by parents in any order, the prefix and the
positions are this exercise's variations. The reference is :mod:`specdec_course.medusa`
(``ResBlock``, ``head_targets`` + ``medusa_loss``, ``build_tree``). Everything is exact
arithmetic on seeded random inputs (no sampling), compared to 1e-5.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from specdec_course import medusa

from ..kernel import wire
from ..kernel.probes import load_head
from ._support import as_number, as_vector, fmt
from .context import case_seed, fresh_cases
from .core import Case, call, register

# Not in the sandbox while ex06 is graded (grading.judge.withheld): the package's head
# blocks, its loss and targets, and its tree buffers (the mask and positions).
PUBLIC_IMPLEMENTATIONS = (
    "specdec_course.medusa.heads.ResBlock.forward",
    "specdec_course.medusa.heads.MedusaHead.forward",
    "specdec_course.medusa.heads.head_targets",
    "specdec_course.medusa.heads.loss_weights",
    "specdec_course.medusa.heads.medusa_loss",
    "specdec_course.medusa.tree.build_tree",
    "specdec_course.medusa.tree.tree_attention_mask",
    "specdec_course.medusa.tree.tree_bias_buffer",
)
ALLOWED: dict[str, str] = {}

ATOL = 1e-5


# ------------------------------------------------------------------------------------ the head


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
            f"MedusaHead(weight [{V}, {C}], n_layers={n})", load_head, cls, w, n, h, prev, weights
        )
        if not isinstance(info, dict):
            raise TypeError("the head probe returned no report")
        name = f"C={C}, V={V}, n_layers={n}"
        if not info.get("module"):
            yield Case(
                name,
                False,
                "an nn.Module",
                fmt(str(info.get("type"))),
                "MedusaHead is not an nn.Module (did __init__ call super().__init__()?)",
            )
            return
        shapes = info.get("shapes")
        if shapes is None:
            blocks, embed, lm = (tuple(info.get("layers") or ()) + ("?", "?", "?"))[:3]
            yield Case(
                name,
                False,
                "embed (an nn.Embedding), blocks (an nn.ModuleList of nn.Linear) and lm_head "
                "(an nn.Linear)",
                f"embed={embed}, blocks={blocks}, lm_head={lm}",
                "the grader reads self.embed, self.blocks and self.lm_head: keep those names "
                "and types (lesson 06's Head has no embedding: this head reads the token "
                "drafted before its own)",
            )
            return
        blocks, embed_shape, lm = shapes
        want = tuple((((C, C), True),) * n), ((V, C), True)
        if len(blocks) != n:
            yield Case(
                name,
                False,
                f"{n} residual block(s)",
                f"{len(blocks)}",
                f"n_layers={n} asks for {n} residual blocks",
            )
            return
        if (tuple(tuple(b) for b in blocks), tuple(lm)) != (want[0], want[1]) or tuple(
            embed_shape
        ) != (V, C):
            yield Case(
                name,
                False,
                f"embed [{V}, {C}], blocks [{C}, {C}] with bias, lm_head [{V}, {C}] without",
                fmt(shapes),
                "embed holds a vector of width C per token; a block maps C -> C (with a "
                "bias); lm_head maps C -> V without a bias, like the target's",
            )
            return
        if not (info.get("distinct") and info.get("blocks_distinct")):
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
        if _step(info, "shared") is not False:
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
        return "every head has weight 1: the heads further ahead should weigh less"
    if close(sum(0.8 ** (k - 1) * c for k, c in enumerate(ce, 1))):
        return "the weights are one power of 0.8 off: the first head's weight is 1 instead of 0.8"
    if close(sum(ce) / K) or close(sum(0.8**k * c for k, c in enumerate(ce, 1)) / K):
        return "you averaged over the heads; the loss is a weighted sum"
    if close(_shifted_loss(logits, ids, 0)):
        return (
            "off by one: each head was scored against the token one place too early (head "
            "1 against what the base head predicts)"
        )
    if close(_shifted_loss(logits, ids, 2)):
        return "off by one: each head was scored against the token one place too late"
    return (
        "wrong loss, and not by a known slip (the weights, the shift by one, an average); "
        "is each head's cross-entropy the mean over exactly its labelled positions?"
    )


@register(
    "ex06.medusa_loss",
    points=3,
    needs="medusa_loss",
    title="the weighted multi-head loss",
    hint="write down, for head 1 and a window of 6 tokens, which positions have a label and "
    "which token each one must guess; then head k. Lesson 06, section 1 shows the targets on "
    "a line of Julius Caesar",
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


# ------------------------------------------------------------------------------------ the bias

# (name, paths, prefix length, shuffle the nodes): breadth-first trees first, then trees whose
# parents come after their children.
TREES = [
    ("the root alone, no prefix", [], 0, False),
    ("a chain of three after 5 cached tokens", [(0,), (0, 0), (0, 0, 0)], 5, False),
    ("two children of the root, no prefix", [(0,), (1,)], 0, False),
    ("TREE_SMALL after 10 cached tokens", list(medusa.TREE_SMALL), 10, False),
    ("a chain listed leaf first", [(0,), (0, 0), (0, 0, 0)], 2, True),
    ("TREE_LARGE, nodes shuffled, after 7 cached tokens", list(medusa.TREE_LARGE), 7, True),
]


def _random_tree(seed: int) -> list[tuple[int, ...]]:
    """Paths of a random tree (depth up to 4, up to 3 children a node)."""
    g = torch.Generator().manual_seed(seed)
    paths, frontier = [], [()]
    while frontier and len(paths) < 24:
        parent = frontier.pop(0)
        for child in range(int(torch.randint(0 if parent else 1, 4, (), generator=g))):
            path = (*parent, child)
            paths.append(path)
            if len(path) < 4:
                frontier.append(path)
    return paths


def _tree_case(paths, shuffle_seed: int | None):
    """``(parents, mask [T, T], depth [T])`` of the tree, its non-root nodes shuffled."""
    tb = medusa.build_tree(paths)
    T = tb.size
    order = list(range(T))
    if shuffle_seed is not None and T > 2:
        g = torch.Generator().manual_seed(shuffle_seed)
        rest = [1 + int(i) for i in torch.randperm(T - 1, generator=g)]
        while rest == sorted(rest):  # make sure some parent follows its child
            rest = [1 + int(i) for i in torch.randperm(T - 1, generator=g)]
        order = [0, *rest]  # new node i is the breadth-first node order[i]
    new = {old: i for i, old in enumerate(order)}
    parents = [-1] + [new[tb.parents[old]] for old in order[1:]]
    idx = torch.tensor(order)
    return parents, tb.mask[idx][:, idx], tb.depth[idx]


def _diagnose_bias(parents, L, mask, depth, got_mask, got_pos, finite) -> str | None:
    """What is wrong in a returned ``(bias, positions)``, given its allowed entries ``got_mask``
    (0 in the bias) and ``finite`` (no value other than 0 and -inf); ``None`` if right."""
    T = len(parents)
    if not finite:
        return (
            "the bias holds values other than 0 and -inf: an additive bias is 0 where "
            "attention is allowed and -inf where it is not (a bool mask is not a bias)"
        )
    if got_mask.shape != (T, L + T):
        return (
            f"the bias is [T, prefix_len + T] = [{T}, {L + T}]: one row per node, one column "
            "per cached position and per node"
        )
    if L and not got_mask[:, :L].all():
        return "a node cannot see the cached prefix: every node attends to all of it"
    tree = got_mask[:, L:]
    if not torch.equal(tree, mask):
        eye = torch.eye(T, dtype=torch.bool)
        if torch.equal(tree, mask & ~eye):
            return "a node may attend to itself (the diagonal)"
        if torch.equal(tree, mask.T):
            return "transposed: row i is the query node, column j the node it may attend to"
        if torch.equal(tree, torch.ones(T, T, dtype=torch.bool).tril()):
            return (
                "a causal mask lets siblings and cousins see each other; a node sees its "
                "ancestors only"
            )
        if any(parents[i] > i for i in range(T)):
            return (
                "wrong on a tree whose parents come after some of their children: the nodes "
                "are in no particular order here"
            )
        return "a node must see exactly itself and its ancestors among the tree's nodes"
    if got_pos is None or got_pos.shape != depth.shape:
        return f"positions holds one position id per node: shape [{T}]"
    if torch.equal(got_pos, (L + depth).double()):
        return None
    if torch.equal(got_pos, depth.double()):
        return "the positions start at 0; the tree comes after the cached prefix"
    if torch.equal(got_pos, (L + torch.arange(T)).double()):
        return "the positions follow the node index; a node's position is set by its depth"
    if not torch.equal(got_pos, (L + depth).double()):
        return "wrong positions: a node sits as far after the prefix as it is deep"
    return None


@register(
    "ex06.tree_attention_bias",
    points=4,
    needs="tree_attention_bias",
    title="the tree pass's attention bias and positions",
    hint="a node's ancestors are found by following parents up to the root, whatever the "
    "order of the nodes; its depth is the number of steps. Lesson 06, section 3, says what "
    "a node may see and where it sits; the bias turns that into numbers the attention adds",
)
def check_tree_attention_bias(fn) -> Iterator[Case]:
    trees = list(TREES)
    if fresh_cases():  # the batch grader's: a tree drawn for this run
        trees.append(
            (
                "a random tree, nodes shuffled, after 4 cached tokens",
                _random_tree(case_seed(60)),
                4,
                True,
            )
        )
    for i, (name, paths, L, shuffle) in enumerate(trees):
        parents, mask, depth = _tree_case(paths, case_seed(61 + i) if shuffle else None)
        raw = call(name, fn, list(parents), L)
        if not (isinstance(raw, tuple) and len(raw) == 2):
            yield Case(
                name,
                False,
                "(bias, positions)",
                fmt(raw),
                "return a pair: the bias and the positions",
            )
            return
        bias, pos = as_vector(raw[0]), as_vector(raw[1])
        if bias is None or bias.dim() != 2:
            yield Case(
                name,
                False,
                f"a float tensor [{len(parents)}, {L + len(parents)}]",
                fmt(raw[0]),
                "the bias is a 2-D float tensor",
            )
            return
        finite = bool(((bias == 0) | (bias == float("-inf"))).all()) and raw[0].dtype != torch.bool
        got_mask = bias == 0
        exp = torch.zeros(len(parents), L + len(parents)).masked_fill(
            ~torch.cat([torch.ones(len(parents), L, dtype=torch.bool), mask], dim=1), float("-inf")
        )
        problem = _diagnose_bias(parents, L, mask, depth, got_mask, pos, finite)
        yield Case(
            f"{name} (parents {parents})" if len(parents) <= 8 else name,
            problem is None,
            f"bias {fmt(exp)}, positions {(L + depth).tolist()}",
            f"bias {fmt(raw[0])}, positions {fmt(raw[1])}",
            problem or "",
        )
        if problem is not None:
            return
