"""The EAGLE-style draft layer and its proposer for ``speculative_generate``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

from ...fast.numpy_steps import numpy_ok
from ...model import CharGPT, KVCache, check_model
from ...model.checks import check_forward
from ...model.gpt import Block
from ...sampling import SamplingOptions
from ..noise import DraftSampler
from .eagle_numpy import HostEagle

__all__ = ["EagleDraft", "EagleProposer", "check_eagle", "target_features"]


class EagleDraft(nn.Module):
    """One transformer layer that maps (feature ``f_t``, embedding of ``x_{t+1}``) to ``f_{t+1}``.

    ``f_t`` is the target's last hidden state at position ``t`` (after its final LayerNorm,
    the input of ``lm_head``). The input is ``fc(concat(f_t, wte[x_{t+1}])) + wpe[t]``, then
    one ``Block`` of the target's width, causal over the positions; its output is the
    predicted feature ``f_{t+1}``, whose logits are ``lm_head(f_{t+1})`` (the target's
    frozen, tied ``wte``). ``wte`` is the target's tensor, shared and not trained: it is a
    non-persistent buffer, so the state dict holds only ``fc``, ``wpe`` and the block.
    Build one with :meth:`from_target`.
    """

    def __init__(self, target: CharGPT):
        super().__init__()
        check_model(target, "target")
        cfg = replace(target.config, n_layer=1, dropout=0.0)
        C = cfg.n_embd
        self.config = cfg
        self.fc = nn.Linear(2 * C, C)
        self.wpe = nn.Embedding(cfg.block_size, C)
        self.block = Block(cfg)
        with torch.no_grad():  # start from the target's positions; fc sums its two halves
            self.wpe.weight.copy_(target.transformer.wpe.weight)
            nn.init.normal_(self.fc.weight, std=0.02)
            nn.init.zeros_(self.fc.bias)
        self.register_buffer("wte", target.lm_head.weight.detach(), persistent=False)

    @classmethod
    def from_target(cls, target: CharGPT) -> EagleDraft:
        """A fresh draft for ``target`` on its device (the target itself is not changed)."""
        return cls(target).to(target.lm_head.weight.device)

    def forward(
        self, features: torch.Tensor, next_ids: torch.Tensor, start: int = 0
    ) -> torch.Tensor:
        """Predicted features ``[B, T, C]`` from ``features [B, T, C]`` (``f_s .. f_{s+T-1}``)
        and ``next_ids`` int64 ``[B, T]`` (``x_{s+1} .. x_{s+T}``), ``s = start``; row ``t``
        predicts ``f_{s+t+1}``. Raises ValueError on shapes that do not match or positions
        past ``block_size``."""
        if features.dim() != 3 or next_ids.shape != features.shape[:2]:
            raise ValueError(
                f"features must be [B, T, C] and next_ids [B, T]; got "
                f"{tuple(features.shape)} and {tuple(next_ids.shape)}"
            )
        T = next_ids.shape[1]
        if not 0 <= start <= self.config.block_size - T:
            raise ValueError(f"positions {start} .. {start + T - 1} exceed the block size")
        x = self.fc(torch.cat([features, F.embedding(next_ids, self.wte)], -1))
        return self.block(x + self.wpe.weight[start : start + T])

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """``lm_head(features)``: the target's output layer over (predicted) features."""
        return F.linear(features, self.wte)

    def new_cache(self) -> KVCache:
        """An empty one-layer, batch-1 cache for :meth:`step`."""
        w = self.fc.weight
        return KVCache(self.config, 1, dtype=w.dtype, device=w.device)

    def step(
        self,
        features: torch.Tensor,
        next_ids: torch.Tensor,
        cache: KVCache,
        params: tuple | None = None,
    ) -> torch.Tensor:
        """The cached forward, **unchecked**: ``features [1, T, C]`` and ``next_ids [1, T]``
        at positions ``cache.length ..``; returns predicted features ``[1, T, C]`` and extends
        ``cache`` by ``T``. ``params`` is :meth:`step_params`'s tuple (gathered once per
        generation: attribute look-ups cost microseconds a step). The arithmetic is
        ``forward``'s; tests pin the two equal."""
        fcw, fcb, wpe, wte, l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, f2w, f2b = (
            params or self.step_params()
        )
        B, T = next_ids.shape
        C, nh = self.config.n_embd, self.config.n_head
        start = cache.length
        end = start + T
        x = F.linear(torch.cat([features, F.embedding(next_ids, wte)], -1), fcw, fcb)
        x = x + wpe[start:end]
        qkv = F.linear(F.layer_norm(x, (C,), l1w, l1b), aw, ab)
        qkv = qkv.view(B, T, 3, nh, C // nh).permute(2, 0, 3, 1, 4)
        cache.k[0, :, :, start:end] = qkv[1]
        cache.v[0, :, :, start:end] = qkv[2]
        # One new position attends to all cached ones: no mask; several: causal, offset.
        mask = None if T == 1 else torch.ones(T, end, dtype=torch.bool, device=x.device).tril(start)
        y = F.scaled_dot_product_attention(
            qkv[0], cache.k[0, :, :, :end], cache.v[0, :, :, :end], attn_mask=mask
        )
        x = x + F.linear(y.transpose(1, 2).reshape(B, T, C), pw, pb)
        x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (C,), l2w, l2b), fw, fb)), f2w, f2b)
        cache.length = end
        return x

    def step_params(self) -> tuple:
        """The tensors :meth:`step` reads, as one tuple."""
        return (self.fc.weight, self.fc.bias, self.wpe.weight, self.wte, *self.block.step_params())


def check_eagle(draft, target: CharGPT) -> EagleDraft:
    """``draft`` if it is an ``EagleDraft`` built for ``target``'s shape; else ValueError."""
    if not isinstance(draft, EagleDraft):
        raise ValueError(
            f"draft must be an EagleDraft (eagle.load_eagle(target=...)); got "
            f"{type(draft).__name__}"
        )
    check_model(target, "target")
    if replace(target.config, n_layer=1, dropout=0.0) != draft.config:
        raise ValueError(f"the draft was built for {draft.config}, not for {target.config}")
    if draft.wte.data_ptr() != target.lm_head.weight.data_ptr() and not torch.equal(
        draft.wte, target.lm_head.weight
    ):
        raise ValueError("the draft reads another target's embedding; build it from this one")
    return draft


def target_features(target: CharGPT, idx: torch.Tensor, layers: int = 1) -> torch.Tensor:
    """The target's features of ``idx [B, T]`` (one uncached forward): ``[B, T, layers *
    n_embd]``. ``layers = 1``: the last hidden state (``target.hidden_states``, the input of
    ``lm_head``). ``layers = m``: the outputs of the ``m - 1`` blocks before the last, each
    LayerNorm-ed without weights, then the last hidden state, so the last ``n_embd``
    columns are always ``lm_head``'s input (EAGLE-3 drafts from several layers; the decoding
    loop's lean step returns the same layout, ``LeanStep.hidden(..., layers=m)``)."""
    check_model(target, "target")
    L, C = target.config.n_layer, target.config.n_embd
    if not isinstance(layers, int) or not 1 <= layers <= L:
        raise ValueError(f"layers must be an int in [1, {L}] (the target's blocks); got {layers!r}")
    if layers == 1:
        return target.hidden_states(idx)
    check_forward(target, idx)
    tr = target.transformer
    x = tr.drop(
        tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1], device=idx.device))
    )  # as hidden_states
    wide = []
    for i, block in enumerate(tr.h):
        if i > L - layers:
            wide.append(F.layer_norm(x, (C,)))
        x = block(x)
    return torch.cat([*wide, tr.ln_f(x)], -1)


class _TargetFeatures:
    """The target's features as a feature-reading proposer holds them (``self.target``).

    The loop passes them through :meth:`observe_target` after its prefill and each target
    call, ``feature_layers`` wide (``target_features``; 1 unless the proposer says more);
    a proposer run alone, which nothing observed, computes the prompt's with one full
    target forward at its first proposal (:meth:`_prompt_features`)."""

    feature_layers = 1

    def _start_features(self, n: int) -> None:
        cfg, w = self.target.config, self.target.lm_head.weight
        width = cfg.n_embd * self.feature_layers
        self.feats = torch.empty(cfg.block_size, width, dtype=w.dtype, device=w.device)
        self._unseen = n > 1  # the prompt's features: the loop's prefill passes them

    def observe_target(self, hidden: torch.Tensor, start: int) -> None:
        """The target's features ``hidden [T, C]`` for positions ``start .. start + T - 1``.

        Those below ``n - 1`` at the next ``commit(ids, n)`` belong to committed text and are
        the only ones a later proposal reads; the rest scored drafts and are overwritten."""
        self.feats[start : start + hidden.shape[0]] = hidden
        if start == 0:
            self._unseen = False

    def _sampler(self, sampling, generator, max_new_tokens: int, k: int, w, host: bool):
        # The proposal's draws and q (sampler.DraftSampler): logits rows in w's dtype.
        V = self.vocab_size
        self.sampler = DraftSampler(sampling, generator, max_new_tokens, k, V, like=w, host=host)
        self.logits = self.sampler.logits

    def _prompt_features(self, ids: torch.Tensor, n: int) -> None:
        if self._unseen:  # run alone: no prefill passed the prompt's features
            with torch.no_grad():  # also when called outside the loop's inference mode
                f = target_features(self.target, ids[None, : n - 1], self.feature_layers)
                self.feats[: n - 1] = f[0]
            self._unseen = False


class EagleProposer(_TargetFeatures):
    """An ``EagleDraft`` as a proposer: drafts in feature space, fed the target's features.

    The draft's cache holds pairs ``(f_t, x_{t+1})`` for ``t < m`` with ``m <= n - 1``, all
    with the target's own features ``f_t``. A proposal feeds the missing pairs up to ``t =
    n - 2`` (the catch-up, one call); its output predicts ``f_{n-1}``, whose ``lm_head``
    logits give the first draft. Each further draft feeds the predicted feature back with
    the drafted token's embedding. The pairs built on predicted features are then dropped
    (the cache is cropped to ``n - 1``): the next proposal rebuilds them from the target's
    features, which the loop passes through :meth:`observe_target` after each target call.

    The prompt's features come from the loop's prefill (``observe_target`` with ``start``
    0). A proposer run alone (e.g. under ``audit_proposer``), which nothing observed,
    computes them at its first proposal with one full target forward of its own. With
    fewer than two committed tokens there is no feature yet and a proposal drafts
    nothing.

    Each token and its ``q`` come from ``drafts.noise.DraftSampler``: Gumbel-max over the
    processed logits (the ``SamplingOptions`` the loop passes), noise drawn from the
    proposer's generator, ``q`` the softmax of the same processed logits, so the loop stays
    exact. ``device`` is the
    target's; CUDA graphs are not used. On a CPU (float32 / float64) the steps, the draw
    and ``q`` run in NumPy on the same memory (``eagle_numpy.HostEagle``), as the draft
    model's do (``drafts.ModelProposer``); the tokens are those of the tensor steps up to
    float32 rounding of the logits.
    """

    def __init__(self, draft: EagleDraft, target: CharGPT):
        self.draft = check_eagle(draft, target)
        self.target = target
        self.vocab_size = target.config.vocab_size
        self.device = target.lm_head.weight.device
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
        d, w = self.draft, self.draft.wte
        self.params = d.step_params()
        self.cache = d.new_cache()
        self._start_features(n)
        self.w_t = w.t()
        # The NumPy steps (eagle_numpy) on a CPU: weights folded once per generation.
        self.host = HostEagle(d) if numpy_ok(w) else None
        self._sampler(sampling, generator, max_new_tokens, k, w, self.host is not None)
        if self.host is not None:
            self._np = (self.feats.numpy(), self.w_t.contiguous().numpy())
        self._arrays_of = (None, None)
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
            return self._propose_host(ids, n, k, out)
        d, cache, p, w_t = self.draft, self.cache, self.params, self.w_t
        m = cache.length
        h = d.step(self.feats[None, m : n - 1], ids[None, m + 1 : n], cache, p)[0, -1:]
        for j in range(k):
            torch.mm(h, w_t, out=smp.row(j))
            smp.draw(j, out[j : j + 1])
            if j + 1 < k:
                h = d.step(h[None], out[None, j : j + 1], cache, p)[0]
        cache.crop(n - 1)  # pairs past n - 2 were built on predicted features
        return k, smp.q(k)

    def _propose_host(self, ids, n: int, k: int, out):
        # propose() in NumPy: the same steps, draw and q, on views of the same memory.
        host, cache, smp = self.host, self.cache, self.sampler
        feats, w_t = self._np
        lg = smp.logits_np
        if self._arrays_of != (ids, out):  # the loop passes the same buffers every time
            self._arrays = (ids.numpy(), out.numpy())
            self._arrays_of = (ids, out)
        ids_np, out_np = self._arrays
        m = cache.length
        h = host.catch_up(feats[m : n - 1], ids_np[m + 1 : n], cache)
        for j in range(k):
            np.dot(h, w_t, out=lg[j])
            tok = out_np[j] = smp.draw_host(j)
            if j + 1 < k:
                h = host.step(h, tok, cache)
        cache.crop(n - 1)  # pairs past n - 2 were built on predicted features
        return k, smp.q_host(k)

    def commit(self, ids: torch.Tensor, n: int) -> None:
        # propose() already cropped to its n - 1, below any later n - 1: nothing to forget.
        pass
