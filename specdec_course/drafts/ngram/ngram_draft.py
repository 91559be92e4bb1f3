"""``NgramDraft``: the counted n-gram as tables and as a proposer (the package docstring
has the model)."""

from __future__ import annotations

import time
from array import array
from bisect import bisect_right
from collections import OrderedDict

import numpy as np
import torch

from ... import data as D
from ..._validate import check_ids, check_int, check_real
from ...devices import DeviceLike
from ...devices import device as pick_device
from ...sampling import SamplingOptions, process_logits
from ...stats import round_probs
from .counts import _Level

__all__ = ["DEFAULT_ORDER", "DEFAULT_DISCOUNT", "NgramDraft"]

# Chosen by order_sweep on the shipped target (temperature 1, 32 validation windows):
# order 5 has the highest acceptance (0.78; 0.76 at order 4, 0.75 at 6): longer contexts are
# seen too rarely in 1M characters. A discount near 1 helps a little at every order.
DEFAULT_ORDER = 5
DEFAULT_DISCOUNT = 0.9
_PROCESSED_CACHE = 2  # sampling settings whose processed tables are kept (50 MB each)
_NEXT_CACHE = 1 << 18  # memoized row transitions kept (about 25 MB at most)
_VECTOR_ROWS = 16  # propose_rows goes NumPy over the rows from this batch size on


class NgramDraft:
    """A character ``order``-gram draft with exact ``q``, usable as ``speculative_generate``'s
    draft.

    ``NgramDraft()`` counts the shipped corpus's training split with ``DEFAULT_ORDER`` and
    ``DEFAULT_DISCOUNT``; ``text`` (a str in the corpus alphabet) or ``ids`` (1-D int64)
    counts something else. ``probs(context)`` is the full distribution after a context
    (a str or ids), ``batch_probs`` the same for many; ``start / propose / commit`` are the
    proposer interface of ``drafts.proposer``. ``tables=False`` keeps only the counts (for
    measuring many orders: ``batch_probs`` works, drafting does not). ``device`` is where
    the drafting tables live and the ``q`` rows are returned: the target's device (the
    counting itself runs on the CPU; ``probs`` and ``batch_probs`` return CPU tensors).
    Raises ValueError for an order below 1, a discount outside (0, 1), text with characters
    outside the vocabulary, or a device this machine lacks.
    """

    def __init__(
        self,
        order: int = DEFAULT_ORDER,
        discount: float = DEFAULT_DISCOUNT,
        *,
        text: str | None = None,
        ids: torch.Tensor | None = None,
        vocab: str = D.VOCAB,
        tables: bool = True,
        device: DeviceLike = "cpu",
    ):
        t0 = time.perf_counter()
        self.device = pick_device(device)
        check_int(order, "order (characters of context + 1)")
        check_real(discount, "discount", low=0.0, high=1.0, low_open=True, high_open=True)
        self.tokenizer = D.CharTokenizer(vocab)
        self.vocab_size = V = self.tokenizer.vocab_size
        if ids is None:
            if text is None:  # the corpus's training split: validation is never counted
                ids, _ = D.corpus_split(self.tokenizer)
            else:
                ids = self.tokenizer.encode(text)
        ids = check_ids(ids, "ids", V)
        if ids.numel() <= order:
            raise ValueError(f"ids must be 1-D integer ids longer than the order ({order})")
        self.order, self.discount = order, float(discount)
        arr = ids.numpy().astype(np.int64)
        self.levels = [_Level(arr, L, V) for L in range(order)]
        self.trained_on = arr.size
        self.contexts = sum(lv.ctx.size for lv in self.levels)
        if tables:
            self._build_tables()
        self._processed: OrderedDict = OrderedDict()
        self._next: dict[int, int] = {}  # (row, token) -> next row, filled as drafted
        self._transitions: np.ndarray | None = None  # all of them at once (transitions())
        self.build_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------- distributions

    def _dist(self, contexts: np.ndarray, top: int) -> np.ndarray:
        """Interpolated distributions ``[n, V]`` (float64) of contexts of ``top`` characters
        (codes ``[n]``, the most recent character least significant), using levels 0..top."""
        V, d = self.vocab_size, self.discount
        lv0 = self.levels[0]
        c0 = lv0.dense_counts(np.zeros(1, np.int64))[0]
        uni = (np.maximum(c0 - d, 0) + d * lv0.distinct[0] / V) / lv0.total[0]
        P = np.broadcast_to(uni, (contexts.size, V)).copy()
        for lv in self.levels[1 : top + 1]:
            rows, seen = lv.find(contexts % V**lv.L)
            if not seen.any():
                continue
            r = rows[seen]
            lower = P[seen]
            P[seen] = (
                np.maximum(lv.dense_counts(r) - d, 0) + d * lv.distinct[r][:, None] * lower
            ) / lv.total[r][:, None]
        return P

    def _build_tables(self) -> None:
        # One row per context seen at any level, longest contexts first: the look-up tries
        # the longest context, then backs off. Rows are exact binary fractions summing to 1.
        rows, self._index, offset = [], [], 0
        for lv in reversed(self.levels):
            self._index.append(
                (
                    lv.L,
                    self.vocab_size**lv.L,
                    dict(zip(lv.ctx.tolist(), range(offset, offset + lv.ctx.size))),
                )
            )
            rows.append(self._dist(lv.ctx, lv.L))
            offset += lv.ctx.size
        table = round_probs(torch.from_numpy(np.concatenate(rows)))
        del rows  # freed before the sampling tables are built: the build's peak memory
        self._base = self._tables_for(table, self.device)
        self.q_table = self._base[0]  # float32, exact: multiples of 2^-24

    @staticmethod
    def _tables_for(table: torch.Tensor, device: torch.device):
        # What sampling needs per row: the float32 rows the verifier reads, cumulative sums
        # for inverse-CDF draws (exact: every entry is a multiple of 2^-24), the argmax.
        # Cumulative rows as arrays of doubles: bisect on one costs half a microsecond,
        # numpy's searchsorted on a row several (its call overhead, not the search).
        # Summed 8,192 rows at a time, so that no second full-size table is ever held.
        rows, t = [], table.numpy()
        for i in range(0, t.shape[0], 8192):
            cum = np.cumsum(t[i : i + 8192], axis=1)
            cum[:, -1] = 1.0
            rows.extend(array("d", r) for r in cum)
        return table.float().to(device), rows, table.argmax(-1).tolist()  # float32 is exact

    def _row(self, code: int, length: int) -> int:
        """Table row of the longest seen suffix of a context (code of its last ``length``
        characters, most recent least significant)."""
        for L, mod, index in self._index:
            if L <= length:
                r = index.get(code % mod)
                if r is not None:
                    return r
        raise AssertionError("the unigram row is always present")

    def _context(self, ids: list[int]) -> tuple[int, int]:
        """Code and length of the last ``order - 1`` characters of ``ids``."""
        tail = ids[max(0, len(ids) - self.order + 1) :] if self.order > 1 else []
        code = 0
        for t in tail:
            code = code * self.vocab_size + t
        return code, len(tail)

    def probs(self, context) -> torch.Tensor:
        """The full distribution ``q`` (float64 ``[V]``, exact binary, sums to 1) of the next
        character after ``context`` (a str in the vocabulary, or ids)."""
        if isinstance(context, str):
            context = self.tokenizer.encode(context)
        ids = check_ids(context, "context", self.vocab_size).tolist()
        code, length = self._context(ids)
        return round_probs(torch.from_numpy(self._dist(np.array([code]), length)))[0]

    def batch_probs(self, contexts: torch.Tensor) -> torch.Tensor:
        """Distributions ``[n, V]`` (float64, exact binary) after a batch of contexts
        ``[n, order - 1]`` (ids, the most recent last): the rows ``probs`` returns."""
        L = self.order - 1
        ctx = check_ids(contexts, "contexts", self.vocab_size, dim=2)
        if ctx.shape[1] != L:
            raise ValueError(f"contexts must have shape [n, {L}] (order - 1 characters)")
        codes = np.zeros(ctx.shape[0], dtype=np.int64)
        for col in ctx.numpy().T:  # oldest first: the most recent ends least significant
            codes = codes * self.vocab_size + col
        return round_probs(torch.from_numpy(self._dist(codes, L)))

    def _sampling_tables(self, smp: SamplingOptions):
        if smp.greedy or (smp.plain and smp.temperature == 1.0):
            return self._base
        key = (smp.temperature, smp.top_k, smp.top_p)
        if key not in self._processed:
            # Temperature and filters on the n-gram's own log-probabilities, as the target's
            # logits are processed; rounding keeps the sampled distribution exact.
            logq = self.q_table.cpu().clamp_min(1e-38).log()
            q = process_logits(logq, smp.temperature, smp.top_k, smp.top_p).double()
            self._processed[key] = self._tables_for(round_probs(q), self.device)
            if len(self._processed) > _PROCESSED_CACHE:
                self._processed.popitem(last=False)
        self._processed.move_to_end(key)
        return self._processed[key]

    # ------------------------------------------------------------------------ proposer

    def start(self, ids, n, sampling, generator, max_new_tokens, k) -> None:
        self.greedy = sampling.greedy
        self.q32, self.cum, self.argmax = self._sampling_tables(sampling)
        self.uniforms = None
        if not self.greedy and k > 0:
            # float64 uniforms in [0, 1) for the inverse-CDF draws, one block per call.
            shape = (max(max_new_tokens, 1), k)
            where = None if generator is None else generator.device
            u = torch.rand(shape, dtype=torch.float64, generator=generator, device=where)
            self.uniforms = u.tolist()
        self.calls = 0
        # On a CPU the proposal reads and writes through NumPy views (a tensor's slicing and
        # item assignment cost microseconds each); the loop passes the same buffers each time.
        self._host = self.q32.device.type == "cpu"
        self._q_np = self.q32.numpy() if self._host else None
        if self._host and not self.greedy:
            # The q rows of a proposal are copied here as they are drawn (row copies cost
            # less than one gather of a list of rows); q is a view, valid until the next
            # propose, as the loop uses it.
            self._qbuf = torch.empty(max(k, 1), self.vocab_size, dtype=self.q32.dtype)
            self._qbuf_np = self._qbuf.numpy()
            self._qviews = [self._qbuf[:j] for j in range(max(k, 1) + 1)]
        self._views = (None, None, None, None)

    def _np_views(self, ids, out):
        if self._views[0] is not ids or self._views[1] is not out:
            self._views = (ids, out, ids.numpy(), out.numpy())
        return self._views[2], self._views[3]

    def _next_row(self, key: int, code: int, length: int) -> int:
        """Row after appending token ``t`` to a context whose row is ``r`` (``key = r * V +
        t``; the new context's code and length are ``code``, ``length``), looked up and
        memoized: ``propose`` reads the memo itself and calls this on a miss."""
        # Row r is the longest seen suffix s of the context. A seen suffix u + t of the new
        # context makes u a seen context (it occurred before t), so |u| <= |s|: the new row
        # is the longest seen suffix of s + t, whatever came before s.
        if len(self._next) >= _NEXT_CACHE:
            self._next.clear()
        nxt = self._next[key] = self._row(code, length)
        return nxt

    def propose(self, ids, n, k, out):
        V, L = self.vocab_size, self.order - 1
        host = self._host and ids.device.type == "cpu" and out.device.type == "cpu"
        ids_np, out_np = self._np_views(ids, out) if host else (ids, None)
        code, length = self._context(ids_np[max(0, n - L) : n].tolist())
        mod = V**L
        argmax, cum, memo = self.argmax, self.cum, self._next
        u = None if self.uniforms is None else self.uniforms[self.calls]
        self.calls += 1
        keep = host and u is not None  # copy each q row into the buffer as it is drawn
        q_np, qbuf = self._q_np, (self._qbuf_np if keep else None)
        toks, rows = [], []
        r = self._row(code, length)
        for j in range(k):
            t = argmax[r] if u is None else bisect_right(cum[r], u[j])
            toks.append(t)
            if keep:
                qbuf[j] = q_np[r]
            else:
                rows.append(r)
            if j + 1 < k:
                if L:
                    code = (code * V + t) % mod
                    length = min(length + 1, L)
                key = r * V + t
                nxt = memo.get(key)
                r = self._next_row(key, code, length) if nxt is None else nxt
        if host:
            out_np[:k] = toks
            return k, (self._qviews[k] if keep else None)
        out[:k] = torch.tensor(toks, device=out.device)
        return k, (None if u is None else self.q32[rows])

    def commit(self, ids, n) -> None:
        pass  # the counts are fixed: nothing to roll back

    def propose_rows(self, sampling, ids: np.ndarray, n: np.ndarray, K: int, u, toks, rows):
        """``K`` drafts for every row of a batch (``decoding.batched``'s proposal).

        ``ids`` int64 ``[B, ≥ max(n)]`` committed tokens (row ``b`` has ``n[b]``), ``u``
        float64 ``[B, ≥ K]`` uniforms in ``[0, 1)`` for the inverse-CDF draws (``None`` for
        greedy: the row's argmax), ``toks`` / ``rows`` int64 ``[B, ≥ K]`` written with the
        drafts and the table row each was drawn from; the drafts' ``q`` is
        ``self.sampling_rows(sampling)[rows]``, exactly what they were drawn from. The same
        draws as ``propose`` makes for one sequence from the same uniforms.

        From ``_VECTOR_ROWS`` rows on, NumPy over the rows (:meth:`_propose_vector`); below,
        Python per row, whose scalar look-ups cost less than a NumPy call's overhead (in one
        paired probe with a target call between proposals, K = 4: 116 against 139 µs at B =
        8, 212 against 184 at 16, 734 against 316 at 64)."""
        if ids.shape[0] >= _VECTOR_ROWS:
            self._propose_vector(sampling, ids, n, K, u, toks, rows)
            return
        V, L = self.vocab_size, self.order - 1
        _, cum, argmax = self._sampling_tables(sampling)
        memo, mod = self._next, V**L
        for b in range(ids.shape[0]):
            nb = int(n[b])
            code, length = self._context(ids[b, max(0, nb - L) : nb].tolist())
            r = self._row(code, length)
            ub = None if u is None else u[b]
            tb, rb = toks[b], rows[b]
            for j in range(K):
                t = argmax[r] if ub is None else bisect_right(cum[r], ub[j])
                tb[j], rb[j] = t, r
                if j + 1 < K:
                    if L:
                        code = (code * V + t) % mod
                        length = min(length + 1, L)
                    key = r * V + t
                    nxt = memo.get(key)
                    r = self._next_row(key, code, length) if nxt is None else nxt

    def _propose_vector(self, sampling, ids, n, K: int, u, toks, rows) -> None:
        """``propose_rows`` with no Python per row: each row's table row is found by walking
        the row transitions (:meth:`transitions`) from the empty context over its last
        ``order - 1`` characters, and each draft is ``bisect_right`` of the row's cumulative
        sums, counted as the entries ``<= u`` (the same float64 sums of the same exact binary
        entries, so the same tokens)."""
        V, L = self.vocab_size, self.order - 1
        q = self.sampling_rows(sampling)
        nxt = self.transitions()
        B = ids.shape[0]
        flat = nxt.reshape(-1)
        r = np.full(B, nxt.shape[0] - 1, dtype=np.int64)  # the empty context's row
        if L:
            back = np.arange(L, 0, -1)
            pos = n[:, None] - back  # [B, L]: the last L positions, oldest first
            short = int(n.min()) < L  # a row with fewer characters: skip what it lacks
            ctx = np.take_along_axis(ids, np.maximum(pos, 0) if short else pos, 1)
            for j in range(L):
                step = flat.take(r * V + ctx[:, j])
                r = np.where(pos[:, j] >= 0, step, r) if short else step
        for j in range(K):
            qr = q.take(r, axis=0)  # [B, V] float32, exact binary fractions
            if u is None:
                t = qr.argmax(1)
            else:
                c = np.cumsum(qr, axis=1, dtype=np.float64)
                c[:, -1] = 1.0  # as the cumulative tables end
                t = (c <= u[:, j : j + 1]).sum(1)
            toks[:, j], rows[:, j] = t, r
            if j + 1 < K:
                r = flat.take(r * V + t)

    def transitions(self) -> np.ndarray:
        """``[rows, V]`` int32: the table row after appending character ``t`` to row ``r``'s
        context, what ``propose`` looks up one at a time (and memoizes); built on first use
        with NumPy (a second or so, ~17 MB for the shipped tables). By the argument in
        ``_next_row``, the row after ``t`` depends on the row's own context (its longest seen
        suffix) and ``t`` alone. The last row is the empty context's (the unigram)."""
        if self._transitions is None:
            V, top = self.vocab_size, self.order - 1
            lengths = [L for L, _, _ in self._index]  # the rows' order: longest contexts first
            offsets = np.cumsum([0] + [len(index) for _, _, index in self._index])
            blocks = []
            for L in lengths:
                ctx = self.levels[L].ctx
                code = (ctx[:, None] * V + np.arange(V)) % max(V**top, 1)  # 0 for a unigram
                out = np.full(code.shape, -1, dtype=np.int64)
                for L2, offset in zip(lengths, offsets):
                    if L2 <= min(L + 1, top):  # the longest seen suffix of context + t
                        found, seen = self.levels[L2].find(code % V**L2)
                        take = seen & (out < 0)
                        out[take] = offset + found[take]
                blocks.append(out.astype(np.int32))
            self._transitions = np.concatenate(blocks)
        return self._transitions

    def sampling_rows(self, sampling) -> np.ndarray:
        """The float32 ``q`` table (``[rows, V]``, a NumPy view) that drafts under
        ``sampling`` are drawn from: the rows ``propose_rows`` reports."""
        return self._sampling_tables(sampling)[0].cpu().numpy()

    def __repr__(self) -> str:
        return (
            f"NgramDraft(order={self.order}, discount={self.discount}, "
            f"{self.contexts:,} contexts, {self.trained_on:,} training characters)"
        )
