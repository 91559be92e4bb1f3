"""Check ``ex03.cached_attention``: cached attention on a batch of ragged rows, one step at a
time, against the package's ``KVCache`` driven by the model's own attention layer.

:class:`_Ragged` and :func:`_compare_step` are the reference and the one-step comparison.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from .._support import as_vector, fmt, random_model
from ..context import case_seed, fresh_cases
from ..core import Case, call_inplace, register
from ._common import ATOL, CFG, LOGIT_ATOL, _lengths_text, _like

# (start lengths of the rows, new tokens per call): equal rows first (lesson 03's case, in a
# batch), then ragged ones, one row near the end of its buffer.
SCHEDULES = {
    "equal lengths, one token at a time": ([0, 0], [1] * 6),
    "equal lengths, a prompt then single tokens": ([0, 0], [6, 1, 1]),
    "ragged lengths, one new token per call": ([5, 0, 2], [1, 1, 1]),
    "ragged lengths, several new tokens per call": ([3, 9], [4, 2, 1]),
    "a row near the end of its buffer": ([1, 18], [3, 2]),
}


class _Ragged:
    """A one-layer package ``CharGPT`` and one ``KVCache`` per row, q/k/v exposed.

    Row ``b`` is its own sequence. The student's buffers ``K``, ``V`` hold row ``b``'s cached
    keys and values in its first ``lengths[b]`` positions and random stale values beyond
    (the drafts a rollback forgot), so attending past a row's own length shows. Each step
    feeds random new token ids to the model's cached forward, row by row (the reference
    logits), and hands the student the same tokens' queries, keys and values; the student's
    attention output is then finished through the same layer and compared logit for logit.
    """

    def __init__(self, seed: int, lengths: list[int]):
        seed = case_seed(seed)  # the visible case, or a fresh one under the batch grader
        # Larger weights than at initialisation: sharp attention, so a wrong mask or scale
        # shows in the logits.
        self.model = random_model(CFG, seed, 4.0)
        self.gen = torch.Generator().manual_seed(seed)
        self.B = len(lengths)
        shape = (self.B, CFG.n_head, CFG.block_size, CFG.head_dim)
        self.K = 3 * torch.randn(shape, generator=self.gen)  # stale values everywhere
        self.V = 3 * torch.randn(shape, generator=self.gen)
        self.caches = [self.model.new_cache(1) for _ in lengths]
        for b, n in enumerate(lengths):
            if n:
                with torch.no_grad():
                    self.model(self._ids(n), self.caches[b])
                self.K[b, :, :n] = self.caches[b].k[0, 0, :, :n]
                self.V[b, :, :n] = self.caches[b].v[0, 0, :, :n]

    def _ids(self, n: int) -> torch.Tensor:
        return torch.randint(0, CFG.vocab_size, (1, n), generator=self.gen)

    @property
    def lengths(self) -> torch.Tensor:
        return torch.tensor([c.length for c in self.caches], dtype=torch.long)

    def step(self, T_new: int):
        """New ``(q, k, v)`` of every row and the package's logits for the same new tokens."""
        m, block = self.model, self.model.transformer.h[0]
        xs, qkv, expected = [], [], []
        for cache in self.caches:
            idx, start = self._ids(T_new), cache.length
            with torch.no_grad():
                expected.append(m(idx, cache)[0])  # the package's cached forward
                x = m.transformer.wte(idx) + m.transformer.wpe.weight[start : start + T_new]
                qkv.append(block.attn.c_attn(block.ln_1(x))[0])
            xs.append(x[0])
        self.x = torch.stack(xs)  # [B, T_new, C]
        q, k, v = torch.stack(qkv).split(CFG.n_embd, dim=2)
        q, k, v = (
            t.view(self.B, T_new, CFG.n_head, CFG.head_dim).transpose(1, 2).contiguous()
            for t in (q, k, v)
        )
        return q, k, v, torch.stack(expected)

    def finish(self, y):
        """The student's per-head attention output ``y``, through the rest of the model."""
        m = self.model
        block = m.transformer.h[0]
        B, _, T, _ = y.shape
        with torch.no_grad():
            x = self.x + block.attn.c_proj(y.float().transpose(1, 2).reshape(B, T, CFG.n_embd))
            x = x + block.mlp(block.ln_2(x))
            return m.lm_head(m.transformer.ln_f(x))


def _attend(q, K, V, ends_q, limit):
    # Attention of each row's new queries over its buffer, query i seeing keys j <= ends_q[b] + i
    # and j < limit[b] (diagnosis only: the mistakes a check names).
    B, _, T, hs = q.shape
    S = K.shape[2]
    att = q.double() @ K.double().transpose(-2, -1) / math.sqrt(hs)  # [B, nh, T, S]
    j = torch.arange(S)
    allowed = (j <= (ends_q[:, None] + torch.arange(T))[:, :, None]) & (j < limit[:, None, None])
    att = att.masked_fill(~allowed[:, None], float("-inf")).softmax(-1)
    return att @ V.double()


def _diagnose_attention(y, q, K, V, lengths, T_new) -> str:
    """What a wrong ``y`` probably means, from the mistakes it matches (else a general word)."""
    end = lengths + T_new
    top = torch.full_like(lengths, int(end.max()))
    wrong = {
        "shared": _attend(q, K, V, torch.full_like(lengths, int(lengths.max())), top),
        "first": _attend(q, K, V, torch.full_like(lengths, int(lengths[0])), top),
        "origin": _attend(q, K, V, lengths * 0, end),
        "all_new": _attend(q, K, V, end - 1, end),
    }

    def close(x):
        return torch.allclose(y.double(), x, atol=1e-4)

    ragged = bool((lengths != lengths[0]).any())
    if ragged and (close(wrong["shared"]) or close(wrong["first"])):
        return (
            "every row attends as if it had the same length: the shorter rows see stale "
            "positions past their own length"
        )
    if T_new > 1 and close(wrong["all_new"]):
        return "a new token sees the new tokens after it"
    if close(wrong["origin"]):
        return (
            "the causal mask is aligned to position 0 (as is_causal=True does); the new "
            "tokens of row b sit at positions lengths[b], lengths[b] + 1, ..."
        )
    if ragged:
        return (
            "wrong output on a ragged batch: each row must attend to its own filled positions "
            "and its new tokens up to itself, nothing else"
        )
    return "wrong output (the mask, the scale, or the softmax axis?)"


def _compare_step(label, fn, ref: _Ragged, T_new: int):
    """One step of the student's attention against the package's; ``None`` or the failure."""
    lengths = ref.lengths
    q, k, v, expected = ref.step(T_new)
    out, after = call_inplace(label, fn, q, k, v, ref.K, ref.V, lengths)
    K_after, V_after, lengths_in = after[3:]
    if not all(_like(a, b) for a, b in ((K_after, ref.K), (V_after, ref.V))):
        return Case(
            label,
            False,
            "K and V kept as buffers of their shape and dtype",
            "K or V replaced",
            "write the new keys and values into the caller's K and V (in place)",
        )
    ref.K, ref.V = K_after, V_after  # the student's buffers, as their code left them
    if not (isinstance(out, tuple) and len(out) == 2):
        return Case(
            label,
            False,
            "(y, new_lengths)",
            fmt(out),
            "return a pair: the attention output and the new lengths",
        )
    y, new_lengths = out
    want = lengths + T_new
    got_len = as_vector(new_lengths)
    if got_len is None or got_len.shape != want.shape or not torch.equal(got_len, want.double()):
        return Case(
            label,
            False,
            f"new lengths {_lengths_text(want)}",
            fmt(new_lengths),
            "every row grows by the number of new tokens, each from its own length",
        )
    if not _like(lengths_in, lengths) or not torch.equal(lengths_in, lengths):
        return Case(
            label,
            False,
            f"lengths {_lengths_text(lengths)} unchanged",
            f"changed in place to {_lengths_text(lengths_in)}",
            "your function changed the caller's lengths in place; return new ones",
        )
    y = as_vector(y)
    shape = (ref.B, CFG.n_head, T_new, CFG.head_dim)
    if y is None or tuple(y.shape) != shape:
        return Case(
            label,
            False,
            f"y of shape {shape}",
            fmt(None if y is None else tuple(y.shape)),
            "y holds one output per row and new token: [B, n_head, T_new, head_dim]",
        )
    for b, cache in enumerate(ref.caches):
        end = cache.length
        if not torch.allclose(
            ref.K[b, :, :end].double(), cache.k[0, 0, :, :end].double(), atol=ATOL
        ) or not torch.allclose(
            ref.V[b, :, :end].double(), cache.v[0, 0, :, :end].double(), atol=ATOL
        ):
            ragged = bool((lengths != lengths[0]).any())
            return Case(
                label,
                False,
                f"row {b}: K, V hold its {end} positions so far",
                "the buffers differ from the package's KVCache",
                f"row {b}'s new keys and values belong at its own length, {int(lengths[b])}"
                if ragged
                else "the new keys and values were not written into the caller's K and V "
                "(in place) after the filled positions",
            )
    got = ref.finish(y)
    diff = (got - expected).abs().max().item()
    if not diff <= LOGIT_ATOL:  # (NaN fails too)
        row = int((got - expected).abs().amax(dim=(1, 2)).argmax())
        return Case(
            label,
            False,
            f"row {row}: {fmt(expected[row, -1])}",
            fmt(got[row, -1]),
            f"largest difference {diff:.2e} (row {row}, length {int(lengths[row])}); "
            + _diagnose_attention(y, q, ref.K, ref.V, lengths, T_new),
        )
    return None


@register(
    "ex03.cached_attention",
    points=6,
    needs="cached_attention",
    title="cached attention on a batch of ragged rows",
    hint="treat each row as lesson 03's single sequence with its own length: where its new "
    "keys go, which positions each of its new tokens may see. The buffers past a row's "
    "length are not zeros but stale keys; a mask built for one shared length lets the "
    "shorter rows see them. Lesson 03, section 4",
)
def check_cached_attention(fn) -> Iterator[Case]:
    schedules = dict(SCHEDULES)
    if fresh_cases():  # the batch grader's: ragged lengths drawn for this run
        g = torch.Generator().manual_seed(case_seed(40))
        schedules["random ragged lengths"] = (
            torch.randint(0, 12, (4,), generator=g).tolist(),
            [2, 1, 3],
        )
    for seed, (name, (start, sizes)) in enumerate(schedules.items()):
        ref = _Ragged(seed, start)
        failed = None
        for i, n in enumerate(sizes):
            label = f"{name}: call {i + 1} (lengths {_lengths_text(ref.lengths)}, {n} new)"
            failed = _compare_step(label, fn, ref, n)
            if failed is not None:
                break
        yield failed or Case(
            f"{name} (lengths {_lengths_text(start)}, {'+'.join(map(str, sizes))} new)", True
        )
