"""The recurrent EAGLE-style draft: EAGLE's feature-level drafting with a cell instead of a layer.

On a CPU at batch 1 a drafted token costs what its operations cost to dispatch, and the
one-layer draft model's step is already about as cheap as a transformer layer gets there
(its attention over the context is a third of it). EAGLE's draft is such a layer, so it
can only win by accepting more; lesson 09b measures how little more the target's feature
buys on the course's character target (a few hundredths on the first drafts).
This draft wins the other way: it keeps EAGLE's idea, drafting from the target's newest
feature, and drops what costs, the attention over the context. Everything it knows about
the context is in that feature.

At a proposal the committed text is ``x_0 .. x_{n-1}`` and the newest feature the target
has computed is ``f_{n-2}`` (its input at ``lm_head``, for the token ``x_{n-1}`` it just
sampled). Once per proposal the feature sets the cell's state and a context term:

    s_0 = P f + m_s,   c = G f + m_c,   (m_s, m_c) = M2(relu(M1 f))

and each draft is one step of the cell, fed the token drafted before it (``y_0 = x_{n-1}``):

    s_j = s_{j-1} + B relu(A s_{j-1} + E[y_{j-1}] + c),   logits_j = out(s_j)

With ``feature_layers = m > 1`` the feature ``f`` is wider: the outputs of the ``m - 1``
target blocks before the last, each LayerNorm-ed without weights, then the last hidden
state (``target_features``; the loop's lean step returns it at no extra target call). The
last layer's feature is shaped for the *next* token; the earlier blocks still hold what
the later drafts need (EAGLE-3, Li et al. 2025, fuses low, middle and high layers for the
same reason). Only ``P``, ``G`` and ``M1``, once per proposal, read it; a drafted token
costs the same.

Three small products a token, no cache, nothing to catch up (``bench eagle`` measures its
cost in the loop: below the draft model's step over long proposals, above it at k = 1,
where the products over the feature are not shared out). The design is
ReDrafter's (Cheng et al. 2024, arXiv:2403.09919: a recurrent draft head conditioned on
the target's last hidden state) in EAGLE's terms: the state starts from the target's
feature, and the token input resolves which token was drawn.

``RecurrentDraft`` (the module), ``RecurrentProposer`` (drafts for
``speculative_generate``, fed the target's features through the loop's ``observe_target``
hook, as ``EagleProposer``). ``recurrent_training`` trains it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

from ..._validate import check_int
from ...fast.numpy_steps import numpy_ok
from ...model import CharGPT, check_model
from ...sampling import SamplingOptions
from .eagle_draft import _TargetFeatures

__all__ = ["RecurrentDraft", "RecurrentProposer", "check_recurrent"]


class RecurrentDraft(nn.Module):
    """The recurrent draft (module docstring) for a target of width ``target_width`` over
    ``vocab_size`` tokens: a state of ``state`` numbers, a cell of ``hidden`` units, a
    per-proposal MLP of ``init_hidden`` units over the feature. ``M2`` starts at zero, so a
    fresh draft's state and context are linear in the feature."""

    def __init__(
        self,
        target_width: int,
        vocab_size: int,
        state: int = 128,
        hidden: int = 512,
        init_hidden: int = 256,
        feature_layers: int = 1,
    ):
        super().__init__()
        for name, v in (
            ("target_width", target_width),
            ("vocab_size", vocab_size),
            ("state", state),
            ("hidden", hidden),
            ("init_hidden", init_hidden),
            ("feature_layers", feature_layers),
        ):
            check_int(v, name)
        self.sizes = dict(
            target_width=target_width,
            vocab_size=vocab_size,
            state=state,
            hidden=hidden,
            init_hidden=init_hidden,
            feature_layers=feature_layers,
        )
        C, V, S, H, I = target_width * feature_layers, vocab_size, state, hidden, init_hidden
        self.P = nn.Linear(C, S)
        self.G = nn.Linear(C, H, bias=False)
        self.M1 = nn.Linear(C, I)
        self.M2 = nn.Linear(I, S + H)
        self.A = nn.Linear(S, H)
        self.E = nn.Embedding(V, H)
        self.B = nn.Linear(H, S)
        self.out = nn.Linear(S, V)
        with torch.no_grad():
            nn.init.zeros_(self.M2.weight)
            nn.init.zeros_(self.M2.bias)
            self.B.weight.mul_(0.1)  # small steps at first: the state starts as the feature's

    @classmethod
    def for_target(cls, target: CharGPT, **kw) -> RecurrentDraft:
        """A fresh draft for ``target``, on its device."""
        check_model(target, "target")
        d = cls(target.config.n_embd, target.config.vocab_size, **kw)
        return d.to(target.lm_head.weight.device)

    @property
    def feature_layers(self) -> int:
        """How many of the target's blocks the feature reads (``eagle.target_features``)."""
        return self.sizes["feature_layers"]

    def begin(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(s_0 [..., state], c [..., hidden])`` from features ``f [..., feature_layers *
        target_width]``."""
        S = self.sizes["state"]
        m = self.M2(F.relu(self.M1(f)))
        return self.P(f) + m[..., :S], self.G(f) + m[..., S:]

    def step(self, s: torch.Tensor, c: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """The next state from state ``s [..., state]``, context ``c [..., hidden]`` and the
        int64 tokens ``tok [...]`` drafted before it."""
        return s + self.B(F.relu(self.A(s) + self.E(tok) + c))

    def logits(self, s: torch.Tensor) -> torch.Tensor:
        """The draft's logits ``[..., vocab_size]`` at states ``s``."""
        return self.out(s)

    def unroll(self, f: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., d, vocab_size]`` of ``d`` drafts from features ``f [...,
        feature_layers * target_width]`` fed the tokens ``tokens [..., d]`` (the first is the
        committed token the feature's position sampled, then the drafted ones)."""
        s, c = self.begin(f)
        out = []
        for j in range(tokens.shape[-1]):
            s = self.step(s, c, tokens[..., j])
            out.append(self.logits(s))
        return torch.stack(out, -2)


def check_recurrent(draft, target: CharGPT) -> RecurrentDraft:
    """``draft`` if it is a ``RecurrentDraft`` sized for ``target``; else ValueError."""
    if not isinstance(draft, RecurrentDraft):
        raise ValueError(
            f"draft must be a RecurrentDraft (eagle.load_recurrent(target=...)); got "
            f"{type(draft).__name__}"
        )
    check_model(target, "target")
    s = draft.sizes
    if (s["target_width"], s["vocab_size"]) != (target.config.n_embd, target.config.vocab_size):
        raise ValueError(f"the draft was built for another target ({s}); build it for this one")
    if s["feature_layers"] > target.config.n_layer:
        raise ValueError(
            f"the draft reads {s['feature_layers']} of the target's blocks; this target has "
            f"{target.config.n_layer}"
        )
    return draft


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().t().contiguous().numpy()


class _HostCell:
    """The draft's steps in NumPy (CPU, float32 / float64): weights transposed once per
    generation. The three products that read the feature (``P``, ``G``, ``M1``) are one
    product with the weights side by side, and ``A``'s bias is folded into the context
    term's, so a proposal's start costs two products and a drafted token three."""

    def __init__(self, d: RecurrentDraft):
        with torch.no_grad():
            self.S, self.H = d.sizes["state"], d.sizes["hidden"]
            self.F = np.concatenate([_np(d.P.weight), _np(d.G.weight), _np(d.M1.weight)], 1)
            self.bF = np.concatenate([d.P.bias.numpy(), d.A.bias.numpy(), d.M1.bias.numpy()])
            self.M2, self.bM2 = _np(d.M2.weight), d.M2.bias.numpy()
            self.A = _np(d.A.weight)
            self.E = d.E.weight.detach().numpy()
            self.B, self.bB = _np(d.B.weight), d.B.bias.numpy()
            self.W, self.bW = _np(d.out.weight), d.out.bias.numpy()

    def begin(self, f):
        z = np.dot(f, self.F)
        z += self.bF
        SH = self.S + self.H
        m = np.maximum(z[SH:], 0.0)
        m = np.dot(m, self.M2)
        m += self.bM2
        z[:SH] += m
        return z[: self.S], z[self.S : SH]

    def step(self, s, c, tok: int, out):
        """The next state; its logits go to ``out [V]``."""
        u = np.dot(s, self.A)
        u += self.E[tok]
        u += c
        np.maximum(u, 0.0, out=u)
        s = s + np.dot(u, self.B)
        s += self.bB
        np.dot(s, self.W, out=out)
        out += self.bW
        return s


class RecurrentProposer(_TargetFeatures):
    """A ``RecurrentDraft`` as a proposer for ``speculative_generate``.

    The loop passes the target's features through :meth:`observe_target` after its prefill
    and each call; a proposal reads the newest committed one, ``f_{n-2}``, and drafts ``k``
    tokens, one cell step each. The draft keeps no cache: nothing to catch up or roll back.
    Run alone (nothing observed, e.g. under ``audit_proposer``), its first proposal computes
    the prompt's features with one target forward of its own. With fewer than two committed
    tokens there is no feature yet and a proposal drafts nothing.

    Each token and its ``q`` come from ``drafts.noise.DraftSampler`` (Gumbel-max over the
    processed logits, ``q`` the softmax of the same logits), so the loop stays exact. On a
    CPU (float32 / float64) the steps run in NumPy (``_HostCell``); elsewhere as tensor ops
    (tests pin the two together).
    """

    def __init__(self, draft: RecurrentDraft, target: CharGPT):
        self.draft = check_recurrent(draft, target)
        self.target = target
        self.vocab_size = target.config.vocab_size
        self.device = draft.out.weight.device  # the loop refuses one apart from the target

    @property
    def feature_layers(self) -> int:
        """How wide the features the loop passes are: the draft's (``target_features``)."""
        return self.draft.feature_layers

    def start(
        self,
        ids: torch.Tensor,
        n: int,
        sampling: SamplingOptions,
        generator: torch.Generator | None,
        max_new_tokens: int,
        k: int,
    ) -> None:
        w = self.draft.out.weight
        self._start_features(n)
        # NumPy needs one dtype for the cell's weights and the features it reads; a draft of
        # another dtype than the target takes the tensor path, which casts the feature.
        same = w.dtype == self.feats.dtype
        self.host = _HostCell(self.draft) if same and numpy_ok(w) and numpy_ok(self.feats) else None
        self._sampler(sampling, generator, max_new_tokens, k, w, self.host is not None)
        if self.host is not None:
            self._feats_np = self.feats.numpy()
        self._out_of = None
        self.calls = 0

    def propose(
        self, ids: torch.Tensor, n: int, k: int, out: torch.Tensor
    ) -> tuple[int, torch.Tensor | None]:
        if n < 2:
            return 0, None
        self._prompt_features(ids, n)
        smp = self.sampler
        smp.begin(k)
        self.calls += 1
        if self.host is not None:
            return self._propose_host(int(ids[n - 1]), n, k, out)
        d = self.draft
        with torch.no_grad():
            s, c = d.begin(self.feats[n - 2 : n - 1].to(d.out.weight.dtype))
            tok = ids[n - 1 : n]
            for j in range(k):
                s = d.step(s, c, tok)
                smp.row(j).copy_(d.logits(s))
                smp.draw(j, out[j : j + 1])
                tok = out[j : j + 1]
        return k, smp.q(k)

    def _propose_host(self, tok: int, n: int, k: int, out):
        if self._out_of is not out:  # the loop passes the same buffer every time
            self._out_np, self._out_of = out.numpy(), out
        cell, smp, out_np = self.host, self.sampler, self._out_np
        lg = smp.logits_np
        s, c = cell.begin(self._feats_np[n - 2])
        for j in range(k):
            s = cell.step(s, c, tok, lg[j])
            tok = out_np[j] = smp.draw_host(j)
        return k, smp.q_host(k)

    def commit(self, ids: torch.Tensor, n: int) -> None:
        # The draft keeps no state between proposals: nothing to forget.
        pass
