"""``CharGPT``: a nanoGPT-style decoder over characters, with a KV cache.

The model holds its weights and nothing derived from them: the speed paths (lean, folded,
NumPy and CUDA-graph steps) are built from it, beside it, by ``specdec_course.fast``."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from .cache import KVCache
from .checks import check_forward, check_generate
from .config import GPTConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout

    def forward(self, x, kv=None, at=None, span=None, mask=None):
        """Attention over ``x [B, T, C]``: causal among its own positions without ``kv``;
        with ``kv = (k, v)`` (one layer's cache buffers ``[B, nh, S, hs]``) the new keys and
        values are written at ``at`` and the queries attend to slots ``0 .. span - 1``
        under ``mask`` (None: all of them). ``at`` is a slice (the next positions: a
        dynamic cache) or an int64 ``[T]`` tensor (slots held on the device: a static
        cache, as CUDA graphs need)."""
        B, T, C = x.shape
        nh = self.n_head
        qkv = self.c_attn(x).view(B, T, 3, nh, C // nh).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if kv is None:
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
            )
        else:
            ck, cv = kv
            if isinstance(at, torch.Tensor):  # slots held in a tensor (no host sync)
                ck.index_copy_(2, at, k)
                cv.index_copy_(2, at, v)
            else:  # the next positions: views written in place
                ck[:, :, at] = k
                cv[:, :, at] = v
            y = F.scaled_dot_product_attention(
                q, ck[:, :, :span], cv[:, :, :span], attn_mask=mask
            )  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, kv=None, at=None, span=None, mask=None):
        """The pre-norm block; the cache arguments are ``CausalSelfAttention``'s."""
        x = x + self.attn(self.ln_1(x), kv, at, span, mask)
        return x + self.mlp(self.ln_2(x))

    def step_params(self) -> tuple:
        """The block's twelve tensors in the order the cached steps read them (norms, attention,
        norm, MLP; weight then bias), as plain references (``fast`` reads them once)."""
        mods = (self.ln_1, self.attn.c_attn, self.attn.c_proj, self.ln_2, self.mlp.c_fc)
        return tuple(t for m in (*mods, self.mlp.c_proj) for t in (m.weight, m.bias))


class CharGPT(nn.Module):
    """nanoGPT-style decoder over characters, with an optional ``KVCache``.

    ``forward(idx)`` is the full causal pass (training); ``forward(idx, cache)`` takes only the
    new tokens and extends the cache. Both return logits ``[B, T, vocab_size]``.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ValueError(f"config must be a GPTConfig; got {type(config).__name__}")
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # Weight tying (Press & Wolf 2017): the output layer reuses the token embedding.
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # GPT-2: scale the residual projections by 1/sqrt(2 * n_layer) at initialisation.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        # Additive causal mask (0 on and below the diagonal, -inf above), sliced per call: a
        # view costs nothing, where building a boolean mask costs ops on every decode step.
        causal = torch.ones(config.block_size, config.block_size, dtype=torch.bool).tril()
        self.register_buffer(
            "_causal_bias",
            torch.zeros(config.block_size, config.block_size).masked_fill(~causal, float("-inf")),
            persistent=False,
        )

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_parameters(self) -> int:
        """All parameters, the tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch_size: int = 1) -> KVCache:
        """An empty ``KVCache`` on this model's device and dtype."""
        w = self.lm_head.weight
        return KVCache(self.config, batch_size, dtype=w.dtype, device=w.device)

    def hidden_states(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Last hidden state after the final LayerNorm, ``[B, T, n_embd]`` (before ``lm_head``).

        Arguments as in ``forward``. Medusa heads read this.
        """
        pos = check_forward(self, idx, cache, attn_mask, position_ids)
        if cache is not None:
            return self.decode_hidden(idx, cache, position_ids, attn_mask)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)

    def decode_hidden(
        self,
        idx: torch.Tensor,
        cache: KVCache,
        pos: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The cached forward, **unchecked**: hidden states ``[B, T, n_embd]`` of new tokens.

        ``idx`` int64 ``[B, T]`` (the new tokens only) extends ``cache`` by ``T`` positions,
        as ``forward(idx, cache)`` does; multiply by ``lm_head.weight`` for the logits.
        ``pos`` (int64 ``[T]``) defaults to the next positions; ``mask`` defaults to causal
        and may be a bool mask (True = may attend) or an additive float bias, of shape
        ``[T, cache.length + T]`` (tree attention passes one). It checks nothing (call it with
        inputs ``forward`` accepted); the arithmetic is the blocks' own (``run_blocks``).
        """
        T = idx.shape[1]
        start, end = cache.length, cache.length + T
        wpe = self.transformer.wpe.weight
        x = self.transformer.wte(idx) + (wpe[start:end] if pos is None else F.embedding(pos, wpe))
        if mask is None:  # one new token sees everything cached; several: causal, offset
            mask = None if T == 1 else self._causal_bias[start:end, :end]
        x = self.run_blocks(x, cache.k, cache.v, slice(start, end), end, mask)
        cache.length = end
        return self.transformer.ln_f(x)

    def run_blocks(self, x, k, v, at, span, mask) -> torch.Tensor:
        """The blocks over ``x [B, T, n_embd]`` with a cache: ``k``, ``v`` the cache's buffers
        ``[n_layer, B, n_head, S, head_dim]``, ``at``, ``span`` and ``mask`` as
        ``CausalSelfAttention.forward`` takes them (``decode_hidden`` and the static and
        ragged steps of ``specdec_course.fast`` call it: the block's arithmetic, once).
        Returns the residual stream after the last block (before ``ln_f``)."""
        for layer, block in enumerate(self.transformer.h):
            x = block(x, (k[layer], v[layer]), at, span, mask)
        return x

    def forward(
        self,
        idx: torch.Tensor,
        cache: KVCache | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        return_hidden: bool = False,
    ):
        """Logits ``[B, T, vocab_size]`` for every position of ``idx``.

        Without ``cache``: ``idx`` ``[B, T]`` is the whole sequence (causal attention).
        With ``cache``: ``idx`` ``[B, T_new]`` holds only the new tokens; they take positions
        ``cache.length .. cache.length + T_new - 1``, attend to the cached ones and to each
        other causally, and the cache grows by ``T_new``. ``attn_mask`` (bool
        ``[T_new, cache.length + T_new]``, True = may attend) and ``position_ids``
        (int64 ``[T_new]``) replace the causal mask and positions, e.g. for tree attention.
        ``return_hidden=True`` returns ``(logits, hidden)`` with ``hidden`` as in
        ``hidden_states``.

        Raises ValueError for inputs ``model.checks.check_forward`` refuses.
        """
        h = self.hidden_states(idx, cache, attn_mask=attn_mask, position_ids=position_ids)
        logits = self.lm_head(h)
        return (logits, h) if return_hidden else logits

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy (nats/char) of ``targets`` under a full forward of ``idx``."""
        if not isinstance(targets, torch.Tensor) or targets.shape != idx.shape:
            raise ValueError("targets must be a tensor of the same shape as idx")
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue ``idx`` ``[B, T]`` by ``max_new_tokens`` sampled ids, using the cache.

        ``temperature=0`` takes the argmax. Returns ``[B, T + max_new_tokens]``. Raises
        ValueError when the result would not fit in ``block_size`` (no sliding window).
        """
        check_generate(self, idx, max_new_tokens, temperature)
        if max_new_tokens == 0:
            return idx.clone()
        cache = self.new_cache(idx.shape[0])
        logits = self(idx, cache)[:, -1]
        out = [idx]
        for i in range(max_new_tokens):
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                probs = F.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            out.append(nxt)
            if i + 1 < max_new_tokens:
                logits = self(nxt, cache)[:, -1]
        return torch.cat(out, dim=1)
