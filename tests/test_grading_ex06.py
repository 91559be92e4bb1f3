"""Exercise 06's checks: a correct solution earns every point, each typical mistake loses them."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specdec_course.grading import checks_for, run_check

# ----------------------------------------------------------------------------- a solution


class MedusaHead(nn.Module):
    def __init__(self, lm_head_weight):
        super().__init__()
        V, C = lm_head_weight.shape
        self.linear = nn.Linear(C, C)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.lm_head = nn.Linear(C, V, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(lm_head_weight)

    def forward(self, h):
        return self.lm_head(h + F.silu(self.linear(h)))


def medusa_loss(head_logits, ids):
    K, B, T, V = head_logits.shape
    total = 0.0
    for k in range(1, K + 1):
        ce = F.cross_entropy(
            head_logits[k - 1, :, : T - 1 - k].reshape(-1, V), ids[:, 1 + k :].reshape(-1)
        )
        total = total + 0.8**k * ce
    return total


def tree_attention_mask(paths):
    nodes = [()] + sorted((tuple(p) for p in paths), key=lambda p: (len(p), p))
    T = len(nodes)
    mask = torch.zeros(T, T, dtype=torch.bool)
    for i, p in enumerate(nodes):
        for j, q in enumerate(nodes):
            mask[i, j] = p[: len(q)] == q
    return mask


# ----------------------------------------------------------------------------- mistakes


class HeadBiasNotZeroed(MedusaHead):
    def __init__(self, w):
        super().__init__(w)
        nn.init.normal_(self.linear.bias)


class HeadSharedWeight(MedusaHead):
    def __init__(self, w):
        super().__init__(w)
        self.lm_head.weight = nn.Parameter(w)  # the target's own tensor


class HeadNoResidual(MedusaHead):
    def forward(self, h):
        return self.lm_head(F.silu(self.linear(h)))


class HeadResidualAfterHead(MedusaHead):
    def forward(self, h):
        return self.lm_head(h) + F.silu(self.linear(h)).sum(-1, keepdim=True)


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


def mask_no_self(paths):
    m = tree_attention_mask(paths)
    return m & ~torch.eye(len(m), dtype=torch.bool)


def mask_unsorted(paths):
    nodes = [()] + [tuple(p) for p in paths]
    T = len(nodes)
    return torch.tensor([[p[: len(q)] == q for q in nodes] for p in nodes]).view(T, T)


def mask_causal(paths):
    T = len(paths) + 1
    return torch.ones(T, T, dtype=torch.bool).tril()


def mask_transposed(paths):
    return tree_attention_mask(paths).T


def stub(*args):
    raise NotImplementedError


# ----------------------------------------------------------------------------- tests


def test_exercise_06_has_three_checks_worth_ten_points():
    specs = checks_for("ex06")
    assert [s.id for s in specs] == [
        "ex06.medusa_head",
        "ex06.medusa_loss",
        "ex06.tree_attention_mask",
    ]
    assert sum(s.points for s in specs) == 10


def test_solution_earns_every_point():
    for r in (
        run_check("ex06.medusa_head", MedusaHead),
        run_check("ex06.medusa_loss", medusa_loss),
        run_check("ex06.tree_attention_mask", tree_attention_mask),
    ):
        assert r.status == "passed", r.report()
        assert r.points == r.max_points


@pytest.mark.parametrize(
    "wrong, says",
    [
        (HeadBiasNotZeroed, "identity"),
        (HeadSharedWeight, "copy"),
        (HeadNoResidual, "residual"),
        (HeadResidualAfterHead, "residual"),
    ],
)
def test_wrong_head_fails_with_a_diagnosis(wrong, says):
    r = run_check("ex06.medusa_head", wrong)
    assert r.status == "failed" and r.points == 0, r.report()
    assert says in r.report(), r.report()


@pytest.mark.parametrize(
    "wrong, says",
    [
        (loss_unweighted, "weight 1"),
        (loss_off_by_one, "off by one"),
        (loss_weights_from_one, "power of 0.8"),
    ],
)
def test_wrong_loss_fails_with_a_diagnosis(wrong, says):
    r = run_check("ex06.medusa_loss", wrong)
    assert r.status == "failed" and r.points == 0, r.report()
    assert says in r.report(), r.report()


@pytest.mark.parametrize(
    "wrong, says",
    [
        (mask_no_self, "itself"),
        (mask_unsorted, "sort the paths"),
        (mask_causal, "siblings"),
        (mask_transposed, "transposed"),
    ],
)
def test_wrong_mask_fails_with_a_diagnosis(wrong, says):
    r = run_check("ex06.tree_attention_mask", wrong)
    assert r.status == "failed" and r.points == 0, r.report()
    assert says in r.report(), r.report()


def test_untouched_stubs_are_not_attempted():
    assert run_check("ex06.medusa_head", stub).status == "not attempted"
    assert run_check("ex06.medusa_loss", stub).status == "not attempted"
    assert run_check("ex06.tree_attention_mask", stub).status == "not attempted"
