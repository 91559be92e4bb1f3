"""``FoldedStep``: a one-layer model's batch-1 step, with all its position-wise work in one table.

In a one-layer model only the attention mixes positions; everything else a token brings to
a step depends on the token and its position alone, and so can be computed once for every
(position, token) pair. ``LeanStep`` already looks up the layer's input and its query, key
and value that way; a one-layer model allows three more folds, each exact algebra:

- the attention's output projection is linear, so it can be applied to every value before
  the attention averages them: ``(sum_j a_hj v_hj) @ W_h = sum_j a_hj (v_hj @ W_h)`` per
  head ``h`` (``W_h`` the projection's rows for that head). The cache keeps these projected
  values, ``n_embd`` numbers per head and position, and one ``bmm`` of the attention
  weights with them gives every head's share of the output already projected;
- the query is stored multiplied by ``1 / sqrt(head_dim)``, softmax's scale;
- the residual input is stored with the projection's bias added.

The step runs in NumPy on the same memory (``fast.numpy_steps.NumpyFolded``: NumPy views
of the tables and the cache): a NumPy call on a few hundred floats costs one to two
microseconds, a tensor op four or more, and the step is some twenty-five calls (35 us
against ``LeanStep``'s 70 on the course's CPU, busy, 1 thread). Two more exact folds keep
that count down: each LayerNorm's weight and bias go into the projection after it, and the
attention's scores skip softmax's max subtraction when the tables bound them. A deeper
model cannot fold this way: its later layers' values depend on the whole context, so the
plain baseline is not owed this saving. For a model NumPy cannot run (another dtype, a
GPU) ``draft_step`` gives ``LeanStep``; there is no tensor twin of the folded step.

The cache is a ``FoldedCache``: per position its key (``n_embd`` numbers, head by head, in
``k``) and its projected values (``n_head * n_embd``, in ``v``), with ``KVCache``'s
``length`` and ``crop`` (rollback is still a pointer move). The tables hold ``3 + n_head``
times ``n_embd`` floats per (position, token): 37 MB for the shipped draft.
The logits agree with ``decode_hidden``'s to rounding (tests bound the difference); the
draft reports the ``q`` it computes, so a draft's exactness does not depend on that.
"""

from __future__ import annotations

import torch

from ..model import CharGPT, KVCache
from .derived import built
from .lean import lean_step
from .numpy_steps import NumpyFolded, numpy_ok

__all__ = ["FoldedCache", "FoldedStep", "draft_step"]


class FoldedCache(KVCache):
    """A ``FoldedStep``'s batch-1 cache: per position the key (``k`` ``[block_size,
    n_embd]``, head by head) and the values times the output projection (``v``
    ``[block_size, n_head * n_embd]``, head by head); ``length``, and ``KVCache``'s ``crop``
    and ``reset``."""

    def __init__(self, config, *, dtype: torch.dtype = torch.float32, device=None):
        C, S = config.n_embd, config.block_size
        self.config = config
        self.k = torch.zeros(S, C, dtype=dtype, device=device)
        self.v = torch.zeros(S, config.n_head * C, dtype=dtype, device=device)
        self.length = 0

    @property
    def batch_size(self) -> int:
        return 1

    @property
    def capacity(self) -> int:
        return self.k.shape[0]

    def __repr__(self) -> str:
        return f"FoldedCache(length={self.length}, capacity={self.capacity})"


class FoldedStep:
    """Cached one-token steps of a one-layer ``CharGPT`` (see the module docstring).

    ``new_cache()`` a ``FoldedCache``; ``step(tok, cache, out)``: ``tok`` the next token (an
    int, or an int64 tensor of one element) at position ``cache.length``; extends the cache
    by one and writes the logits ``[1, V]`` into ``out``. ``feed(tok, cache)`` extends the
    cache by ``tok`` (int64 ``[T]``, any ``T``) without logits: a look-up and a write.
    Built from the model's current weights (``draft_step(model)`` keeps one per version);
    ValueError for a model NumPy cannot run (not a CPU float32/float64 one). Unchecked, like
    ``LeanStep``: callers pass tokens their checked paths accepted.
    """

    def __init__(self, model):
        cfg = model.config
        if cfg.n_layer != 1:
            raise ValueError(
                f"FoldedStep folds a one-layer model; this one has {cfg.n_layer} layers "
                "(use fast.lean_step(model))"
            )
        lean = lean_step(model)
        if not numpy_ok(lean.w_t):
            raise ValueError(
                "FoldedStep runs in NumPy: it needs a CPU model of dtype float32 or float64; "
                f"this one is {lean.dtype} on {lean.device} (use fast.lean_step(model))"
            )
        C, nh, hs, V = lean.C, lean.nh, lean.hs, lean.V
        self.C, self.nh, self.hs, self.V, self.W = C, nh, hs, V, (1 + nh) * C
        self.config, self.pos_v, self.dtype, self.device = cfg, lean.pos_v, lean.dtype, lean.device
        (_, _, _, _, pw, pb, l2w, l2b, fw, fb, f2w, f2b) = lean.layers[0]  # pw: [C_in, C_out]
        t = lean.flat  # [S * V, 4C]: x | q | k | v, row pos * V + token
        vp = torch.einsum("rhd,hdc->rhc", t[:, 3 * C :].reshape(-1, nh, hs), pw.view(nh, hs, C))
        self.x = (t[:, :C] + pb).contiguous()  # the residual input, the projection's bias added
        self.q = (t[:, C : 2 * C] * hs**-0.5).contiguous()  # the query, softmax's scale in it
        self.kv = torch.cat([t[:, 2 * C : 3 * C], vp.reshape(-1, nh * C)], dim=1).contiguous()
        self.mlp = (l2w, l2b, fw, fb, f2w, f2b)
        self.lnf_w, self.lnf_b, self.w_t = lean.lnf_w, lean.lnf_b, lean.w_t
        self.np_step = NumpyFolded(self)  # the step itself runs in NumPy (fast.numpy_steps)

    def new_cache(self) -> FoldedCache:
        """An empty cache for this step's model."""
        return FoldedCache(self.config, dtype=self.dtype, device=self.device)

    def feed(self, tok: torch.Tensor, cache: FoldedCache) -> None:
        """Extend ``cache`` by ``tok`` (int64 ``[T]``) without computing logits."""
        start = cache.length
        end = start + tok.shape[0]
        C = self.C
        if end == start + 1:  # one token (a draft's catch-up): two row copies
            self.np_step.feed(int(tok), cache)
            return
        rows = self.kv.index_select(0, self.pos_v[start:end] + tok)
        cache.k[start:end] = rows[:, :C]
        cache.v[start:end] = rows[:, C:]
        cache.length = end

    def step(self, tok, cache: FoldedCache, out: torch.Tensor) -> None:
        """Extend ``cache`` by the one token ``tok``; write its logits ``[1, V]`` to ``out``."""
        self.np_step.step(int(tok), cache, out)


def draft_step(model):
    """The cheapest batch-1 one-token step of ``model`` as a draft: a one-layer ``CharGPT``'s
    ``FoldedStep`` on a CPU (its cache from its ``new_cache()``), else ``lean_step(model)``;
    built once per version of the weights. Off a CPU the lean step is kept: the folded step
    reads each token back to the host to index its table, a sync per step on a GPU (where
    drafts run as CUDA graphs anyway), and it runs in NumPy (float32 or float64). Another
    course decoder gives its ``draft_step()``."""
    if not isinstance(model, CharGPT):
        return model.draft_step()
    if model.config.n_layer != 1 or not numpy_ok(model.lm_head.weight):
        return lean_step(model)
    return built(model, "folded", FoldedStep)
