"""A draft for the real model that reads its features: one small step per drafted token.

EAGLE (Li et al. 2024) drafts from the target's own last hidden state instead of from a
separate small language model: the target has already computed, for the newest committed
position ``t``, a feature ``f_t`` (the input of its head) that summarises the whole context.
The draft takes ``(f_t, x_{t+1})`` (the feature and the token just committed after it) and
guesses the target's next feature ``f_{t+1}``; a head turns the guess into a distribution
for ``x_{t+2}``; the guess is fed back for the next draft. Two choices keep a drafted token
a few percent of a target call, so that c is small for the reason the field gives (it moves
few bytes):

- no attention and no cache: one fused input projection and one SwiGLU block (EAGLE uses a
  full decoder layer; ``f_t`` already carries the context, and without a cache there is
  nothing to roll back). Measured by ``tools/llm_draft_ablation.py``
  (``data/results/llm_draft_ablation.json``): one attention layer over the committed
  context, or EAGLE-3's features of three blocks beside ``f_t``, added at most 0.02 to the
  held-out acceptance at any depth, for 18-28% more bytes per drafted token;
- a reduced vocabulary (FR-Spec, EAGLE-3): the head scores only the ``R`` tokens the model
  writes most often (4,096 of 49,152 by default); ``q`` is zero elsewhere, which the
  verifier handles exactly like any other ``q``.

The draft is trained on the target's own outputs (self-distillation, as the Medusa paper
proposes where the model's training data is not at hand):
``llm.distill``. ``FeatureDraftProposer`` drives it in ``decoding.speculative_generate``
through the ``observe_target`` hook (see ``drafts.proposer``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..drafts.noise import ConfidenceStop, DraftSampler

__all__ = ["FeatureDraft", "FeatureDraftProposer"]


class FeatureDraft(nn.Module):
    """``(f_t, x_{t+1}) -> (guess of f_{t+1}, logits over the reduced vocabulary)``.

    ``embed`` is the target's token embedding (read, not trained; the draft stores no copy
    of it in its checkpoint), ``vocab_ids`` the reduced vocabulary (sorted ids)."""

    def __init__(self, embed: torch.Tensor, vocab_ids: torch.Tensor, hidden: int = 1024):
        super().__init__()
        d = embed.shape[1]
        self.register_buffer("vocab_ids", vocab_ids.clone())
        self.embed = embed  # the target's, shared: not a parameter, not in state_dict
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.norm = nn.RMSNorm(d, eps=1e-5)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)
        self.head = nn.Linear(d, len(vocab_ids), bias=False)

    def init_from_target(self) -> None:
        """Start as "the next feature is this one", read by the target's own head."""
        d = self.fc.out_features
        with torch.no_grad():
            self.head.weight.copy_(self.embed[self.vocab_ids])
            self.fc.weight.zero_()
            self.fc.weight[:, :d].copy_(torch.eye(d))
            self.down.weight.mul_(0.1)

    def forward(self, f: torch.Tensor, x: torch.Tensor):
        h = self.fc(torch.cat([f, F.embedding(x, self.embed)], -1))
        n = self.norm(h)
        h = h + self.down(F.silu(self.gate(n)) * self.up(n))
        return h, self.head(h)


class FeatureDraftProposer:
    """``FeatureDraft`` as a proposer (``drafts.proposer``'s protocol, with
    ``observe_target``): a proposal starts from the newest committed feature ``f_{n-2}`` and
    the pending token ``x_{n-1}``, and drafts ``k`` tokens, each sampled (Gumbel-max) from
    the processed logits over the reduced vocabulary; ``q`` is that distribution placed in
    the full vocabulary.

    ``stop_below``: a dynamic stop (EAGLE-2 ranks its drafts by the same product): the
    proposal ends before a draft whose chain confidence, the product of the draft's top
    probabilities so far, falls below it, so a proposal is short (or empty: a plain step)
    where the draft is unsure. The length depends on the draft's own numbers only, so the
    output's law is unchanged. None drafts ``k`` always."""

    feature_layers = 1

    def __init__(self, target, draft: FeatureDraft, *, stop_below: float | None = None):
        if stop_below is not None and not 0.0 <= stop_below < 1.0:
            raise ValueError(f"stop_below must be in [0, 1) or None; got {stop_below!r}")
        self.target, self.draft = target, draft
        self.vocab_size = target.config.vocab_size
        self.device = draft.head.weight.device
        self.stop_below = stop_below
        # The chain confidence, the unsure draft dropped (drafts.noise.ConfidenceStop).
        self.stop = None
        if stop_below is not None:
            self.stop = ConfidenceStop(stop_below, chain=True, keep=False)

    def start(self, ids, n, sampling, generator, max_new_tokens, k) -> None:
        d = self.draft.fc.out_features
        cap = n + max_new_tokens + k + 1
        self.feats = torch.zeros(cap, d, dtype=self.draft.head.weight.dtype, device=self.device)
        R = len(self.draft.vocab_ids)
        # Draws over the reduced vocabulary, in float32 (drafts.noise.DraftSampler).
        self.sampler = DraftSampler(
            sampling, generator, max_new_tokens, k, R, dtype=torch.float32, device=self.device
        )
        self.r = torch.empty(max(k, 1), dtype=torch.long, device=self.device)
        self.q = torch.zeros(max(k, 1), self.vocab_size, dtype=torch.float32, device=self.device)

    def observe_target(self, hidden: torch.Tensor, start: int) -> None:
        self.feats[start : start + hidden.shape[0]] = hidden

    @torch.inference_mode()
    def propose(self, ids, n, k, out):
        if n < 2:
            return 0, None  # no committed feature yet: let the target emit a token
        f, x = self.feats[n - 2 : n - 1], ids[n - 1 : n]
        vocab, smp, stop = self.draft.vocab_ids, self.sampler, self.stop
        smp.begin(k)
        if stop is not None:
            stop.start()
        for j in range(k):
            f, logits = self.draft(f, x)
            if stop is not None:
                cut = stop.cut(j, float(torch.softmax(logits.float(), -1).max()))
                if cut is not None:
                    return cut, self._q(cut)
            smp.row(j).copy_(logits)
            smp.draw(j, self.r[j : j + 1])
            x = vocab[self.r[j : j + 1]]
            out[j] = x[0]
        return k, self._q(k)

    def _q(self, k: int):
        # The draws' q over the reduced vocabulary, placed in the full one (zero elsewhere).
        q = self.sampler.q(k)
        if q is None:
            return None
        full = self.q[:k]
        full.zero_()
        full[:, self.draft.vocab_ids] = q
        return full

    def commit(self, ids, n) -> None:
        pass  # the features of committed positions stay; later ones are overwritten


CHECKPOINT = "smollm2_draft.pt"


def save_draft(path, draft: FeatureDraft, record: dict) -> None:
    """The draft's weights in bfloat16 (half the bytes; it computes in float32 after loading)
    with its record and the fingerprint of the target it was trained on (the GGUF's sha256)."""
    from .gguf_load import GGUF_SHA256

    state = {
        k: (v.to(torch.bfloat16) if v.is_floating_point() else v)
        for k, v in draft.state_dict().items()
    }
    torch.save(
        {
            "state_dict": state,
            "hidden": draft.gate.out_features,
            "record": record,
            "target_sha256": GGUF_SHA256,
        },
        path,
    )


def load_draft(target, path=None) -> FeatureDraft:
    """The shipped draft (``data/checkpoints/smollm2_draft.pt``) for ``target`` (the model of
    ``llm.load``), float32, in eval mode. Loads with ``weights_only=True``; refuses a
    checkpoint trained on another target."""
    from ..paths import checkpoints_dir
    from .gguf_load import GGUF_SHA256

    path = checkpoints_dir() / CHECKPOINT if path is None else path
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} is missing: restore it with git checkout, or retrain it with "
            "python tools/llm_distill.py (about two hours on 2 cores)"
        ) from None
    if ck.get("target_sha256") != GGUF_SHA256:
        raise ValueError(f"{path} was trained for another target (its fingerprint differs)")
    sd = ck["state_dict"]
    embed = target.tok_embeddings.weight.detach().float()
    draft = FeatureDraft(embed, sd["vocab_ids"], ck["hidden"])
    draft.load_state_dict({k: (v.float() if v.is_floating_point() else v) for k, v in sd.items()})
    draft.record = ck["record"]
    return draft.eval()
