"""Exercise 06's checks: a correct solution earns every point, each typical mistake loses them.

The exercise varies lesson 06's cells: a head that also reads the token drafted before its
own (as Hydra's heads do), of several residual blocks, and the additive attention bias and
positions of a tree given by parents in any order, after a cached prefix. Lesson 06's own
head (on h alone) and breadth-first mask do not pass as they are.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import report_text
from torch import nn

from specdec_grader import checks_for, run_check

# ----------------------------------------------------------------------------- a solution


class MedusaHead(nn.Module):
    """A head that reads h and the previous token: n_layers residual blocks, a copy of lm_head."""

    def __init__(self, lm_head_weight: torch.Tensor, n_layers: int = 1):
        super().__init__()
        V, C = lm_head_weight.shape
        self.embed = nn.Embedding(V, C)
        nn.init.zeros_(self.embed.weight)  # a fresh head is the base head
        self.blocks = nn.ModuleList(nn.Linear(C, C) for _ in range(n_layers))
        for block in self.blocks:  # each block starts as the identity: SiLU(0) = 0
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
        self.lm_head = nn.Linear(C, V, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(lm_head_weight)  # a copy: the target stays as it is

    def forward(self, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        h = h + self.embed(prev)
        for block in self.blocks:
            h = h + F.silu(block(h))
        return self.lm_head(h)


def medusa_loss(head_logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Medusa-1 loss: the heads' cross-entropies, weighted as lesson 06 weighs them."""
    K, B, T, V = head_logits.shape
    loss = head_logits.new_zeros(())
    for k in range(1, K + 1):
        # position t guesses ids[t + 1 + k]: the last 1 + k positions have no label
        logits = head_logits[k - 1, :, : T - 1 - k].reshape(-1, V)
        loss = loss + 0.8**k * F.cross_entropy(logits, ids[:, 1 + k :].reshape(-1))
    return loss


def tree_attention_bias(parents: list[int], prefix_len: int):
    """(bias [T, prefix_len + T], positions [T]) of one tree pass after a cached prefix."""
    T = len(parents)
    seen = torch.zeros(T, T, dtype=torch.bool)  # seen[i, j]: node j is i or an ancestor
    for i in range(T):
        j = i
        while j != -1:  # up the parents to the root, whatever order the nodes come in
            seen[i, j] = True
            j = parents[j]
    bias = torch.full((T, prefix_len + T), float("-inf"))
    bias[:, :prefix_len] = 0.0  # every node sees the whole cached prefix
    bias[:, prefix_len:].masked_fill_(seen, 0.0)
    depth = seen.sum(-1) - 1  # the number of ancestors
    return bias, prefix_len + depth


# ----------------------------------------------------------------------------- mistakes


class HeadBiasNotZeroed(MedusaHead):
    def __init__(self, w, n_layers=1):
        super().__init__(w, n_layers)
        for b in self.blocks:
            nn.init.normal_(b.bias)


class HeadSharedWeight(MedusaHead):
    def __init__(self, w, n_layers=1):
        super().__init__(w, n_layers)
        self.lm_head.weight = nn.Parameter(w)  # the target's own tensor


class HeadNoResidual(MedusaHead):
    def forward(self, h, prev):
        h = h + self.embed(prev)
        for b in self.blocks:
            h = F.silu(b(h))
        return self.lm_head(h)


class HeadOneBlockRepeated(MedusaHead):
    def __init__(self, w, n_layers=1):
        super().__init__(w, 1)
        self.blocks = nn.ModuleList([self.blocks[0]] * n_layers)  # one module, shared


class HeadBlocksSideBySide(MedusaHead):
    def forward(self, h, prev):
        h = h + self.embed(prev)
        return self.lm_head(h + sum(F.silu(b(h)) for b in self.blocks))


class HeadIgnoresPrev(MedusaHead):
    # lesson 06's head with an embedding it never reads
    def forward(self, h, prev):
        for b in self.blocks:
            h = h + F.silu(b(h))
        return self.lm_head(h)


class HeadEmbedsAfter(MedusaHead):
    def forward(self, h, prev):
        for b in self.blocks:
            h = h + F.silu(b(h))
        return self.lm_head(h + self.embed(prev))


class HeadEmbedNotZeroed(MedusaHead):
    def __init__(self, w, n_layers=1):
        super().__init__(w, n_layers)
        nn.init.normal_(self.embed.weight)


class LessonHeadLoop(nn.Module):
    # Lesson 06's Head in a loop: the blocks right, but forward reads h alone.
    def __init__(self, w, n_layers=1):
        super().__init__()
        V, C = w.shape
        self.embed = nn.Embedding(V, C)
        nn.init.zeros_(self.embed.weight)
        self.blocks = nn.ModuleList(nn.Linear(C, C) for _ in range(n_layers))
        for b in self.blocks:
            nn.init.zeros_(b.weight)
            nn.init.zeros_(b.bias)
        self.lm_head = nn.Linear(C, V, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(w)

    def forward(self, h):
        for b in self.blocks:
            h = h + F.silu(b(h))
        return self.lm_head(h)


class LessonHead(nn.Module):
    # Lesson 06's one-block head as it stands: n_layers is not there.
    def __init__(self, w):
        super().__init__()
        V, C = w.shape
        self.linear = nn.Linear(C, C)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.lm_head = nn.Linear(C, V, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(w)

    def forward(self, h):
        return self.lm_head(h + F.silu(self.linear(h)))


def loss_unweighted(head_logits, ids):
    K, B, T, V = head_logits.shape
    return sum(
        F.cross_entropy(
            head_logits[k - 1, :, : T - 1 - k].reshape(-1, V), ids[:, 1 + k :].reshape(-1)
        )
        for k in range(1, K + 1)
    )


def loss_off_by_one(head_logits, ids):
    K, B, T, V = head_logits.shape
    return sum(
        0.8**k
        * F.cross_entropy(head_logits[k - 1, :, : T - k].reshape(-1, V), ids[:, k:].reshape(-1))
        for k in range(1, K + 1)
    )


def loss_weights_from_one(head_logits, ids):
    K, B, T, V = head_logits.shape
    return sum(
        0.8 ** (k - 1)
        * F.cross_entropy(
            head_logits[k - 1, :, : T - 1 - k].reshape(-1, V), ids[:, 1 + k :].reshape(-1)
        )
        for k in range(1, K + 1)
    )


def bias_as_bool(parents, prefix_len):
    bias, pos = tree_attention_bias(parents, prefix_len)
    return bias == 0, pos


def bias_no_self(parents, prefix_len):
    bias, pos = tree_attention_bias(parents, prefix_len)
    T = len(parents)
    bias[:, prefix_len:] = bias[:, prefix_len:].masked_fill(
        torch.eye(T, dtype=torch.bool), float("-inf")
    )
    return bias, pos


def bias_without_prefix(parents, prefix_len):
    bias, pos = tree_attention_bias(parents, prefix_len)
    bias[:, :prefix_len] = float("-inf")
    return bias, pos


def bias_positions_from_zero(parents, prefix_len):
    bias, pos = tree_attention_bias(parents, prefix_len)
    return bias, pos - prefix_len


def bias_positions_by_index(parents, prefix_len):
    bias, _ = tree_attention_bias(parents, prefix_len)
    return bias, prefix_len + torch.arange(len(parents))


def bias_breadth_first_only(parents, prefix_len):
    # Fills each row from its parent's row: right only when parents come before children.
    T = len(parents)
    seen = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        if parents[i] >= 0:
            seen[i] = seen[parents[i]]
        seen[i, i] = True
    bias = torch.full((T, prefix_len + T), float("-inf"))
    bias[:, :prefix_len] = 0.0
    bias[:, prefix_len:].masked_fill_(seen, 0.0)
    return bias, prefix_len + seen.sum(-1) - 1


def bias_causal(parents, prefix_len):
    T = len(parents)
    bias = torch.zeros(T, prefix_len + T)
    bias[:, prefix_len:] = torch.zeros(T, T).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")
    )
    return bias, tree_attention_bias(parents, prefix_len)[1]


def stub(*args):
    raise NotImplementedError


# ----------------------------------------------------------------------------- tests


def test_exercise_06_has_three_checks_worth_ten_points():
    specs = checks_for("ex06")
    assert [s.id for s in specs] == [
        "ex06.medusa_head",
        "ex06.medusa_loss",
        "ex06.tree_attention_bias",
    ]
    assert sum(s.points for s in specs) == 10


def test_solution_earns_every_point():
    for r in (
        run_check("ex06.medusa_head", MedusaHead),
        run_check("ex06.medusa_loss", medusa_loss),
        run_check("ex06.tree_attention_bias", tree_attention_bias),
    ):
        assert r.status == "passed", r.report()
        assert r.points == r.max_points


HEADS = [
    HeadBiasNotZeroed,
    HeadSharedWeight,
    HeadNoResidual,
    HeadOneBlockRepeated,
    HeadBlocksSideBySide,
    HeadIgnoresPrev,
    HeadEmbedsAfter,
    HeadEmbedNotZeroed,
    LessonHeadLoop,
    LessonHead,
]
LOSSES = [loss_unweighted, loss_off_by_one, loss_weights_from_one]
BIASES = [
    bias_as_bool,
    bias_no_self,
    bias_without_prefix,
    bias_positions_from_zero,
    bias_positions_by_index,
    bias_breadth_first_only,
    bias_causal,
]


@pytest.mark.parametrize(
    "wrong, says",
    [
        (HeadBiasNotZeroed, "identity"),
        (HeadSharedWeight, "copy"),
        (HeadNoResidual, "identity"),
        (HeadOneBlockRepeated, "share their weights"),
        (HeadBlocksSideBySide, "one after another"),
        (HeadIgnoresPrev, "ignored the token drafted before it"),
        (HeadEmbedsAfter, "added after the blocks"),
        (HeadEmbedNotZeroed, "embedding must start at zero"),
        (LessonHeadLoop, "lesson 06's Head takes h alone"),
    ],
)
def test_wrong_head_fails_with_a_diagnosis(wrong, says):
    r = run_check("ex06.medusa_head", wrong)
    assert r.status == "failed" and r.points == 0, r.report()
    assert says in report_text(r), r.report()


def test_lesson_06s_one_block_head_does_not_pass_as_is():
    r = run_check("ex06.medusa_head", LessonHead)
    assert r.status in ("failed", "error") and r.points == 0, r.report()


@pytest.mark.parametrize(
    "wrong, says",
    [
        (loss_unweighted, "weight 1"),
        (loss_off_by_one, "off by one"),
        (loss_weights_from_one, "first head's weight"),
    ],
)
def test_wrong_loss_fails_with_a_diagnosis(wrong, says):
    r = run_check("ex06.medusa_loss", wrong)
    assert r.status == "failed" and r.points == 0, r.report()
    assert says in report_text(r), r.report()


@pytest.mark.parametrize(
    "wrong, says",
    [
        (bias_as_bool, "not a bias"),
        (bias_no_self, "itself"),
        (bias_without_prefix, "prefix"),
        (bias_positions_from_zero, "start at 0"),
        (bias_positions_by_index, "depth"),
        (bias_breadth_first_only, "no particular order"),
        (bias_causal, "siblings"),
    ],
)
def test_wrong_bias_fails_with_a_diagnosis(wrong, says):
    r = run_check("ex06.tree_attention_bias", wrong)
    assert r.status == "failed" and r.points == 0, r.report()
    assert says in report_text(r), r.report()


def test_untouched_stubs_are_not_attempted():
    assert run_check("ex06.medusa_head", stub).status == "not attempted"
    assert run_check("ex06.medusa_loss", stub).status == "not attempted"
    assert run_check("ex06.tree_attention_bias", stub).status == "not attempted"


# ----------------------------------------------------------------------------- the notebooks

# Issue 43's forged head probe: with MedusaHead left a stub, a cell replaces the kernel's
# head probe through os.sys.modules (split strings that the static scan does not read, no
# import of the grader) with one that reports a perfect head, computing the answer from the
# judge's own weights.
FORGED_PROBE = """\
import os

_where = getattr(getattr(os, "s" + "ys"), "mod" + "ules")
_probes = next(
    m for m in list(_where.values()) if isinstance(vars(m).get("PRO" + "BES"), dict)
)


def _forged(cls, w, n, h, prev, weights):
    if isinstance(weights, dict):
        blocks = [(weights[f"blocks.{i}.weight"], weights[f"blocks.{i}.bias"]) for i in range(n)]
        emb, lm = weights["embed.weight"], weights["lm_head.weight"]
    else:
        blocks, emb, lm = weights
    x = h + emb[prev]
    for bw, bb in blocks:
        x = x + F.silu(x @ bw.T + bb)
    V, C = w.shape
    params = [["embed.weight", torch.zeros(V, C)]]
    for i in range(n):
        params += [[f"blocks.{i}.weight", torch.zeros(C, C)], [f"blocks.{i}.bias", torch.zeros(C)]]
    params.append(["lm_head.weight", w.clone()])
    return {
        "module": True, "type": "MedusaHead", "layers": ("ModuleList", "Embedding", "Linear"),
        "shapes": (tuple(((C, C), True) for _ in range(n)), (V, C), ((V, C), True)),
        "distinct": True, "blocks_distinct": True, "fresh": h @ w.T, "shared": False,
        "random": x @ lm.T, "params": params, "same": [], "w_changed": False, "after": params,
    }


for _name in list(_probes.PROBES):
    if _name != "launch_race":
        _probes.PROBES[_name] = _forged
"""


@pytest.fixture(scope="module")
def graded_notebooks(tmp_path_factory):
    from pathlib import Path

    import nbformat

    from specdec_grader.judge import batch

    root = Path(__file__).resolve().parent.parent
    folder = tmp_path_factory.mktemp("ex06_submissions")
    # The solution and the untouched stub are graded in the shared class (test_grading_batch
    # asserts their full marks and "not attempted"); this batch holds the attack alone.
    forged = nbformat.read(root / "exercises" / "ex06_medusa.ipynb", as_version=4)
    at = next(i for i, c in enumerate(forged.cells) if c.source.startswith("class MedusaHead"))
    forged.cells.insert(at + 1, nbformat.v4.new_code_cell(FORGED_PROBE))
    nbformat.write(forged, folder / "ex06_forged_probe.ipynb")
    results = batch.grade(
        [folder],
        workers=2,
        cell_timeout=60,
        notebook_timeout=300,
        memory_mb=0,
        progress=False,
        seed=0,
    )
    return {Path(r.file).stem: r for r in results}


def test_a_forged_head_probe_earns_no_head_points(graded_notebooks):
    # Issue 43: the head is probed in a fresh kernel where only the notebook's class
    # MedusaHead was defined; the cell that replaced the probe never ran there.
    r = graded_notebooks["ex06_forged_probe"]
    by_id = {c.id: c for c in r.checks}
    assert by_id["ex06.medusa_head"].status == "not attempted", r
    assert r.points == 0, r


def _notebook(*cells: str) -> str:
    import json

    return json.dumps({"cells": [{"cell_type": "code", "source": c} for c in cells]})


CLASS = """\
class MedusaHead(nn.Module):
    \"\"\"doc\"\"\"

    SCALE = 1.0

    def __init__(self, w: torch.Tensor, n_layers: int = 1) -> None:
        super().__init__()

    def forward(self, h, prev):
        return h
"""


def test_the_judge_takes_the_class_alone_from_the_notebook():
    from specdec_grader.judge.class_source import class_cell

    cell = class_cell(_notebook("import os\nimport torch\n", "os.x = 1\n" + CLASS), "MedusaHead")
    assert "class MedusaHead(nn.Module)" in cell and "import torch" in cell
    assert "os" not in cell.replace("torch", "")  # the other cell's import and code stay out
    ns: dict = {}
    exec(cell, ns)
    assert ns["MedusaHead"].SCALE == 1.0


@pytest.mark.parametrize(
    "source, says",
    [
        ("import os\nclass MedusaHead(nn.Module):\n    os.sys.modules.clear()\n", "outside"),
        ("class MedusaHead(nn.Module):\n    x = __import__('os')\n", "outside"),
        ("@decorate\nclass MedusaHead(nn.Module):\n    pass\n", "decorator"),
        ("class MedusaHead(Base):\n    pass\n", "derive from nn.Module"),
        ("class MedusaHead(nn.Module, metaclass=M):\n    pass\n", "metaclass"),
        ("class MedusaHead(nn.Module):\n    def f(self, x=print(1)):\n        pass\n", "defaults"),
        ("class MedusaHead(nn.Module):\n    def f(self, x: g()):\n        pass\n", "annotate"),
        (
            "class MedusaHead(nn.Module):\n    @property\n    def f(self):\n        pass\n",
            "decorator",
        ),
        (CLASS + "MedusaHead = make()\n", "no `class MedusaHead"),
    ],
)
def test_a_class_statement_that_would_run_code_is_refused(source, says):
    from specdec_grader.judge.class_source import class_cell
    from specdec_grader.judge.kernel_source import Refused

    with pytest.raises(Refused, match=says):
        class_cell(_notebook(source), "MedusaHead")


def test_a_class_too_deep_to_unparse_is_refused_with_a_reason():
    # A red-team notebook: a 950-deep attribute chain in a method parses (the copy scan
    # accepts it) but the judge's unparse recursed out: a refusal that says why, not a crash.
    import sys

    from specdec_grader.judge.class_source import class_cell
    from specdec_grader.judge.kernel_source import Refused

    deep = "x" + ".a" * 950
    source = (
        "class MedusaHead(nn.Module):\n    def forward(self, x):\n        return " + deep + "\n"
    )
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # the default; pytest may have raised it
    try:
        with pytest.raises(Refused, match="too deep"):
            class_cell(_notebook(source), "MedusaHead")
    finally:
        sys.setrecursionlimit(old)
