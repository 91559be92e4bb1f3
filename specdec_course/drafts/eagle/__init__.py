"""An EAGLE-style draft: one transformer layer over the target's features.

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", arXiv:2401.15077) drafts in feature space. The draft reads the target's last
hidden state ``f_t`` (the input of ``lm_head``) together with the embedding of the token
``x_{t+1}`` that was sampled from it, and predicts the next feature ``f_{t+1}``; the
target's own frozen ``lm_head`` turns a predicted feature into the draft's distribution.
Features carry what the target has already computed about the context, so one layer can
follow the target far more closely than a small model that starts from the characters.
The token input resolves the uncertainty of sampling: ``f_{t+1}`` depends on which token
was drawn. EAGLE-1 trains with ``SmoothL1(f_hat, f) + 0.1 * CE(lm_head(f_hat), x)``.

``draft`` (``EagleDraft``, ``EagleProposer``: drafts for ``speculative_generate``, fed the
target's features through the loop's ``observe_target`` hook) and ``training`` (the loss,
``train_eagle``, the checkpoint); ``fused`` (the draft model corrected by a head that reads
the target's feature) and ``recurrent`` (EAGLE's drafting from the feature with a cheap
recurrent cell in place of the layer, the one that beats the draft model on a CPU), each
with its ``*_training`` module. ``specdec-course train --preset eagle`` writes
``data/checkpoints/eagle.pt``; ``load_eagle(target=...)`` reads it.
"""

from .eagle_draft import EagleDraft, EagleProposer, check_eagle, target_features
from .eagle_training import (
    REBUILD_COMMAND,
    SHIPPED,
    collect_features,
    eagle_alpha,
    eagle_alpha_by_depth,
    eagle_loss,
    load_eagle,
    save_eagle,
    train_eagle,
    train_shipped_eagle,
    unrolled_features,
    unrolled_loss,
)
from .fused import HEAD_DEPTHS, FusedHead, FusedProposer, check_fused
from .fused_training import (
    FUSED_COMMAND,
    FUSED_SHIPPED,
    fused_alpha_by_depth,
    fused_data,
    load_fused,
    save_fused,
    train_fused,
    train_shipped_fused,
)
from .recurrent import RecurrentDraft, RecurrentProposer, check_recurrent
from .recurrent_training import (
    RECURRENT_COMMAND,
    RECURRENT_SHIPPED,
    draft_model_alpha_by_depth,
    load_recurrent,
    recurrent_alpha_by_depth,
    save_recurrent,
    train_recurrent,
    train_shipped_recurrent,
)

__all__ = [
    "EagleDraft",
    "EagleProposer",
    "check_eagle",
    "target_features",
    "HEAD_DEPTHS",
    "FusedHead",
    "FusedProposer",
    "check_fused",
    "FUSED_COMMAND",
    "FUSED_SHIPPED",
    "fused_alpha_by_depth",
    "fused_data",
    "load_fused",
    "save_fused",
    "train_fused",
    "train_shipped_fused",
    "RecurrentDraft",
    "RecurrentProposer",
    "check_recurrent",
    "RECURRENT_COMMAND",
    "RECURRENT_SHIPPED",
    "draft_model_alpha_by_depth",
    "load_recurrent",
    "recurrent_alpha_by_depth",
    "save_recurrent",
    "train_recurrent",
    "train_shipped_recurrent",
    "REBUILD_COMMAND",
    "SHIPPED",
    "collect_features",
    "eagle_alpha",
    "eagle_alpha_by_depth",
    "eagle_loss",
    "load_eagle",
    "save_eagle",
    "train_eagle",
    "train_shipped_eagle",
    "unrolled_features",
    "unrolled_loss",
]
