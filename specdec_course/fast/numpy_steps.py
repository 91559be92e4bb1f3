"""The batch-1 cached steps in NumPy, on the tensors' own memory: where a CPU step is cheapest.

On a CPU at batch 1 a step of these models costs what dispatching its operations costs, not
their arithmetic (lesson 04 section 5). A tensor op costs four microseconds or more before
it computes anything; a NumPy call on a few hundred floats costs one to two. So the same
step, written as NumPy calls on NumPy views of the same weights and the same cache, takes
less time, although it needs more calls (NumPy has no fused LayerNorm, ``addmm`` or
attention).

Who gets it. The one-layer draft's ``FoldedStep`` runs in NumPy on a CPU by default
(``NumpyFolded``: 0.5-0.8 of the tensor step's time in paired probes on the course's CPU, as
the machine's state varies; in the loop the target's next call, run with colder caches after
the NumPy calls, gives part of that back: ``tools/probe_draft_step.py`` measures both): a
draft may run on anything, as the n-gram drafts are tables. The target's steps stay tensor
ops by default, and they are the same in both arms of every comparison (plain decoding, the
speculative loop's call, Medusa's tree passes, which ``LeanStep.hidden`` runs as tensor
ops). ``lean_step(model, numpy=True)`` runs the target's chain steps (``LeanStep.step``) in
NumPy (``NumpyStep``), for plain and speculative decoding alike; ``bench speedup --target-executor
numpy`` measures the speedups that way and stores them beside the default record. A leaner
target step makes plain decoding faster and speculation's ratio smaller: the (k + 1)-token
call then has less per-call cost to share out over its tokens (README's figures give both
records).

The arithmetic is ``LeanStep``'s with three more exact rearrangements:

- each LayerNorm's weight and bias are folded into the projection after it:
  ``LN(x) @ W + c = rstd * ((x - mean) @ (w * W)) + (b @ W + c)``, so a norm is a mean, a
  subtraction and a dot product, and the projection's output is scaled by one number;
- the queries' ``1 / sqrt(head_dim)`` is folded into the query projection (layer 0's table
  rows are scaled when read);
- LayerNorm's means are dot products with a vector of ones, its variance a dot product of
  the centred row with itself (NumPy's reductions cost several microseconds each at these
  sizes; ``dot`` one).

The cache is the ``KVCache`` (or ``FoldedCache``) the tensor step uses, read and written
through NumPy views: a prefill by the tensor forward, a rollback, ``caches_consistent`` and
the tree passes of ``LeanStep.hidden`` all see the same keys and values. The logits agree
with the tensor step's to float32 rounding (tests bound the difference). It runs for the
float dtypes NumPy has (float32, float64) on a CPU (``numpy_ok``); otherwise the tensor
step runs. ``erf`` comes from ``scipy.special``.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.special import erf

__all__ = ["NumpyStep", "NumpyFolded", "numpy_ok", "fold_norm", "Norm"]

_NUMPY_DTYPES = (torch.float32, torch.float64)
_EPS = 1e-5  # nn.LayerNorm's


def numpy_ok(t: torch.Tensor) -> bool:
    """True when ``t``'s steps can run in NumPy: a CPU tensor of a dtype NumPy has."""
    return t.device.type == "cpu" and t.dtype in _NUMPY_DTYPES


def _np(t):
    # A NumPy view of a weight (LeanStep's tensors are all there: it needs the biases too).
    return t.detach().numpy()


def fold_norm(w, b, W, c, scale=None):
    # LN(x) @ W + c with LN's weight and bias folded in: (w * W, b @ W + c). ``scale``
    # multiplies the first ``scale[0]`` columns by ``scale[1]`` (the queries' softmax scale).
    W2 = (w[:, None] * W).astype(W.dtype)
    c2 = (b @ W + c).astype(W.dtype)
    if scale is not None:
        n, s = scale
        W2[:, :n] *= s
        c2[:n] *= s
    return W2, c2


class Norm:
    """LayerNorm's ``x - mean`` and ``1 / std`` by dot products (no weight: folded away)."""

    def __init__(self, C: int, dtype):
        self.C = C
        self.mean_w = np.full(C, 1.0 / C, dtype)  # x @ mean_w: the row means

    def one(self, x):
        # For one row: the centred row and its 1 / std (a Python float).
        d = x - x.dot(self.mean_w)
        return d, 1.0 / (float(d.dot(d)) / self.C + _EPS) ** 0.5

    def rows(self, x):
        # For [T, C]: the centred rows and their 1 / std as a column [T, 1].
        d = x - (x @ self.mean_w)[:, None]
        var = (d * d) @ self.mean_w
        return d, (1.0 / np.sqrt(var + _EPS))[:, None]


class NumpyStep:
    """``LeanStep.step`` in NumPy for a CPU model of a NumPy dtype (the module docstring).

    ``step(tok, cache, out)``: ``tok`` int64 ``[T]`` (tensor or array) at positions
    ``cache.length ..``, ``cache`` a batch-1 ``KVCache`` of the model; extends the cache by
    ``T`` and writes the logits into ``out`` (a ``[T, V]`` array or tensor; None skips them).
    """

    def __init__(self, lean):
        self.C, self.nh, self.hs, self.V = lean.C, lean.nh, lean.hs, lean.V
        C, hs = self.C, self.hs
        self.flat = lean.flat.numpy()  # [S * V, 4C]: x | q | k | v, row pos * V + token
        self.pos_v = lean.pos_v.numpy()  # row offsets of each position
        self.causal = lean.causal.numpy()  # additive [S, S]
        self.scale = hs**-0.5
        self.layers = []
        for i, (l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, f2w, f2b) in enumerate(lean.layers):
            aw, pw, fw, f2w = (_np(t) for t in (aw, pw, fw, f2w))
            qkv = None
            if i:  # layer 0's norm and projection are rows of the table
                qkv = fold_norm(_np(l1w), _np(l1b), aw, _np(ab), (C, self.scale))
            mlp = fold_norm(_np(l2w), _np(l2b), fw, _np(fb))
            self.layers.append((qkv, pw, _np(pb), mlp, f2w, _np(f2b)))
        w_t = lean.w_t.numpy()
        self.head = fold_norm(_np(lean.lnf_w), _np(lean.lnf_b), w_t, 0 * w_t[0])
        self.norm = Norm(C, w_t.dtype)
        self._cache = self._kv = None

    def _views(self, cache):
        # Per layer, the cache's keys and values as [nh, S, hs] NumPy views: once per cache.
        if cache is not self._cache:
            k, v = cache.k.numpy(), cache.v.numpy()
            self._kv = [(k[i, 0], v[i, 0]) for i in range(k.shape[0])]
            self._cache = cache
        return self._kv

    def step(self, tok, cache, out) -> None:
        tok = tok.numpy() if isinstance(tok, torch.Tensor) else np.asarray(tok)
        if isinstance(out, torch.Tensor):
            out = out.numpy()
        T = tok.shape[0]
        start = cache.length
        end = start + T
        kv = self._views(cache)
        if T == 1:
            x = self._one(int(tok[0]), start, kv)
            if out is not None:
                W, c = self.head
                d, r = self.norm.one(x)
                o = out[0]
                np.dot(d, W, out=o)
                o *= r
                o += c
        else:
            x = self._rows(tok, start, kv)
            if out is not None:
                W, c = self.head
                d, r = self.norm.rows(x)
                np.dot(d, W, out=out)
                out *= r
                out += c
        cache.length = end

    def _one(self, t: int, L: int, kv):
        # One token at position L: the residual stream after every layer, [C].
        C, nh, hs, norm = self.C, self.nh, self.hs, self.norm
        end = L + 1
        row = self.flat[L * self.V + t]
        x = row[:C].copy()
        for (ck, cv), (qw, pw, pb, (fw, fb), f2w, f2b) in zip(kv, self.layers):
            if qw is None:  # layer 0: the table's row (its query not yet scaled)
                q, k, v = row[C:].reshape(3, nh, hs)
                q = q * self.scale
            else:
                d, r = norm.one(x)
                qkv = np.dot(d, qw[0])
                qkv *= r
                qkv += qw[1]
                q, k, v = qkv.reshape(3, nh, hs)
            ck[:, L] = k
            cv[:, L] = v
            s = np.matmul(ck[:, :end], q[:, :, None])[:, :, 0]  # [nh, end]
            s -= s.max(1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(1, keepdims=True)
            y = np.matmul(s[:, None, :], cv[:, :end]).reshape(C)  # [nh, 1, hs] -> [C]
            x += y @ pw
            x += pb
            d, r = norm.one(x)
            u = np.dot(d, fw)
            u *= r
            u += fb
            g = erf(u)  # the GELU, its 1 / sqrt 2 factors in fw, fb and f2w (fast.lean)
            g *= u
            g += u
            x += g @ f2w
            x += f2b
        return x

    def _rows(self, tok, start: int, kv):
        # T > 1 tokens at positions start ..: the residual stream [T, C], causal attention.
        # Softmax over [nh, T, L] and erf over [T, 4C] cost NumPy axis reductions and a
        # scalar loop (scipy's erf, 7 ns a number); ATen's vectorised kernels do each in one
        # op on the same memory (torch.from_numpy is a view): warm, at T = 8, 7 us against
        # 21 for erf and 6.5 against 9 for softmax (a probe; inside the loop, with cold
        # caches, both ways cost about 20 us each).
        C, nh, hs, norm = self.C, self.nh, self.hs, self.norm
        T = tok.shape[0]
        end = start + T
        rows = self.flat.take(self.pos_v[start:end] + tok, axis=0)  # [T, 4C], a copy
        x = rows[:, :C]
        bias = self.causal[start:end, :end]
        for (ck, cv), (qw, pw, pb, (fw, fb), f2w, f2b) in zip(kv, self.layers):
            if qw is None:
                qkv = rows[:, C:]
                qkv[:, :C] *= self.scale
            else:
                d, r = norm.rows(x)
                qkv = d @ qw[0]
                qkv *= r
                qkv += qw[1]
            qkv = qkv.reshape(T, 3, nh, hs).transpose(1, 2, 0, 3)  # [3, nh, T, hs]
            ck[:, start:end] = qkv[1]
            cv[:, start:end] = qkv[2]
            s = np.matmul(qkv[0], ck[:, :end].transpose(0, 2, 1))  # [nh, T, end]
            s += bias
            a = torch.softmax(torch.from_numpy(s), -1).numpy()
            y = np.matmul(a, cv[:, :end]).transpose(1, 0, 2).reshape(T, C)
            x = x + y @ pw
            x += pb
            d, r = norm.rows(x)
            u = d @ fw
            u *= r
            u += fb
            g = torch.erf(torch.from_numpy(u)).numpy()  # the GELU, as in _one
            g *= u
            g += u
            x += g @ f2w
            x += f2b
        return x


class NumpyFolded:
    """``FoldedStep.step`` in NumPy: a one-layer draft's step (``fast.folded``).

    ``step(t, cache, out)``: ``t`` the token (an int) at position ``cache.length``,
    ``cache`` a ``FoldedCache``, ``out`` a ``[V]`` array (or a ``[1, V]`` tensor) for the
    logits. The key of the new position is scored for every head at once, against a
    block-diagonal ``[n_embd, n_head]`` matrix holding the query; the attention weights
    ``[L, n_head]`` times the projected values ``[L * n_head, n_embd]`` sum heads and
    positions in one product. Softmax's max subtraction is skipped when the tables bound the
    scores (``max |q| * max |k| < 60``: no float32 overflow or underflow; mathematically
    the same softmax), else kept.
    """

    def __init__(self, folded):
        C, nh, hs, V = folded.C, folded.nh, folded.hs, folded.V
        self.C, self.nh, self.hs, self.V = C, nh, hs, V
        self.x = folded.x.numpy()  # [S * V, C], the projection's bias added
        self.q = folded.q.numpy()  # [S * V, C], scaled
        kv = folded.kv.numpy()
        self.k, self.v = kv[:, :C], kv[:, C:]
        dt = self.x.dtype
        qn = np.sqrt(np.einsum("ij,ij->i", self.q, self.q, dtype=np.float64)).max()
        kn = np.sqrt(np.einsum("ij,ij->i", self.k, self.k, dtype=np.float64)).max()
        self.bounded = bool(qn * kn < 60.0)
        l2w, l2b, fw, fb, f2w, f2b = folded.mlp
        fw = _np(fw)
        self.mlp = fold_norm(_np(l2w), _np(l2b), fw, _np(fb))
        self.f2w = _np(f2w)
        self.f2b = _np(f2b)
        w_t = folded.w_t.numpy()
        self.lnf = (_np(folded.lnf_w), _np(folded.lnf_b))  # for heads on the hidden state
        self.head = fold_norm(*self.lnf, w_t, 0 * w_t[0])
        self.norm = Norm(C, dt)
        S = folded.config.block_size
        self.qb = np.zeros((C, nh), dt)  # the query, block-diagonal: head h in column h
        b = self.qb.itemsize
        self.diag = np.lib.stride_tricks.as_strided(self.qb, (nh, hs), ((hs * nh + 1) * b, nh * b))
        self.scores = np.empty((S, nh), dt)
        self.ones = np.ones(S, dt)
        self.z = np.empty(nh, dt)
        self._cache = self._kv = None

    def _views(self, cache):
        if cache is not self._cache:
            self._kv = (cache.k.numpy(), cache.v.numpy().reshape(-1, self.C))
            self._cache = cache
        return self._kv

    def feed(self, t: int, cache) -> None:
        """Extend ``cache`` by the token ``t`` without logits: two row copies."""
        L, nh = cache.length, self.nh
        K, Vp = self._views(cache)
        i = L * self.V + t
        K[L] = self.k[i]
        Vp[L * nh : (L + 1) * nh] = self.v[i].reshape(nh, self.C)
        cache.length = L + 1

    def step(self, t: int, cache, out) -> None:
        if isinstance(out, torch.Tensor):
            out = out.numpy()[0]
        d, r = self.norm.one(self.residual(t, cache))
        W, c = self.head
        np.dot(d, W, out=out)
        out *= r
        out += c

    def residual(self, t: int, cache):
        """Extend ``cache`` by the token ``t``; return the residual stream after the layer
        (``[C]``, a new array, before the final LayerNorm): ``step`` without the head."""
        C, nh = self.C, self.nh
        L = cache.length
        end = L + 1
        i = L * self.V + t
        K, Vp = self._views(cache)  # [S, C] and [S * nh, C]
        K[L] = self.k[i]
        Vp[L * nh : end * nh] = self.v[i].reshape(nh, C)
        self.diag[...] = self.q[i].reshape(nh, self.hs)
        s = np.dot(K[:end], self.qb, out=self.scores[:end])  # [end, nh]
        if not self.bounded:
            s -= s.max(0)
        np.exp(s, out=s)
        z = np.dot(self.ones[:end], s, out=self.z)
        np.reciprocal(z, out=z)
        s *= z
        x = np.dot(s.reshape(-1), Vp[: end * nh])  # every head's output, projected, summed
        x += self.x[i]
        d, r = self.norm.one(x)
        fw, fb = self.mlp
        u = np.dot(d, fw)
        u *= r
        u += fb
        g = erf(u)  # the GELU (fast.lean: its 1 / sqrt 2 factors in the weights)
        g *= u
        g += u
        x += g @ self.f2w
        x += self.f2b
        cache.length = end
        return x
