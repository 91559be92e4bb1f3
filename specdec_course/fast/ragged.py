"""Lean steps for a batch whose rows hold different lengths: one cache, positions per row.

Batched speculative decoding accepts a different number of drafts in every row, so after one
iteration row 0 may hold 40 committed tokens and row 1 only 37. ``RaggedSteps`` writes row
``b``'s new tokens at its own slots ``start_b, start_b + 1, ...`` of a shared preallocated
cache, gives them those positions, and lets each new token see exactly the slots ``0 .. its
own position`` of its row. Slots past a row's length hold whatever a rejected draft left
there; the mask hides them and the next call overwrites them (as in gpt-fast, where rollback
costs nothing): the caller keeps the positions. ``OneRowSteps`` gives one row the batch-1
``LeanStep`` behind the same interface; ``batch_steps(model, B)`` picks between them, for the
loops and the benchmark.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ..model import CharGPT, check_model
from .lean import lean_blocks, lean_step

__all__ = ["OneRowSteps", "RaggedSteps", "batch_steps"]


class RaggedSteps:
    """Lean cached steps of ``model`` for ``batch_size`` rows, each row at its own positions.

    What ``fast.lean.LeanStep`` is to batch 1, for a batch: the same blocks
    (``lean.lean_blocks``; layer 0's input and projection from ``fast.derived.input_table``), on
    ``[B * T, n_embd]`` rows. Its own cache holds a layer's keys (and values) token by token,
    ``[B, block_size, n_embd]``, so a call writes them with one ``index_copy_`` each at every
    row's own slots (row ``b * block_size + slot`` of the flattened buffer), and attention reads
    them as ``[B, n_head, span, head_dim]`` views. The caller keeps the positions (the decoding
    loop's committed lengths), so rollback costs nothing at all. The ragged mask is not built
    per call: row ``p`` of the model's additive causal bias (0 up to column ``p``, ``-inf``
    after) is exactly what a token at position ``p`` may see of its row, so a call selects one
    row of it per new token (one ``index_select``).

    ``step(tok, slots, span, out)``: ``tok`` int64 ``[B, T]`` (any strides), ``slots`` int64
    ``[B, T]``, the new tokens' positions (``slots[b, t] = start_b + t``), ``span`` an int
    with ``span > slots.max()`` (the columns attention reads); writes the logits ``[B * T,
    V]`` into ``out`` (``last=True``, one-layer models only: the keys and values of every
    new token, the logits of the last one per row, ``[B, V]``). ``step_shared(tok, start,
    out)``: every row at the same positions ``start ..`` (plain decoding of equal-length
    prompts): slice writes and no mask for one token. ``prefill(ids, start)`` fills
    positions ``start ..`` of every row from ``ids [B, T]``. Unchecked, like
    ``LeanStep``: the decoding loops call it with tokens and positions they checked.
    """

    def __init__(self, model: CharGPT, batch_size: int):
        check_model(model)
        lean = lean_step(model)
        cfg = model.config
        self.lean, self.config, self.B = lean, cfg, batch_size
        self.C, self.nh, self.hs, self.V = lean.C, lean.nh, lean.hs, lean.V
        dt, dev = lean.dtype, lean.device
        S = cfg.block_size
        shape = (cfg.n_layer, batch_size, S, lean.C)
        self.k = torch.zeros(shape, dtype=dt, device=dev)
        self.v = torch.zeros(shape, dtype=dt, device=dev)
        self.k_rows = [self.k[i].view(batch_size * S, lean.C) for i in range(cfg.n_layer)]
        self.v_rows = [self.v[i].view(batch_size * S, lean.C) for i in range(cfg.n_layer)]
        self.base = torch.arange(batch_size, device=dev)[:, None] * S  # row b's first slot
        self.causal = lean.causal  # [S, S] additive: row p lets position p see slots 0 .. p
        self.arange = torch.arange(S, device=dev)

    def _run(self, x, qkv, B, T, write, span, bias):
        # The layers over rows x [B * T, C] (qkv: layer 0's projection, from the table).
        C, nh, hs = self.C, self.nh, self.hs

        def attend(layer, qkv):  # every row's keys and values at its slots, then attention
            if write is not None:
                write(layer, qkv[:, C : 2 * C], qkv[:, 2 * C :])
            y = F.scaled_dot_product_attention(
                qkv[:, :C].view(B, T, nh, hs).transpose(1, 2),
                self.k[layer][:, :span].view(B, span, nh, hs).transpose(1, 2),
                self.v[layer][:, :span].view(B, span, nh, hs).transpose(1, 2),
                attn_mask=bias,
            )  # [B, nh, T, hs]
            return y.transpose(1, 2).reshape(B * T, C)

        x = lean_blocks(self.lean.layers, x, qkv, attend)
        return F.layer_norm(x, (C,), self.lean.lnf_w, self.lean.lnf_b)

    def step(self, tok, slots, span: int, out=None, *, last: bool = False):
        """Logits of ``tok [B, T]`` at ``slots [B, T]`` into ``out`` (see the class docstring)."""
        B, T = tok.shape
        C, lean = self.C, self.lean
        rows = lean.flat.index_select(0, torch.add(tok, slots, alpha=self.V).reshape(-1))
        at = torch.add(self.base, slots).reshape(-1)  # [B * T] rows of the flattened cache
        k_rows, v_rows = self.k_rows, self.v_rows

        def write(layer, k, v):
            k_rows[layer].index_copy_(0, at, k)
            v_rows[layer].index_copy_(0, at, v)

        if last:  # one layer: every token's keys and values from the table, one query
            write(0, rows[:, 2 * C : 3 * C], rows[:, 3 * C :])
            bias = self.causal.index_select(0, slots[:, -1]).view(B, 1, 1, -1)[..., :span]
            r = rows.view(B, T, 4 * C)[:, -1]
            h = self._run(r[:, :C], r[:, C:], B, 1, None, span, bias)
        else:
            bias = self.causal.index_select(0, slots.reshape(-1)).view(B, 1, T, -1)[..., :span]
            h = self._run(rows[:, :C], rows[:, C:], B, T, write, span, bias)
        if out is not None:
            torch.mm(h, lean.w_t, out=out)
        return out

    def step_shared(self, tok, start: int, out):
        """Logits ``[B * T, V]`` of ``tok [B, T]``, every row at positions ``start ..``."""
        B, T = tok.shape
        C, lean = self.C, self.lean
        end = start + T
        rows = lean.flat.index_select(0, (tok + lean.pos_v[start:end]).reshape(-1))
        at = (self.base + self.arange[start:end]).view(-1)  # index_copy_: cheaper than slices
        k_rows, v_rows = self.k_rows, self.v_rows

        def write(layer, k, v):
            k_rows[layer].index_copy_(0, at, k)
            v_rows[layer].index_copy_(0, at, v)

        bias = None if T == 1 else self.causal[start:end, :end]
        h = self._run(rows[:, :C], rows[:, C:], B, T, write, end, bias)
        torch.mm(h, lean.w_t, out=out)
        return out

    def prefill(self, ids: torch.Tensor, start: int = 0) -> None:
        """Fill positions ``start .. start + T - 1`` of every row from ``ids [B, T]``."""
        B, T = ids.shape
        out = torch.empty(B * T, self.V, dtype=self.lean.dtype, device=self.lean.device)
        self.step_shared(ids, start, out)


class OneRowSteps:
    """``RaggedSteps``' interface for one row, on the batch-1 ``LeanStep`` and its cache.

    With one row there is nothing ragged: positions are one number, the cache a batch-1
    ``KVCache``, and ``fast.lean.LeanStep`` (what plain ``generate`` and the batch-1 loop
    take) is the leanest step there is, so the batched loops use it at ``B = 1``, in plain
    decoding and in speculation alike."""

    def __init__(self, model: CharGPT):
        check_model(model)
        self.lean = lean_step(model)
        self.cache = self.lean.new_cache()
        self.V = self.lean.V

    def step(self, tok, slots, span: int, out=None, *, last: bool = False):
        """As ``RaggedSteps.step`` for ``B = 1`` (``span`` is implied by ``slots``)."""
        self.cache.length = int(slots[0, 0])
        if not last:
            self.lean.step(tok[0], self.cache, out)
            return out
        T = tok.shape[1]
        if T > 1:
            self.lean.feed(tok[0, : T - 1], self.cache)
        self.lean.step(tok[0, T - 1 :], self.cache, out)
        return out

    def step_shared(self, tok, start: int, out):
        """Logits ``[T, V]`` of ``tok [1, T]`` at positions ``start ..``."""
        self.cache.length = start
        self.lean.step(tok[0], self.cache, out)
        return out

    def prefill(self, ids: torch.Tensor, start: int = 0) -> None:
        """Fill positions ``start ..`` from ``ids [1, T]``."""
        self.cache.length = start
        self.lean.step(ids[0], self.cache, None)


def batch_steps(model: CharGPT, batch_size: int):
    """The steps the batched loops take for ``batch_size`` rows: ``OneRowSteps`` for one,
    else ``RaggedSteps`` (``bench.batch_call_costs`` times the same ones)."""
    return OneRowSteps(model) if batch_size == 1 else RaggedSteps(model, batch_size)
