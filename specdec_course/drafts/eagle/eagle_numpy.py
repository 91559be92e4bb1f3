"""``HostEagle``: the EAGLE-style draft's batch-1 steps in NumPy, on the tensors' own memory.

A drafted token costs the EAGLE-style draft one pass of its layer, as a drafted token costs
the one-layer draft model one step of its ``FoldedStep``: on a CPU at batch 1 both cost
what dispatching their operations costs (``fast.numpy_steps``'s docstring has the figures). So
the draft gets the same executor as the draft model: NumPy calls on NumPy views of its
weights and of its ``KVCache``, with the same exact folds:

- the input ``fc(concat(f, wte[x])) + wpe[t]`` is ``f @ W_f + E[x] + wpe[t]``, where the
  token's half of ``fc`` and its bias are one table ``E = wte @ W_x + b`` (``[V, C]``);
- each LayerNorm's weight and bias go into the projection after it (``fast.numpy_steps``'s
  ``fold_norm``), the queries' ``1 / sqrt(head_dim)`` into the query projection, the
  GELU's two ``1 / sqrt 2`` factors into the MLP's weights (``fast.lean``);
- a catch-up of ``T`` committed pairs writes their keys and values in one product and runs
  the rest of the layer for the last pair only: in a one-layer draft a position's key and
  value depend on its own input alone, and only the last pair's output is read (it
  predicts the feature the first draft is sampled from).

``catch_up(f, ids, cache)`` and ``step(h, tok, cache)`` return the predicted feature
``[C]`` as a NumPy array; ``EagleDraft.step`` is the tensor version of the same arithmetic
(tests pin the two to float32 rounding). It runs for float32 / float64 on a CPU
(``fast.numpy_steps.numpy_ok``); elsewhere the proposer takes the tensor step.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.special import erf

from ...fast.numpy_steps import Norm, fold_norm

__all__ = ["HostEagle"]

_SQRT_HALF = 0.5**0.5


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


class HostEagle:
    """NumPy steps of an ``EagleDraft`` (module docstring); built from its current weights."""

    def __init__(self, draft):
        cfg = draft.config
        C, nh = cfg.n_embd, cfg.n_head
        hs = C // nh
        self.C, self.nh, self.hs, self.V = C, nh, hs, cfg.vocab_size
        fcw, fcb, wpe, wte, l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, f2w, f2b = (
            draft.step_params()
        )
        with torch.no_grad():
            self.w_f = fcw[:, :C].t().contiguous().numpy()  # [C, C]: the feature's half
            self.tok = (wte @ fcw[:, C:].t() + fcb).contiguous().numpy()  # [V, C]: E
            self.wpe = wpe.detach().contiguous().numpy()
            self.qkv = fold_norm(_np(l1w), _np(l1b), aw.t().numpy(), _np(ab), (C, hs**-0.5))
            self.pw = pw.t().contiguous().numpy()
            self.pb = _np(pb)
            r = _SQRT_HALF
            self.mlp = fold_norm(_np(l2w), _np(l2b), (fw * r).t().numpy(), _np(fb) * r)
            self.f2w = (f2w * r).t().contiguous().numpy()
            self.f2b = _np(f2b)
        self.norm = Norm(C, self.w_f.dtype)
        self._cache = self._kv = None

    def _views(self, cache):
        # The one layer's keys and values as [nh, S, hs] NumPy views, once per cache.
        if cache is not self._cache:
            self._kv = (cache.k.numpy()[0, 0], cache.v.numpy()[0, 0])
            self._cache = cache
        return self._kv

    def _finish(self, x, q, L: int, ck, cv):
        # The rest of the layer for one position L whose key and value are cached: [C].
        end = L + 1
        s = np.matmul(ck[:, :end], q[:, :, None])[:, :, 0]  # [nh, end]
        s -= s.max(1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(1, keepdims=True)
        y = np.matmul(s[:, None, :], cv[:, :end]).reshape(self.C)
        x = x + y @ self.pw
        x += self.pb
        d, r = self.norm.one(x)
        fw, fb = self.mlp
        u = np.dot(d, fw)
        u *= r
        u += fb
        g = erf(u)  # the GELU, its 1 / sqrt 2 factors folded into the weights
        g *= u
        g += u
        x += g @ self.f2w
        x += self.f2b
        return x

    def step(self, h, tok: int, cache):
        """Feed the pair (``h`` ``[C]``, ``tok``) at position ``cache.length``; return the
        predicted next feature ``[C]`` and extend ``cache`` by one."""
        nh, hs = self.nh, self.hs
        L = cache.length
        ck, cv = self._views(cache)
        x = h @ self.w_f
        x += self.tok[tok]
        x += self.wpe[L]
        d, r = self.norm.one(x)
        W, c = self.qkv
        qkv = np.dot(d, W)
        qkv *= r
        qkv += c
        q, k, v = qkv.reshape(3, nh, hs)
        ck[:, L] = k
        cv[:, L] = v
        out = self._finish(x, q, L, ck, cv)
        cache.length = L + 1
        return out

    def catch_up(self, f, ids, cache):
        """Feed the pairs (``f`` ``[T, C]``, ``ids`` ``[T]``) at positions ``cache.length ..``;
        return the predicted feature after the last pair ``[C]`` and extend ``cache`` by T."""
        nh, hs = self.nh, self.hs
        T = ids.shape[0]
        L = cache.length
        end = L + T
        ck, cv = self._views(cache)
        x = f @ self.w_f
        x += self.tok.take(ids, axis=0)
        x += self.wpe[L:end]
        d, r = self.norm.rows(x)
        W, c = self.qkv
        qkv = d @ W
        qkv *= r
        qkv += c
        qkv = qkv.reshape(T, 3, nh, hs).transpose(1, 2, 0, 3)  # [3, nh, T, hs]
        ck[:, L:end] = qkv[1]
        cv[:, L:end] = qkv[2]
        out = self._finish(x[-1], qkv[0, :, -1], end - 1, ck, cv)
        cache.length = end
        return out
