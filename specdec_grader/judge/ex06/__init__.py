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

# isort: off
# Imported in this order on purpose: the checks register, and are reported and graded, in
# the order of the exercise.
from .head import ATOL, check_medusa_head
from .loss import check_medusa_loss
from .bias import TREES, check_tree_attention_bias

# isort: on

# Not in the sandbox while ex06 is graded (judge.withheld): the package's head
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

__all__ = [
    "ATOL",
    "TREES",
    "check_medusa_head",
    "check_medusa_loss",
    "check_tree_attention_bias",
]
