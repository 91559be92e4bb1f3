"""Tiny Medusa: extra decoding heads on the frozen target, and tree verification.

Medusa (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads", arXiv:2401.10774) drops the draft model. Head ``k`` (``k = 1 .. K``) reads the
target's last hidden state ``h_t`` (after the final LayerNorm, the input of ``lm_head``) and
predicts the token at ``t + 1 + k``; the target's own ``lm_head`` predicts ``t + 1``. Each head
is a residual block ``x + SiLU(W x + b)`` followed by its own linear layer to the vocabulary,
initialised from the target's ``lm_head`` with ``W`` and ``b`` zero, so that a fresh head is a
copy of the base head. Medusa-1 trains the heads with the target frozen; the loss is
``sum_k 0.8^k * CE_k`` (the paper's ``lambda_k = 0.8^k``).

Candidates form a tree, given as a list of paths like the reference code's ``medusa_choices``:
the path ``(r1, r2)`` is the node whose depth-1 token is head 1's rank-``r1`` guess and whose
depth-2 token is head 2's rank-``r2`` guess. A head's guesses do not depend on the path
above them, so siblings of different parents share token sets. One target forward pass scores
the whole tree: the root (the pending token, sampled from the target at the previous step)
and every node sit after the cached prefix; node ``i`` attends to the prefix and to its own
ancestors only (the tree attention mask), at position ``prefix + depth(i)``. The logits at a
node are then exactly those of a plain forward pass along its root-to-node path.

Acceptance walks the tree from the root. At temperature 0 it follows the child that equals
the target's argmax, so the output is the target's greedy output. When sampling, the
candidates are deterministic, so each child is a one-hot draft: child ``c`` is accepted with
probability ``p(c)`` under the current (renormalised) target distribution; after a
rejection ``p(c)`` is zeroed and the rest renormalised before the next sibling is tried
(SpecInfer, Miao et al. 2024, with one-hot drafts). If no child is accepted, the token is
sampled from what is left; at a leaf, from the leaf's distribution. Over the siblings the
accepted child is ``c`` with probability exactly ``p(c)`` and the fallback sample covers the
rest, so every emitted token is distributed exactly as the target's.

The cache after an iteration holds the committed prefix; the newest token is *pending* (not
yet fed). The tree's keys and values are written at slots ``L .. L + T - 1`` (``L`` the
cache length, root at ``L``); ``compact_cache`` copies the accepted nodes' slots to
``L + 1, L + 2, ...`` and sets the length, so the cache equals a fresh run on the prefix.

``specdec-course train --preset medusa`` writes ``data/checkpoints/medusa.pt``;
``load_heads()`` reads it.

Hydra heads (``hydra``; Ankner et al. 2024) also read the tokens on the path before them,
the pending root first, and are trained by self-distillation on the target's own
distributions; with them a chain's tokens may be *sampled* from the heads and verified by
the speculative sampling rule (``draft="sample"``), which accepts far more than ranked
guesses when sampling. The shipped file holds both kinds (``load_heads(kind="hydra")``).

The package, one concept a module: ``heads`` (the heads and their loss), ``hydra`` (the
sequentially dependent heads and their training), ``tree`` (trees, their buffers, the
verification pass and ``compact_cache``), ``candidates`` (filling a tree from the heads,
the sampled chain's walk), ``medusa_generate`` (the loop) and ``head_training`` (accuracy,
training, checkpoints). The trees the benchmark runs are ``bench.bench_trees``.
Every public name is re-exported here: ``from specdec_course import medusa; medusa.X``.
"""

from __future__ import annotations

from .candidates import DRAFTS, sampled_chain_walk
from .head_training import (
    HYDRA_STEPS,
    REBUILD_COMMAND,
    HeadsTrainResult,
    collect_hidden,
    head_accuracy,
    load_heads,
    save_heads,
    train_heads,
    train_shipped_heads,
    train_shipped_hydra,
)
from .heads import (
    DEFAULT_HEADS,
    LOSS_DECAY,
    MedusaHead,
    MedusaHeads,
    ResBlock,
    head_targets,
    loss_weights,
    medusa_loss,
)
from .hydra import DEFAULT_HIDDEN, HydraHeads, hydra_acceptance, hydra_loss, train_hydra
from .medusa_generate import MedusaStats, medusa_generate, node_law
from .tree import (
    CHAIN,
    TREE_LARGE,
    TREE_SMALL,
    TREES,
    TreeBuffers,
    build_tree,
    compact_cache,
    greedy_tree,
    tree_attention_mask,
    tree_forward,
)

__all__ = [
    "DEFAULT_HEADS",
    "LOSS_DECAY",
    "CHAIN",
    "TREE_SMALL",
    "TREE_LARGE",
    "TREES",
    "ResBlock",
    "MedusaHead",
    "MedusaHeads",
    "loss_weights",
    "medusa_loss",
    "head_targets",
    "TreeBuffers",
    "build_tree",
    "tree_attention_mask",
    "greedy_tree",
    "tree_forward",
    "compact_cache",
    "MedusaStats",
    "medusa_generate",
    "head_accuracy",
    "collect_hidden",
    "train_heads",
    "HeadsTrainResult",
    "save_heads",
    "load_heads",
    "REBUILD_COMMAND",
    "train_shipped_heads",
    "HydraHeads",
    "DEFAULT_HIDDEN",
    "hydra_loss",
    "train_hydra",
    "hydra_acceptance",
    "train_shipped_hydra",
    "HYDRA_STEPS",
    "DRAFTS",
    "sampled_chain_walk",
    "node_law",
]
