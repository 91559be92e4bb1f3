"""The batched attention of ``llm.llama``: all of a call's new tokens in one computation that
gives each token the same bits whatever the call's size (``llm.llama``'s docstring says how
and what it costs), and the check that it does on this machine.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from ..devices import native_cpu_kernels

__all__ = ["ATTENTION_MODES", "CHUNK", "KEY_BLOCK", "batched_attention",
           "batched_attention_is_row_invariant", "keys_read"]  # fmt: skip

ATTENTION_MODES = ("batched", "per_token", "fused")
KEY_BLOCK = 128  # the batched path reads keys in whole blocks: one product per block
CHUNK = 16  # the batched path scores at most this many tokens per computation
_MIN_ROWS = 4  # fewer query rows are padded to this many (MKL's product changes below 4)


def keys_read(end: int, block: int) -> int:
    """The keys the batched path reads for a call ending at ``end``: whole blocks."""
    return -(-end // block) * block


@functools.lru_cache(maxsize=256)
def _causal_mask(start: int, T: int, group: int, device: torch.device, block: int):
    """``n`` keys read, ``rows`` query rows and ``mask`` ``[rows, n - start]`` (True at keys
    after the row's token) of the batched path's call of ``T`` tokens at ``start``."""
    n = keys_read(start + T, block)
    rows = max(group * T, _MIN_ROWS)
    tok = torch.arange(rows, device=device) // group
    return n, rows, torch.arange(n - start, device=device)[None, :] > tok[:, None]


def batched_attention(q, ck, cv, start: int) -> torch.Tensor:
    """Attention of the ``T`` new tokens ``q`` ``[B, T, n_kv_head, group, hd]`` at positions
    ``start ..`` over the cache's keys and values ``ck``, ``cv`` ``[B, n_kv_head, capacity,
    hd]`` (written up to ``start + T``, numbers up to the next whole ``KEY_BLOCK``), in one
    computation whose every row is the same bits whatever ``T``: ``[B, T, n_kv_head, group,
    hd]``. The module's docstring says why."""
    B, T, nkv, g, hd = q.shape
    block = KEY_BLOCK
    n, rows, mask = _causal_mask(start, T, g, q.device, block)
    qr = q.new_empty(B, nkv, rows, hd)
    torch.mul(q.transpose(1, 2), hd**-0.5, out=qr[:, :, : g * T].unflatten(2, (T, g)))
    if g * T < rows:  # a one-token call: padded with zero rows
        qr[:, :, g * T :] = 0
    qr, k3, v3 = qr.flatten(0, 1), ck.flatten(0, 1), cv.flatten(0, 1)  # [B * 3, ..]
    s = torch.bmm(qr, k3[:, :n].transpose(1, 2))  # [B * 3, rows, n]
    s[..., start:].masked_fill_(mask, float("-inf"))
    w = torch.softmax(s, dim=-1)
    y = torch.bmm(w[..., :block], v3[:, :block])
    for lo in range(block, n, block):  # one product per block of keys, added in order
        y = torch.baddbmm(y, w[..., lo : lo + block], v3[:, lo : lo + block])
    return y[:, : g * T].unflatten(0, (B, nkv)).unflatten(2, (T, g)).transpose(1, 2)


@functools.cache
def batched_attention_is_row_invariant(n_kv_head: int, group: int, hd: int, device) -> bool:
    """True when :func:`batched_attention` gives each token the same bits in calls of 1 to 16
    tokens on ``device``, with oneDNN on and off (checked once on random numbers, tokens on
    both sides of a block of keys' end: a few milliseconds). ``Llama.finish_loading`` falls
    back to ``"per_token"`` where it does not."""
    g = torch.Generator().manual_seed(0)
    start, T = KEY_BLOCK - 7, 16
    ck, cv = torch.randn(2, 1, n_kv_head, start + T + KEY_BLOCK, hd, generator=g).to(device)
    q = torch.randn(1, T, n_kv_head, group, hd, generator=g).to(device)
    for kernels in (contextlib.nullcontext, native_cpu_kernels):  # oneDNN as it is, then off
        with kernels():
            one = [batched_attention(q[:, i : i + 1], ck, cv, start + i) for i in range(T)]
            for sizes in ([16], [9, 7], [5, 4, 3, 2, 2]):
                i = 0
                for size in sizes:
                    y = batched_attention(q[:, i : i + size], ck, cv, start + i)
                    if not torch.equal(y, torch.cat(one[i : i + size], 1)):
                        return False
                    i += size
    return True
