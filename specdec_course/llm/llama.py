"""A Llama written for the course: SmolLM2-135M's architecture in about 300 lines.

The same decoder as lesson 03's ``CharGPT`` with the four changes Llama made (Touvron et al.
2023), each a few lines below:

- **RMSNorm** instead of LayerNorm: scale by the root mean square, no mean, no bias.
- **Rotary positions** (RoPE, Su et al. 2021) instead of a learned position table: each
  head's query and key are rotated, in pairs of dimensions, by an angle that grows with the
  position (pair ``i`` turns ``theta ** (-2i / head_dim)`` radians per position; SmolLM2's
  ``theta`` is 100,000, read from the file). The pairs are adjacent dimensions ``(2i, 2i+1)``,
  the layout the GGUF file stores (``gguf_load``'s docstring says why that matters).
- **Grouped-query attention**: 9 query heads share 3 key/value heads (each key/value head
  serves 3 query heads), so the cache holds a third of what full attention would.
- **SwiGLU** MLP: ``w2(silu(w1 x) * w3 x)``, 576 -> 1536 -> 576; no biases anywhere.

The output layer is tied to the token embedding. Query, key and value are one matrix
(``wqkv``) and the gate and up projections another (``w13``), as gpt-fast does: one matrix
product each at decode time.

The model plugs into the course's loops unchanged (``decoding.generate``,
``decoding.speculative_generate``): it has what they read from ``CharGPT`` (``config.
vocab_size`` and ``block_size``, ``lm_head.weight``, ``new_cache``, ``forward(idx, cache)``,
``hidden_states``, ``lean_step``), and ``LlamaCache`` is ``model.KVCache`` with another shape:
``length``, ``crop(n)`` a pointer move, ``reset()``, ``capacity``.

Dtype: the transformer's weights and cache are in ``compute_dtype`` (``llm.load`` picks it
by measurement); the tied table ``lm_head.weight`` and the logits stay float32, the dtype the
loops' verifier reads through NumPy; the head's product reads a copy of the table in the
compute dtype (``head_weight``). ``llm.packed.pack`` swaps the products for oneDNN's packed
ones where they are faster (the speed path, beside the model).

**Attention gives a token the same bits whatever the number of tokens its call scores**
(``"batched"``, the default in float32): greedy speculative text is then plain greedy text
where the products are row-invariant too (``llm.kernels``). One computation serves all of a
call's tokens, built from products whose results per row do not depend on the call's size on
the course's EPYC (MKL): a product of four or more query rows (a one-token call's three rows
per key/value head are padded with a zero row: MKL takes another kernel below four); keys
read in whole blocks of ``KEY_BLOCK`` (128) positions, those after a row's token set to
``-inf`` (weight exactly 0; the cache zeroes positions never written); values summed one block
of keys at a time, in order (MKL splits a longer sum where its length says, 256 for one);
softmax's sums per row, lane by lane, are unchanged by trailing zeros. ``finish_loading``
checks it on this machine (``batched_attention_is_row_invariant``) and else attends
``"per_token"``: a call of its own per token, exact by construction. Cost on the EPYC after
300 tokens (one thread, thread CPU time, interleaved medians, a busy machine, load 6 to 11):
a call of 1, 5 and 9 tokens took 50.9, 51.0 and 63.4 ms batched, 47.8, 53.4 and 68.9 per
token (31 rounds); the worst cost(T) / cost(1) over T = 1 .. 9 was 1.18 batched, 1.40 per
token, 1.32 for ``"fused"`` (one SDPA call, exact only to float32's rounding; 11 rounds).
One layer's attention alone: 90, 144, 197 us batched against 52, 235, 419 per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from .._validate import check_token_batch
from ..devices import check_same_device
from ..model import KVCache
from .attention import (
    ATTENTION_MODES,
    CHUNK,
    KEY_BLOCK,
    batched_attention,
    batched_attention_is_row_invariant,
    keys_read,
)

__all__ = ["LlamaConfig", "Llama", "LlamaCache", "LlamaStep"]


@dataclass(frozen=True)
class LlamaConfig:
    """SmolLM2-135M's sizes (the GGUF file's, ``gguf_load.read_gguf``)."""

    vocab_size: int = 49152
    block_size: int = 8192  # the context the model was trained to
    n_layer: int = 30
    n_head: int = 9
    n_kv_head: int = 3
    n_embd: int = 576
    intermediate_size: int = 1536
    rope_theta: float = 100000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class LlamaCache(KVCache):
    """``model.KVCache`` for the Llama: ``k``, ``v`` ``[n_layer, B, n_kv_head, capacity,
    head_dim]`` and ``length``; ``crop``, ``reset``, ``capacity``, ``batch_size`` inherited.

    Allocated with ``torch.empty``: a position is read only after a forward wrote it, and
    the pages of an 8192-position cache that a short generation never reaches are never
    touched."""

    def __init__(self, config: LlamaConfig, batch_size: int = 1, *, dtype, device=None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        shape = (config.n_layer, batch_size, config.n_kv_head, config.block_size, config.head_dim)
        self.config = config
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.length = 0
        self.finite = 0  # positions below hold numbers (written, or zeroed for the padding)


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, with ``rms(x) = sqrt(mean(x ** 2) + eps)`` over the last dim."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rotary_tables(config: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin`` ``[block_size, 1, head_dim]``: position ``t``'s rotation of each pair of
    dimensions ``(2i, 2i+1)`` by ``t * theta ** (-2i / head_dim)`` radians, each value
    written twice (once per dimension of its pair); ``sin`` carries the sign of the first
    dimension's term, so that ``rotate(x) = x * cos + swap_pairs(x) * sin``."""
    hd = config.head_dim
    freqs = config.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angles = torch.outer(torch.arange(config.block_size, dtype=torch.float64), freqs)
    cos = angles.cos().repeat_interleave(2, dim=-1)
    sin = torch.stack([-angles.sin(), angles.sin()], dim=-1).flatten(-2)
    return cos[:, None, :].float(), sin[:, None, :].float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each adjacent pair ``(x0, x1)`` of ``x`` ``[B, T, heads, head_dim]``:
    ``(x0 cos - x1 sin, x1 cos + x0 sin)``, with ``cos, sin`` ``[T, 1, head_dim]``."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (x1, x0) in each pair
    return x * cos + swapped * sin


class Attention(nn.Module):
    """Grouped-query attention with the cache, by ``mode`` (``Llama.set_attention``)."""

    mode = "batched"

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.hd = config.n_head, config.n_kv_head, config.head_dim
        kv = config.n_kv_head * config.head_dim
        self.wqkv = nn.Linear(config.n_embd, config.n_embd + 2 * kv, bias=False)
        self.wo = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x, cos, sin, cache: LlamaCache, layer: int):
        B, T, C = x.shape
        nh, hd = self.n_head, self.hd
        qkv = self.wqkv(x).unflatten(-1, (-1, hd))  # [B, T, 9 + 3 + 3 heads, hd]
        qk = apply_rotary(qkv[:, :, : nh + self.n_kv_head], cos, sin)  # queries and keys
        # Grouped-query attention: query head h reads key/value head h // 3, so a token's 9
        # query heads are 3 groups of 3 rows, one group per key/value head.
        q = qk[:, :, :nh].unflatten(2, (self.n_kv_head, -1))  # [B, T, 3, 3, hd]
        k = qk[:, :, nh:].transpose(1, 2)  # [B, 3, T, hd]
        v = qkv[:, :, nh + self.n_kv_head :].transpose(1, 2)
        start = cache.length
        end = start + T
        ck, cv = cache.k[layer], cache.v[layer]  # [B, n_kv_head, capacity, hd]
        ck[:, :, start:end] = k
        cv[:, :, start:end] = v
        if self.mode == "batched" and q.dtype == torch.float32:
            if T <= CHUNK:
                y = batched_attention(q, ck, cv, start)
            else:
                chunks = range(0, T, CHUNK)
                y = torch.cat(
                    [batched_attention(q[:, i : i + CHUNK], ck, cv, start + i) for i in chunks], 1
                )
            return self.wo(y.reshape(B, T, C))
        if T > 1 and self.mode == "fused":  # one fused call, each row masked to its past
            pos = torch.arange(end, device=x.device)
            y = F.scaled_dot_product_attention(
                q.flatten(2, 3).transpose(1, 2),  # [B, 9, T, hd]
                ck[:, :, :end],
                cv[:, :, :end],
                attn_mask=pos[None, :] <= pos[start:, None],
                enable_gqa=True,
            )
            return self.wo(y.transpose(1, 2).reshape(B, T, C))
        # "per_token": each new token attends in a call of its own, over the keys up to its
        # position: the call a one-token step makes.
        rows = [
            F.scaled_dot_product_attention(
                q[:, i], ck[:, :, : start + i + 1], cv[:, :, : start + i + 1]
            )  # [B, 3, 3, hd]
            for i in range(T)
        ]
        y = rows[0][:, None] if T == 1 else torch.stack(rows, dim=1)  # [B, T, 3, 3, hd]
        return self.wo(y.reshape(B, T, C))


class FeedForward(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.hidden = config.intermediate_size
        self.w13 = nn.Linear(config.n_embd, 2 * self.hidden, bias=False)  # gate, then up
        self.w2 = nn.Linear(self.hidden, config.n_embd, bias=False)

    def forward(self, x):
        gate, up = self.w13(x).split(self.hidden, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, cos, sin, cache, layer):
        x = x + self.attention(self.attention_norm(x), cos, sin, cache, layer)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """The decoder. ``forward(idx, cache=None)`` -> float32 logits ``[B, T, vocab_size]``."""

    course_decoder = True  # the decoding loops take it (``model.check_model``)

    def __init__(self, config: LlamaConfig, compute_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = config
        self.compute_dtype = compute_dtype
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.tok_embeddings.weight  # tied
        cos, sin = rotary_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.head_weight = None  # the tied table in the compute dtype (finish_loading)
        self.head_product = None  # None: F.linear by head_weight; llm.packed.pack sets it
        self._step = None

    def finish_loading(self) -> Llama:
        """After the weights are in: the blocks in ``compute_dtype``, the tied table (and so the
        logits) in float32 with a copy in ``compute_dtype`` for the head's product."""
        for layer in self.layers:
            layer.to(self.compute_dtype)
        self.norm.to(self.compute_dtype)
        self.rope_cos = self.rope_cos.to(self.compute_dtype)
        self.rope_sin = self.rope_sin.to(self.compute_dtype)
        w = self.lm_head.weight
        self.head_weight = w if self.compute_dtype == w.dtype else w.detach().to(self.compute_dtype)
        self.head_product = None
        self._step = None
        c, dev = self.config, w.device
        exact = batched_attention_is_row_invariant(
            c.n_kv_head, c.n_head // c.n_kv_head, c.head_dim, dev
        )
        self.set_attention("batched" if exact else "per_token")
        return self.eval().requires_grad_(False)

    def set_attention(self, mode: str) -> Llama:
        """How a call's new tokens attend, one of ``ATTENTION_MODES``: ``"batched"`` (the
        default) and ``"per_token"`` give a token's logits the same bits whatever the number
        of tokens its call scores (so greedy speculative text is plain greedy text where the
        products are row-invariant too, ``llm.kernels``); ``"fused"``, one SDPA call per
        layer, differs from a one-token call's rows by float32 rounding."""
        if mode not in ATTENTION_MODES:
            raise ValueError(f"mode must be one of {ATTENTION_MODES}; got {mode!r}")
        for layer in self.layers:
            layer.attention.mode = mode
        return self

    def new_cache(self, batch_size: int = 1) -> LlamaCache:
        """An empty cache of ``block_size`` positions in the compute dtype."""
        dev = self.lm_head.weight.device
        return LlamaCache(self.config, batch_size, dtype=self.compute_dtype, device=dev)

    def _check_idx(self, idx, cache):
        B, T = check_token_batch(idx)
        dev = self.lm_head.weight.device
        if idx.device != dev:
            check_same_device("idx", idx.device, "the model", dev)
        if cache is not None and not isinstance(cache, LlamaCache):
            raise ValueError(
                f"cache must be this model's LlamaCache (model.new_cache()); got "
                f"{type(cache).__name__}"
            )
        V = self.config.vocab_size
        if idx.min() < 0 or idx.max() >= V:
            raise ValueError(
                f"idx holds ids outside [0, {V}); encode text with the model's tokenizer"
            )
        start = 0 if cache is None else cache.length
        if start + T > self.config.block_size:
            raise ValueError(
                f"{start} cached + {T} new tokens exceed the context of "
                f"{self.config.block_size} positions; shorten the prompt or generate fewer tokens"
            )
        if cache is not None and cache.batch_size != B:
            raise ValueError(f"cache has batch size {cache.batch_size} but idx has {B} rows")

    def decode_hidden(self, idx: torch.Tensor, cache: LlamaCache) -> torch.Tensor:
        """Unchecked ``hidden_states`` with a cache (the loops' step calls it)."""
        T = idx.shape[1]
        start = cache.length
        cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]
        x = self.tok_embeddings(idx).to(self.compute_dtype)
        n = keys_read(start + T, KEY_BLOCK)  # the batched attention reads keys up to n
        if cache.finite < n:  # never written: zeroed, as a padding key times 0 must be 0
            lo = max(cache.finite, start + T)
            cache.k[:, :, :, lo:n].zero_()
            cache.v[:, :, :, lo:n].zero_()
            cache.finite = n
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i)
        cache.length = start + T
        return self.norm(x)

    def hidden_states(self, idx: torch.Tensor, cache: LlamaCache | None = None) -> torch.Tensor:
        """The final hidden state after the last RMSNorm, ``[B, T, n_embd]`` (in the compute
        dtype): the input of the tied head, what an EAGLE-style draft reads. With ``cache``
        the new tokens ``idx`` extend it (as ``forward``); without, ``idx`` is the whole
        sequence."""
        self._check_idx(idx, cache)
        if cache is None:
            cache = self.new_cache(idx.shape[0])
        return self.decode_hidden(idx, cache)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Float32 logits of hidden states ``h`` ``[..., n_embd]`` (the tied output layer)."""
        h = h.to(self.compute_dtype)
        if self.head_product is not None:
            return self.head_product(h).float()
        return F.linear(h, self.head_weight).float()

    def forward(self, idx: torch.Tensor, cache: LlamaCache | None = None, *, return_hidden=False):
        """Float32 logits ``[B, T, vocab_size]`` of every position of ``idx``.

        Without ``cache``, ``idx`` ``[B, T]`` is the whole sequence; with it, ``idx`` holds only
        the new tokens, at positions ``cache.length ..``, and the cache grows by ``T``.
        ``return_hidden=True`` returns ``(logits, hidden)``. Raises ValueError for ids outside
        the vocabulary, a non-int64 or non-2-D ``idx``, or more positions than ``block_size``.
        """
        h = self.hidden_states(idx, cache)
        logits = self.head(h)
        return (logits, h) if return_hidden else logits

    def lean_step(self) -> LlamaStep:
        """The batch-1 cached step the loops take (``EagerSteps`` calls ``step``)."""
        if self._step is None:
            self._step = LlamaStep(self)
        return self._step

    def draft_step(self) -> LlamaStep:
        return self.lean_step()

    def num_parameters(self) -> int:
        """All parameters, the tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())


class LlamaStep:
    """``model.lean.LeanStep``'s interface for the Llama: ``step(ids [T], cache, out [T, V])``
    writes the float32 logits of ``T`` new tokens into ``out``; ``hidden(ids, cache)``
    returns their final hidden states ``[T, n_embd]`` in float32, and ``logits`` (the
    speculative loop's path for a draft that reads the target's features) turns them into
    logits through the same head as ``step``, so both paths give the same logits bit for bit.
    ``C`` is ``n_embd``. Unchecked: the loops call it with ids and caches the checked paths
    accepted."""

    def __init__(self, model: Llama):
        self.model = model
        self.C = model.config.n_embd

    def new_cache(self) -> LlamaCache:
        return self.model.new_cache(1)

    def hidden(self, ids: torch.Tensor, cache: LlamaCache, layers: int = 1) -> torch.Tensor:
        if layers != 1:
            raise ValueError("the Llama's step gives the last layer's features only (layers=1)")
        return self.model.decode_hidden(ids[None], cache)[0].float()

    def logits(self, hidden: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The float32 logits ``[T, V]`` of ``hidden`` (``hidden(...)``'s output) into ``out``."""
        return out.copy_(self.model.head(hidden))

    def step(self, ids: torch.Tensor, cache: LlamaCache, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(self.model.head(self.model.decode_hidden(ids[None], cache)[0]))

    def feed(self, ids: torch.Tensor, cache: LlamaCache) -> None:
        self.model.decode_hidden(ids[None], cache)
