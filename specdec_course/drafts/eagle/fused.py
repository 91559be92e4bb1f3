"""The fused EAGLE-style draft: the draft model's chain, corrected by the target's feature.

EAGLE's claim is that the target's last hidden state carries what the target has computed
about the context, and that a draft which reads it follows the target more closely than a
draft that starts from the characters. The feature-level draft (``EagleDraft``) takes that
literally: one layer predicts the next feature from features. On the course's 4-layer
character target it only ties the 1-layer draft model (lesson 09b measures why: one layer
recomputes from the characters nearly everything the features hold, and each drafted token
costs more). This design keeps the draft model, which already follows the target well and
drafts cheaply, and adds what it cannot compute: a small head that reads the target's
feature and corrects the draft model's logits.

At a proposal the committed text is ``x_0 .. x_{n-1}`` and the newest feature the target
has computed is ``f_{n-2}`` (its input at ``lm_head`` for the token ``x_{n-1}`` it just
sampled). The ``j``-th draft (``j = 1 .. k``) is the draft model's step at position ``n - 2
+ j``, with its hidden state ``h`` (after its final LayerNorm), and the logits

    draft.lm_head(h) + b_j + out(h_in(h) * s_j)
    (b_j, s_j - 1) = g_j * m + e_j,   m = f_out(gelu(f_in(LN(f_{n-2}))))

The terms ``b_j`` (a logit bias) and ``s_j`` (a gain on each of the ``rank`` directions
``h_in`` reads from the draft's state) depend only on the feature and the depth ``j``: one
MLP reads the feature once per proposal, and each depth scales and shifts its output by
learnt vectors ``g_j``, ``e_j`` (``depths`` of them; deeper drafts reuse the last). What a
drafted token adds to the draft model's step is two small products: ``rank`` columns more
in the product that gives the draft's logits, and ``out``. The draft model is frozen: its
``FoldedStep`` tables and its catch-up (two row copies a committed token) are the draft
model's own; only the head trains (``fused_training``). ``f_out`` and ``out`` start at
zero, so an untrained head drafts exactly as the draft model does.
The design is close to ReDrafter (Cheng et al. 2024,
arXiv:2403.09919: a small recurrent draft conditioned on the target's last hidden state)
and to Hydra's heads (Ankner et al. 2024), with the draft model as the recurrence.

``FusedHead`` (the head), ``FusedProposer`` (drafts for ``speculative_generate``, fed the
target's features through the loop's ``observe_target`` hook, as ``EagleProposer``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from scipy.special import erf
from torch.nn import functional as F

from ..._validate import check_int
from ...fast import draft_step
from ...fast.numpy_steps import Norm, fold_norm, numpy_ok
from ...model import CharGPT, check_model
from ...sampling import SamplingOptions
from .eagle_draft import _TargetFeatures

__all__ = ["HEAD_DEPTHS", "FusedHead", "FusedProposer", "check_fused"]

# The drafts the head corrects. On validation text the shipped head raises the acceptance of
# the 1st .. 4th draft by about 0.025, 0.017, 0.011, 0.006 (its record): in Theorem 3.8's
# expected tokens per call at k = 7 the 4th draft's gain is worth about 0.2%, less than a
# corrected step's cost (about 3 us on a call of about 800 us); the first three are worth
# 4% together.
HEAD_DEPTHS = 3
_R = 0.5**0.5  # GELU's 1 / sqrt 2, folded into the NumPy terms' weights


class FusedHead(nn.Module):
    """The head of the fused draft (module docstring), for a draft model of width
    ``draft_width`` and a target of width ``target_width`` over ``vocab_size`` tokens:
    ``rank`` gains, an MLP of ``hidden`` units over the feature, ``depths`` depth vectors.
    ``terms(f)`` gives ``[..., depths, vocab_size + rank]`` (``b_j`` then ``s_j``),
    ``delta(h, t)`` the logits' correction for draft hidden states ``h [..., draft_width]``
    and terms ``t`` of one depth."""

    def __init__(
        self,
        draft_width: int,
        target_width: int,
        vocab_size: int,
        rank: int = 64,
        hidden: int = 512,
        depths: int = 8,
    ):
        super().__init__()
        self.sizes = dict(
            draft_width=draft_width,
            target_width=target_width,
            vocab_size=vocab_size,
            rank=rank,
            hidden=hidden,
            depths=depths,
        )
        self.f_norm = nn.LayerNorm(target_width)
        self.f_in = nn.Linear(target_width, hidden)
        self.f_out = nn.Linear(hidden, vocab_size + rank)
        self.gain = nn.Parameter(torch.ones(depths, vocab_size + rank))
        self.shift = nn.Parameter(torch.zeros(depths, vocab_size + rank))
        self.h_in = nn.Linear(draft_width, rank)
        self.out = nn.Linear(rank, vocab_size, bias=False)
        with torch.no_grad():  # an untrained head changes nothing
            for w in (self.f_out.weight, self.f_out.bias, self.out.weight):
                nn.init.zeros_(w)

    @classmethod
    def for_models(cls, draft: CharGPT, target: CharGPT, **kw) -> FusedHead:
        """A fresh head for this draft model and target."""
        check_model(draft, "draft")
        check_model(target, "target")
        if draft.config.n_layer != 1 or draft.config.vocab_size != target.config.vocab_size:
            raise ValueError("the fused draft needs a one-layer draft over the target's vocabulary")
        return cls(draft.config.n_embd, target.config.n_embd, target.config.vocab_size, **kw)

    def terms(self, f: torch.Tensor, depth_index: torch.Tensor | None = None) -> torch.Tensor:
        """``(b_j, s_j)`` for every depth: ``f [..., target_width]`` -> ``[..., depths, V +
        rank]``; with ``depth_index`` (int64 ``[...]``, 0-based), for that depth only:
        ``[..., V + rank]``."""
        m = self.f_out(F.gelu(self.f_in(self.f_norm(f))))
        if depth_index is None:
            t = m[..., None, :] * self.gain + self.shift
        else:
            t = m * self.gain[depth_index] + self.shift[depth_index]
        V = self.sizes["vocab_size"]
        return torch.cat([t[..., :V], 1.0 + t[..., V:]], -1)

    def delta(self, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The correction to the draft model's logits, ``[..., vocab_size]``, for terms
        ``t [..., V + rank]`` of the draft's depth."""
        V = self.sizes["vocab_size"]
        return t[..., :V] + self.out(self.h_in(h) * t[..., V:])


def check_fused(head, draft: CharGPT, target: CharGPT) -> FusedHead:
    """``head`` if it is a ``FusedHead`` sized for ``draft`` and ``target``; else ValueError."""
    if not isinstance(head, FusedHead):
        raise ValueError(
            f"head must be a FusedHead (eagle.load_fused(draft=..., target=...)); got "
            f"{type(head).__name__}"
        )
    check_model(draft, "draft")
    check_model(target, "target")
    s = head.sizes
    if (s["draft_width"], s["target_width"], s["vocab_size"]) != (
        draft.config.n_embd,
        target.config.n_embd,
        target.config.vocab_size,
    ) or draft.config.n_layer != 1:
        raise ValueError(f"the head was built for other models ({s}); build it for these")
    return head


class _HostHead:
    """The head in NumPy on the draft's ``NumpyFolded`` step: one product gives the draft's
    logits and the ``rank`` directions (both read the same normed hidden state, the final
    LayerNorm's weight and bias folded in as ``fast.numpy_steps`` folds its norms); a proposal's
    terms are one MLP pass over the feature and one scale and shift per depth."""

    def __init__(self, head: FusedHead, host):
        with torch.no_grad():
            W, c = host.head  # [C, V], [V]: the draft's ln_f folded into its lm_head
            dt = W.dtype
            hw, hb = head.h_in.weight.t().numpy().astype(dt), head.h_in.bias.numpy().astype(dt)
            Wh, ch = fold_norm(*host.lnf, hw, hb)
            self.V = W.shape[1]
            self.W, self.c = np.concatenate([W, Wh], 1), np.concatenate([c, ch])
            self.out_w = head.out.weight.t().contiguous().numpy().astype(dt)
            f_in = fold_norm(
                head.f_norm.weight.numpy(),
                head.f_norm.bias.numpy(),
                head.f_in.weight.t().numpy(),
                head.f_in.bias.numpy(),
            )
            self.f_in = tuple((a * _R).astype(dt) for a in f_in)  # GELU's 1 / sqrt 2 folded
            self.f_out = (
                (head.f_out.weight.t() * _R).contiguous().numpy().astype(dt),
                head.f_out.bias.numpy().astype(dt),
            )
            self.gain = head.gain.numpy().astype(dt)
            shift = head.shift.numpy().astype(dt)
            shift[:, self.V :] += 1.0  # s_j = 1 + its term
            self.shift = shift
        self.f_norm = Norm(head.sizes["target_width"], dt)
        self.norm, self.host = host.norm, host

    def terms(self, f, k: int):
        """``[k, V + rank]``: ``b_j`` and ``s_j`` for depths 1 .. k from the feature ``f``."""
        d, r = self.f_norm.one(f)
        W, c = self.f_in
        u = np.dot(d, W)
        u *= r
        u += c
        g = erf(u)  # the GELU, its 1 / sqrt 2 factors in f_in and f_out
        g *= u
        g += u
        m = np.dot(g, self.f_out[0])
        m += self.f_out[1]
        D = self.gain.shape[0]
        rows = slice(0, k) if k <= D else np.minimum(np.arange(k), D - 1)
        t = self.gain[rows] * m
        t += self.shift[rows]
        return t

    def logits(self, tok: int, cache, t, out) -> None:
        """One draft step for ``tok`` with one depth's terms ``t``: extends ``cache`` and
        writes the fused logits into ``out`` ``[V]``."""
        V = self.V
        d, r = self.norm.one(self.host.residual(tok, cache))
        z = np.dot(d, self.W)
        z *= r
        z += self.c
        g = z[V:]
        g *= t[V:]
        np.dot(g, self.out_w, out=out)
        out += z[:V]
        out += t[:V]


class FusedProposer(_TargetFeatures):
    """A ``FusedHead`` over its draft model as a proposer for ``speculative_generate``.

    The draft model's cache and catch-up are ``drafts.ModelProposer``'s (a committed
    token costs two row copies). The loop passes the target's features through
    :meth:`observe_target` after its prefill and each call; a proposal reads the newest
    committed one, ``f_{n-2}``, computes the head's feature terms once, and drafts ``k``
    tokens, each the draft model's step plus the head. Run alone (nothing observed, e.g.
    under ``audit_proposer``), its first proposal computes the prompt's features with one
    target forward of its own. With fewer than two committed tokens there is no feature
    yet and a proposal drafts nothing.

    The head corrects the first ``head_depths`` drafts of a proposal (``HEAD_DEPTHS``: where
    its measured gain in acceptance outweighs its cost, see the constant); later drafts are
    the draft model's own steps, and ``head_depths=0`` is the draft model itself.

    Each token and its ``q`` come from ``drafts.noise.DraftSampler`` (Gumbel-max over the
    processed fused logits, ``q`` the softmax of the same logits), so the loop stays exact.
    On a CPU (float32 / float64) the steps run in NumPy (the draft's ``NumpyFolded`` and
    ``_HostHead``); elsewhere as tensor ops through the draft model's cached forward (tests
    pin the two together).
    """

    def __init__(
        self, head: FusedHead, draft: CharGPT, target: CharGPT, *, head_depths: int = HEAD_DEPTHS
    ):
        self.head = check_fused(head, draft, target)
        self.head_depths = check_int(head_depths, "head_depths", minimum=0)
        self.draft, self.target = draft, target
        self.vocab_size = target.config.vocab_size
        self.cache = None

    def start(
        self,
        ids: torch.Tensor,
        n: int,
        sampling: SamplingOptions,
        generator: torch.Generator | None,
        max_new_tokens: int,
        k: int,
    ) -> None:
        draft, head = self.draft, self.head
        w = draft.lm_head.weight
        step = draft_step(draft)
        tw = self.target.lm_head.weight
        self.host = None
        if numpy_ok(w) and numpy_ok(tw) and step.np_step is not None:
            self.step = step
            self.host = _HostHead(head, step.np_step)
            self.cache = step.new_cache()
        else:
            self.step = None
            self.cache = draft.new_cache()
        if n > 1:  # everything but the pending last token
            if self.host is not None:
                step.feed(ids[: n - 1], self.cache)
            else:
                draft.hidden_states(ids[None, : n - 1], self.cache)
        self._start_features(n)
        self._feats_np = self.feats.numpy() if self.host is not None else None
        self._sampler(sampling, generator, max_new_tokens, k, w, self.host is not None)
        self._out_of = None
        self.calls = 0

    def _terms(self, n: int, k: int) -> torch.Tensor:
        # The head's terms for drafts 1 .. k, from f_{n-2}: [k, V + rank].
        with torch.no_grad():
            t = self.head.terms(self.feats[n - 2].to(self.head.f_in.weight.dtype))
        D = t.shape[0]
        return t[[min(j, D - 1) for j in range(k)]]

    def propose(
        self, ids: torch.Tensor, n: int, k: int, out: torch.Tensor
    ) -> tuple[int, torch.Tensor | None]:
        if n < 2:
            return 0, None
        self._prompt_features(ids, n)
        smp = self.sampler
        smp.begin(k)
        self.calls += 1
        cache = self.cache
        if self.host is not None:
            for m in range(cache.length, n - 1):  # the catch-up: row copies
                self.step.feed(ids[m : m + 1], cache)
            t = self.host.terms(self._feats_np[n - 2], min(k, self.head_depths))
            return self._propose_host(int(ids[n - 1]), k, out, t)
        t = self._terms(n, min(k, self.head_depths))
        draft, head = self.draft, self.head
        with torch.no_grad():
            h = draft.hidden_states(ids[None, cache.length : n], cache)[0, -1:]
            for j in range(k):
                lg = draft.lm_head(h)
                smp.row(j).copy_(lg + head.delta(h, t[j]) if j < len(t) else lg)
                smp.draw(j, out[j : j + 1])
                if j + 1 < k:
                    h = draft.hidden_states(out[None, j : j + 1], cache)[0]
        return k, smp.q(k)

    def _propose_host(self, tok: int, k: int, out, t):
        if self._out_of is not out:  # the loop passes the same buffer every time
            self._out_np, self._out_of = out.numpy(), out
        hh, cache, smp, out_np = self.host, self.cache, self.sampler, self._out_np
        lg = smp.logits_np
        for j in range(k):
            if j < len(t):
                hh.logits(tok, cache, t[j], lg[j])
            else:  # past the head's depths: the draft model's own step
                hh.host.step(tok, cache, lg[j])
            tok = out_np[j] = smp.draw_host(j)
        return k, smp.q_host(k)

    def commit(self, ids: torch.Tensor, n: int) -> None:
        # As ModelProposer's: the cache never holds more than the committed n - 1.
        if self.cache.length > n - 1:
            self.cache.crop(n - 1)
