"""``CharGPT``: a nanoGPT-style decoder over characters, with a cached fast path."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from .._validate import check_int, check_token_batch
from ..devices import check_same_device
from .cache import KVCache
from .config import GPTConfig
from .folded import FoldedStep
from .lean import LeanStep


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
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

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def step_params(self) -> tuple:
        """The block's twelve tensors in the order the cached steps read them (norms, attention,
        norm, MLP; weight then bias), as plain references: a module attribute look-up costs
        about a microsecond, and a 1-layer draft step would make a dozen of them."""
        return (
            self.ln_1.weight,
            self.ln_1.bias,
            self.attn.c_attn.weight,
            self.attn.c_attn.bias,
            self.attn.c_proj.weight,
            self.attn.c_proj.bias,
            self.ln_2.weight,
            self.ln_2.bias,
            self.mlp.c_fc.weight,
            self.mlp.c_fc.bias,
            self.mlp.c_proj.weight,
            self.mlp.c_proj.bias,
        )


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
        self.register_buffer("_arange", torch.arange(config.block_size), persistent=False)
        # Additive causal mask (0 on and below the diagonal, -inf above), sliced per call: a
        # view costs nothing, where building a boolean mask costs ops on every decode step.
        causal = torch.ones(config.block_size, config.block_size, dtype=torch.bool).tril()
        self.register_buffer(
            "_causal_bias",
            torch.zeros(config.block_size, config.block_size).masked_fill(~causal, float("-inf")),
            persistent=False,
        )
        # Derived from the weights on first use (_DERIVED): the cached steps' parameters, the
        # input table, the lean step (model.lean), CUDA graphs per role (decoding.graphs).
        self._drop_derived()

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

    def _check_idx(self, idx, cache):
        B, T = check_token_batch(idx)
        w = self.lm_head.weight
        if idx.device != w.device:
            check_same_device("idx", idx.device, "the model", w.device)
        if cache is not None and cache.k.device != w.device:
            check_same_device("the cache", cache.k.device, "the model", w.device)
        V = self.config.vocab_size
        if idx.min() < 0 or idx.max() >= V:
            raise ValueError(f"idx holds ids outside [0, {V}); encode text with the tokenizer")
        start = 0 if cache is None else cache.length
        if start + T > self.config.block_size:
            raise ValueError(
                f"{start} cached + {T} new tokens exceed the context of "
                f"{self.config.block_size} positions (block_size); positions past it were never "
                "trained. Shorten the prompt or generate fewer tokens."
            )
        if cache is not None and cache.batch_size != B:
            raise ValueError(f"cache has batch size {cache.batch_size} but idx has {B} rows")

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
        self._check_idx(idx, cache)
        B, T = idx.shape
        start = 0 if cache is None else cache.length
        if cache is None and (attn_mask is not None or position_ids is not None):
            raise ValueError(
                "attn_mask and position_ids need a cache (pass cache=model.new_cache())"
            )
        if position_ids is None:
            pos = self._arange[start : start + T]
        else:
            pos = position_ids
            if pos.shape[-1] != T or pos.dtype != torch.long:
                raise ValueError(
                    f"position_ids must be int64 with last dim T={T}; "
                    f"got {tuple(pos.shape)} {pos.dtype}"
                )
            if pos.min() < 0 or pos.max() >= self.config.block_size:
                raise ValueError(f"position_ids must lie in [0, {self.config.block_size})")
        if cache is not None:
            mask = None
            if attn_mask is not None:
                if attn_mask.dtype != torch.bool or tuple(attn_mask.shape) != (T, start + T):
                    raise ValueError(
                        f"attn_mask must be bool of shape [T_new, cache.length + T_new] = "
                        f"[{T}, {start + T}]; got {tuple(attn_mask.shape)} {attn_mask.dtype}"
                    )
                mask = attn_mask
            return self.decode_hidden(idx, cache, pos, mask)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)

    # What the cached paths derive from the weights, built on first use: dropped whenever the
    # weights may change, and left out of copies and pickles.
    _DERIVED = ("_fast_params", "_input_table", "_lean", "_folded", "_graphs")

    def _drop_derived(self) -> None:
        for name in self._DERIVED:
            self.__dict__[name] = None

    def train(self, mode: bool = True):
        # Rebuilt on the next cached call: training changes the weights in place.
        self._drop_derived()
        return super().train(mode)

    # Anything that may replace the parameter tensors drops the cached references to them.
    def load_state_dict(self, *args, **kwargs):
        self._drop_derived()
        return super().load_state_dict(*args, **kwargs)

    def _apply(self, *args, **kwargs):
        self._drop_derived()
        return super()._apply(*args, **kwargs)

    def fast_params(self) -> tuple:
        """The parameters of the cached steps, gathered once (``decode_hidden`` and the static
        steps of ``decoding.graphs`` read them): ``(layers, wte, wpe, lnf_w, lnf_b, arange,
        causal)``; dropped when the weights may change (``train``, ``load_state_dict``, ``to``)."""
        if self._fast_params is None:
            self._fast_params = self._collect_fast_params()
        return self._fast_params

    def _collect_fast_params(self):
        # Plain references to every tensor a cached step reads (Block.step_params says why).
        layers = [b.step_params() for b in self.transformer.h]
        tr = self.transformer
        return (
            layers,
            tr.wte.weight,
            tr.wpe.weight,
            tr.ln_f.weight,
            tr.ln_f.bias,
            self._arange,
            self._causal_bias,
        )

    def decode_hidden(
        self,
        idx: torch.Tensor,
        cache: KVCache,
        pos: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        table: torch.Tensor | None = None,
        *,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The cached forward, **unchecked**: hidden states ``[B, T, n_embd]`` of new tokens.

        ``idx`` int64 ``[B, T]`` (the new tokens only) extends ``cache`` by ``T`` positions,
        as ``forward(idx, cache)`` does; multiply by ``lm_head.weight`` for the logits.
        ``pos`` (int64 ``[T]``) defaults to the next positions; ``mask`` defaults to causal
        and may be a bool mask (True = may attend) or an additive float bias, of shape
        ``[T, cache.length + T]`` (tree attention passes one).

        This is the decoding loops' fast path. It checks nothing: ids out of range, a cache
        of another batch size or a context beyond ``block_size`` give wrong numbers or an
        index error, not the clear ``ValueError`` of ``forward``; call it only with inputs
        that ``forward`` has accepted before (same model, same cache, tokens it produced).
        The arithmetic is the blocks' modules' (``Block``, ``CausalSelfAttention``, ``MLP``;
        tests pin the logits equal), written straight-line over the parameters: at batch 1
        a call costs what its few dozen small ops cost to dispatch, and going through the
        modules (hooks, attribute look-ups, dropout calls that do nothing in eval mode)
        doubles that. ``table`` (from :meth:`input_table`) replaces the first layer's
        embedding, LayerNorm and query/key/value projection by one row look-up.

        ``slots`` (int64 ``[B, T]``) writes row ``b``'s keys and values at its own cache
        positions instead of at ``cache.length ..`` for every row, for batches whose rows
        hold different lengths (``model.ragged``); ``pos`` (``[B, T]``) and ``mask`` (``[B,
        1, T, cache.length + T]``) then say where each row is.
        """
        layers, wte, wpe, lnf_w, lnf_b, arange, causal = self.fast_params()
        B, T = idx.shape
        C, nh = self.config.n_embd, self.config.n_head
        start = cache.length
        end = start + T
        first = None  # layer 0's qkv projection, when the table provides it
        if table is not None:  # rows ordered by position, then token
            p = arange[start:end] if pos is None else pos
            flat = (idx + p * self.config.vocab_size).view(-1)
            rows = table.index_select(0, flat).view(B, T, -1)
            x, first = rows[..., :C], rows[..., C:]
        elif pos is None:
            x = F.embedding(idx, wte) + wpe[start:end]
        else:
            x = F.embedding(idx, wte) + F.embedding(pos, wpe)
        if mask is None:
            # One new token attends to everything cached: no mask. Several: causal, offset.
            mask = None if T == 1 else causal[start:end, :end]
        ck, cv = cache.k, cache.v
        rows = None if slots is None else torch.arange(B, device=slots.device)[:, None]
        for layer, (l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, f2w, f2b) in enumerate(layers):
            if first is None:
                first = F.linear(F.layer_norm(x, (C,), l1w, l1b), aw, ab)
            qkv = first.view(B, T, 3, nh, C // nh).permute(2, 0, 3, 1, 4)
            first = None
            if slots is None:
                ck[layer, :, :, start:end] = qkv[1]  # (B, nh, T, hs), written in place
                cv[layer, :, :, start:end] = qkv[2]
            else:  # row b at its own positions slots[b]: (B, T, nh, hs) by advanced indexing
                ck[layer][rows, :, slots] = qkv[1].transpose(1, 2)
                cv[layer][rows, :, slots] = qkv[2].transpose(1, 2)
            y = F.scaled_dot_product_attention(
                qkv[0], ck[layer, :, :, :end], cv[layer, :, :, :end], attn_mask=mask
            )  # (B, nh, T, hs)
            x = x + F.linear(y.transpose(1, 2).reshape(B, T, C), pw, pb)
            x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (C,), l2w, l2b), fw, fb)), f2w, f2b)
        cache.length = end
        return F.layer_norm(x, (C,), lnf_w, lnf_b)

    @torch.no_grad()
    def input_table(self) -> torch.Tensor:
        """``[block_size * vocab_size, 4 * n_embd]``: for every (position, token), row
        ``position * vocab_size + token``, the first layer's input ``x = wte[token] +
        wpe[position]`` and its query/key/value projection ``c_attn(ln_1(x))``, the work of
        the first layer that depends on nothing else.

        One row look-up then replaces four ops of every cached step (``decode_hidden(...,
        table=...)``, ``model.lean.LeanStep``); a draft model, called ``k`` times per
        iteration, gains most. Rows are grouped by position so that a one-token step selects
        ``view(block_size, vocab_size, -1)[position]`` and then its token's row. Built on
        first use and kept (21 MB for the 1-layer draft); rebuilt after the weights change.
        The rows are computed in one batch, so they may differ from a step's own arithmetic
        in the last bit: use it for a draft (whose ``q`` is reported as computed), not where
        two runs must agree bit for bit.
        """
        if self._input_table is None:
            cfg, b = self.config, self.transformer.h[0]
            wte, wpe = self.transformer.wte.weight, self.transformer.wpe.weight
            x = (wpe[:, None, :] + wte[None, :, :]).reshape(-1, cfg.n_embd)
            qkv = b.attn.c_attn(b.ln_1(x))
            self._input_table = torch.cat([x, qkv], dim=1).contiguous()
        return self._input_table

    def lean_step(self) -> LeanStep:
        """This model's ``model.lean.LeanStep`` (the batch-1 cached step every decoding loop
        takes), built on first use and dropped with the input table when the weights change."""
        if self._lean is None:
            with torch.no_grad():  # plain tensors derived from the weights, no autograd graph
                self._lean = LeanStep(self)
        return self._lean

    def draft_step(self):
        """The cheapest batch-1 one-token step of this model as a draft: a one-layer model's
        ``model.folded.FoldedStep`` on a CPU (its cache from its ``new_cache()``), else
        ``lean_step()``; built on first use, dropped when the weights change. Off a CPU the
        lean step is kept: the folded step reads each token back to the host to index its
        table, a sync per step on a GPU (where drafts run as CUDA graphs anyway)."""
        if self.config.n_layer != 1 or self.lm_head.weight.device.type != "cpu":
            return self.lean_step()
        if self._folded is None:
            with torch.no_grad():
                self._folded = FoldedStep(self)
        return self._folded

    def __getstate__(self):
        # Copies and pickles leave the derived caches behind: they are rebuilt on first use.
        return {**super().__getstate__(), **dict.fromkeys(self._DERIVED)}

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

        Raises ValueError for a non-int64 or non-2-D ``idx``, ids outside the vocabulary,
        ``cache.length + T_new > block_size``, or a mask/position of the wrong shape.
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
        check_int(max_new_tokens, "max_new_tokens", minimum=0)
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0; got {temperature!r}")
        self._check_idx(idx, None)
        total = idx.shape[1] + max_new_tokens
        if total > self.config.block_size:
            raise ValueError(
                f"prompt ({idx.shape[1]}) + max_new_tokens ({max_new_tokens}) = {total} exceeds "
                f"block_size {self.config.block_size}; generate fewer tokens"
            )
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


def check_model(model, name: str = "model") -> CharGPT:
    """Return ``model`` if it is a ``CharGPT``, or another decoder whose class declares that it
    has everything the decoding loops read (``course_decoder = True``: ``config.vocab_size``
    and ``block_size``, ``lm_head.weight``, ``new_cache``, ``forward(idx, cache)``,
    ``lean_step``; ``llm.model.Llama``); else ValueError naming the argument."""
    if not isinstance(model, CharGPT) and not getattr(type(model), "course_decoder", False):
        raise ValueError(
            f"{name} must be a CharGPT (e.g. model.load_pretrained('target')); "
            f"got {type(model).__name__}"
        )
    return model
