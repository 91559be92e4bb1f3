"""``LeanStep``: a model's cached step for batch 1, in as few tensor ops as it allows.

On a CPU at batch 1 a step costs what dispatching its ops costs, not their arithmetic.
``CharGPT.decode_hidden`` is general (masks, positions, any batch size);
this step takes one row of ``T`` new tokens after the cache and nothing else, and so can
drop most of the generality's ops:

- the first layer's input, LayerNorm and query/key/value projection are rows of
  ``fast.derived.input_table`` (ordered by position, then token: for one token ``table[pos]``
  is a view and the row one ``index_select`` by the token tensor, no index arithmetic);
- one new token attends to everything cached (no mask); several use the causal bias;
- every projection is one ``addmm`` (bias, input, weight transposed once, contiguous),
  not ``F.linear``'s transpose and product; the cache is written through per-layer views;
- the MLP's GELU, ``h * (1 + erf(h / sqrt 2)) / 2``, is two ops, ``erf`` and ``addcmul``,
  with both factors ``1 / sqrt 2`` folded into the MLP's weights (``u = h / sqrt 2`` comes
  out of the first projection, ``u * (1 + erf(u))`` feeds the second, scaled by
  ``1 / sqrt 2``): ATen's fused ``gelu`` costs several microseconds more per call here,
  four times per target step;
- the logits are written into the caller's buffer.

Plain decoding (``decoding.generate``) and the speculative loop's target call use it, so
the baseline gets every saving a tensor step can have (``lean_step(model, numpy=True)``
runs the chain steps in NumPy, ``fast.numpy_steps``, and the loops' ``executor="numpy"``
takes it in both arms alike); a one-layer draft takes ``fast.folded.FoldedStep``, which
folds more into its table because nothing but one attention sits between the table and
the logits (a saving no deeper model can make). The
arithmetic is ``decode_hidden``'s, rearranged (the same operations in another order, the
GELU's constants in the weights), so the logits agree to rounding (tests bound the
difference). For a one-layer model the keys and values of a
token depend only on the token and its position: ``feed`` then writes them from the table
without running the layer (a draft catching up on committed text needs nothing else).
Unchecked, like ``decode_hidden``: call it with tokens and caches the checked paths have
accepted.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ..model import CharGPT, KVCache
from .derived import built, input_table, model_params
from .numpy_steps import NumpyStep, numpy_ok

__all__ = ["LeanStep", "lean_step", "lean_blocks", "mlp_residual"]

_SQRT_HALF = 0.5**0.5


class LeanStep:
    """Cached steps of ``model`` (a ``CharGPT``) for one row of new tokens.

    ``step(tok, cache, out)``: ``tok`` int64 ``[T]`` (the new tokens, at positions
    ``cache.length ..``), ``cache`` a batch-1 ``KVCache`` of the model; extends the cache by
    ``T`` and writes the logits ``[T, V]`` into ``out`` (skipped when ``out`` is None).
    ``feed(tok, cache)`` extends the cache by ``tok`` without the logits (for a one-layer
    model: the keys and values only, for any ``T``); ``new_cache()`` an empty batch-1
    ``KVCache``. Built from the model's current weights (``lean_step(model)`` keeps one per
    version of them). ``numpy=True`` runs ``step`` in NumPy (``fast.numpy_steps.NumpyStep``:
    a CPU model of dtype float32 or float64, else ValueError); ``hidden`` stays tensor ops.
    """

    def __init__(self, model, *, numpy: bool = False):
        cfg = model.config
        layers, wte, _, lnf_w, lnf_b, arange, causal = model_params(model)
        self.C, self.nh, self.hs = cfg.n_embd, cfg.n_head, cfg.n_embd // cfg.n_head
        self.V = cfg.vocab_size
        self.flat = input_table(model)  # [S * V, 4C], row pos * V + token
        self.table = self.flat.view(cfg.block_size, cfg.vocab_size, 4 * cfg.n_embd)
        self.pos_v = arange * cfg.vocab_size  # row offsets of each position
        self.causal = causal
        r = _SQRT_HALF  # the GELU's 1 / sqrt 2, folded into both MLP projections
        self.layers = [
            (l1w, l1b, aw.t().contiguous(), ab, pw.t().contiguous(), pb, l2w, l2b)
            + ((fw * r).t().contiguous(), fb * r, (f2w * r).t().contiguous(), f2b)
            for (l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, f2w, f2b) in layers
        ]
        self.lnf_w, self.lnf_b = lnf_w, lnf_b
        self.w_t = wte.t().contiguous()  # lm_head as [C, V]
        self.one_layer = cfg.n_layer == 1
        self.config, self.dtype, self.device = cfg, wte.dtype, wte.device
        self._cache = self._kv = None
        self.np_step = None  # the NumPy step (fast.numpy_steps), with numpy=True
        if numpy:
            if not numpy_ok(self.w_t):
                raise ValueError(
                    "the NumPy step needs a CPU model of dtype float32 or float64; this one "
                    f"is {self.w_t.dtype} on {self.w_t.device}"
                )
            self.np_step = NumpyStep(self)

    def new_cache(self) -> KVCache:
        """An empty batch-1 cache for this step's model."""
        return KVCache(self.config, 1, dtype=self.dtype, device=self.device)

    def _views(self, cache: KVCache) -> list:
        # Per layer, the cache's keys and values as [1, nh, S, hs] views: made once per cache.
        if cache is not self._cache:
            self._kv = [(cache.k[i], cache.v[i]) for i in range(len(self.layers))]
            self._cache = cache
        return self._kv

    def _first(self, tok: torch.Tensor, start: int, pos: torch.Tensor | None = None):
        # Table rows of (position, token): layer 0's input x [T, C] and its q | k | v
        # [T, 3C]. Positions start .. unless ``pos``.
        C = self.C
        T = tok.shape[0]
        if T == 1 and pos is None:
            row = self.table[start].index_select(0, tok)  # [1, 4C]
            return row[:, :C], row[:, C:]
        offset = self.pos_v[start : start + T] if pos is None else pos * self.V
        rows = self.flat.index_select(0, offset + tok)  # [T, 4C]
        return rows[:, :C], rows[:, C:]

    def feed(self, tok: torch.Tensor, cache: KVCache) -> None:
        """Extend ``cache`` by ``tok`` (int64 ``[T]``) without computing logits."""
        if not self.one_layer:
            self.step(tok, cache, None)
            return
        start = cache.length
        end = start + tok.shape[0]
        _, qkv = self._first(tok, start)
        _, kk, vv = _heads(qkv, tok.shape[0], self.nh, self.hs).unbind(0)
        k, v = self._views(cache)[0]
        k[:, :, start:end] = kk
        v[:, :, start:end] = vv
        cache.length = end

    def step(self, tok: torch.Tensor, cache: KVCache, out: torch.Tensor | None) -> None:
        """Extend ``cache`` by ``tok`` (int64 ``[T]``); write the logits ``[T, V]`` to ``out``."""
        if self.np_step is not None:
            self.np_step.step(tok, cache, out)
            return
        h = self.hidden(tok, cache, None, None, need=out is not None)
        if out is not None:
            torch.mm(h, self.w_t, out=out)

    def hidden(
        self, tok, cache: KVCache, pos=None, bias=None, *, need: bool = True, layers: int = 1
    ):
        """The last hidden states ``[T, n_embd]`` (after the final LayerNorm) of ``tok``,
        extending ``cache``; ``pos`` (int64 ``[T]``) and ``bias`` (additive float ``[T,
        cache.length + T]``) replace the next positions and the causal mask, as
        ``decode_hidden``'s (a Medusa tree pass). ``need=False`` skips the final norm.
        ``layers = m > 1`` returns ``[T, m * n_embd]``: the outputs of the ``m - 1`` blocks
        before the last, each LayerNorm-ed without weights, then the last hidden state
        (``eagle.target_features``' layout)."""
        C, nh, hs = self.C, self.nh, self.hs
        T = tok.shape[0]
        start = cache.length
        end = start + T
        if bias is None:
            bias = None if T == 1 else self.causal[start:end, :end]
        x, qkv = self._first(tok, start, pos)
        kv = self._views(cache)

        def attend(i, qkv):  # the new keys and values into the cache, then attention
            q, k, v = _heads(qkv, T, nh, hs).unbind(0)
            ck, cv = kv[i]
            ck[:, :, start:end] = k
            cv[:, :, start:end] = v
            y = F.scaled_dot_product_attention(
                q, ck[:, :, :end], cv[:, :, :end], attn_mask=bias
            )  # [1, nh, T, hs]
            return y.view(1, C) if T == 1 else y[0].transpose(0, 1).reshape(T, C)

        wide = []  # the outputs of the blocks before the last, for a wide feature
        x = lean_blocks(self.layers, x, qkv, attend, wide, len(self.layers) - layers)
        cache.length = end
        if not need:
            return None
        out = F.layer_norm(x, (C,), self.lnf_w, self.lnf_b)
        return torch.cat([*wide, out], -1) if wide else out

    def logits(self, hidden: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The logits ``[T, V]`` of ``hidden``'s last states (``hidden(...)``'s output, any
        ``layers``: the last ``n_embd`` columns), written into ``out``; returns ``out``."""
        if hidden.shape[1] != self.C:
            hidden = hidden[:, -self.C :]
        return torch.mm(hidden, self.w_t, out=out)


def lean_blocks(layers, x, qkv, attend, wide=None, first_kept=None) -> torch.Tensor:
    """The blocks over rows ``x [N, n_embd]`` with ``LeanStep.layers``' weights: the one
    rearranged copy of ``CharGPT``'s block (``addmm`` projections, the two-op GELU of
    ``mlp_residual``) that ``LeanStep`` and ``fast.ragged.RaggedSteps`` share. ``qkv``
    ``[N, 3 n_embd]`` is layer 0's projection when the input table gave it (else None);
    ``attend(layer, qkv)`` writes the cache and returns the attention's output ``[N,
    n_embd]`` (each caller's cache layout). With ``wide`` a list, the outputs of the blocks
    after ``first_kept``, LayerNorm-ed without weights, are appended to it. Returns the
    residual stream after the last block."""
    C = x.shape[-1]
    for i, (l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, f2w, f2b) in enumerate(layers):
        if wide is not None and i > first_kept:
            wide.append(F.layer_norm(x, (C,)))
        if qkv is None:
            qkv = torch.addmm(ab, F.layer_norm(x, (C,), l1w, l1b), aw)
        y = attend(i, qkv)
        qkv = None
        x = mlp_residual(x + torch.addmm(pb, y, pw), C, l2w, l2b, fw, fb, f2w, f2b)
    return x


def mlp_residual(x, C: int, l2w, l2b, fw, fb, f2w, f2b) -> torch.Tensor:
    """``x`` plus the MLP of ``LayerNorm(x)``, with ``LeanStep.layers``' weights: the GELU's
    two factors ``1 / sqrt 2`` are already in ``fw``, ``fb`` and ``f2w`` (the module
    docstring), so it is ``erf`` and one ``addcmul``. ``fast.folded`` takes it too."""
    u = torch.addmm(fb, F.layer_norm(x, (C,), l2w, l2b), fw)  # GELU input / sqrt 2
    return x + torch.addmm(f2b, torch.addcmul(u, u, torch.erf(u)), f2w)


def _heads(qkv: torch.Tensor, T: int, nh: int, hs: int) -> torch.Tensor:
    # [T, 3C] -> [3, 1, nh, T, hs]: q, k, v by head (a view for T = 1, else a permute).
    if T == 1:
        return qkv.view(3, 1, nh, 1, hs)
    return qkv.view(T, 3, nh, hs).permute(1, 2, 0, 3).unsqueeze(1)


def lean_step(model, *, numpy: bool = False):
    """``model``'s ``LeanStep`` (the batch-1 cached step every decoding loop takes), built once
    per version of its weights (``fast.derived``); ``numpy=True`` its NumPy twin. Another
    course decoder (``course_decoder = True``, e.g. ``llm.llama.Llama``) gives its own
    ``model.lean_step()``; it has no NumPy step (ValueError)."""
    if not isinstance(model, CharGPT):
        if numpy:
            raise ValueError(f"executor='numpy' needs a CharGPT; got {type(model).__name__}")
        return model.lean_step()
    if numpy:
        return built(model, "lean_numpy", lambda m: LeanStep(m, numpy=True))
    return built(model, "lean", LeanStep)
