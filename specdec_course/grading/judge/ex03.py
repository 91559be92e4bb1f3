"""Checks of exercise 03: cached attention on a batch of ragged rows, their rollback, and α.

Students implement, in ``exercises/ex03_char_lm.ipynb``:

- ``cached_attention(q, k, v, K, V, lengths)``: ``q, k, v`` ``[B, nh, T_new, hs]`` for the new
  tokens, ``K, V`` ``[B, nh, block_size, hs]`` preallocated buffers, ``lengths`` int64 ``[B]``:
  row ``b`` has its first ``lengths[b]`` positions filled (rows differ: after a rollback each
  kept its own accepted drafts) and stale values beyond. Write row ``b``'s ``k, v`` at
  ``lengths[b] .. lengths[b] + T_new - 1`` (in place), let its new token ``i`` attend to its
  positions ``0 .. lengths[b] + i`` only, and return ``(y, lengths + T_new)``;
- ``rollback(K, V, lengths, num_rejected)``: row ``b`` forgets its last ``num_rejected[b]``
  positions; return the new lengths (a new tensor) without touching the buffers; a
  ``ValueError`` unless ``0 <= num_rejected[b] <= lengths[b]`` for every row;
- ``measure_alpha(target, draft, x, lengths, temperature)``: the mean over the *text*
  positions of the padded windows ``x`` ``[N, T]`` (row ``n`` holds ``lengths[n]`` tokens, then
  padding) of ``sum(min(p, q))``, ``p`` and ``q`` the two models' next-token distributions at
  ``temperature`` (0: one-hot argmax, so α is the argmax agreement); every text position
  counts once, so a longer row weighs more.

Lesson 03 writes cached attention for one shared length and measures α over full windows;
the ragged batch (one length per row, stale keys past the shorter rows; windows padded to
one length) is this exercise's variation, which the lesson's cells fail. The reference is the
package: one :class:`specdec_course.model.KVCache` per row, driven by the model's own
attention layer, and :func:`specdec_course.train.next_token_probs`. Everything is exact
arithmetic on random inputs (no sampling): logits compared to 1e-4, α and buffers to 1e-5.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from specdec_course.model import CharGPT, GPTConfig, load_pretrained
from specdec_course.train import next_token_probs

from ._support import as_number, as_vector, fmt, random_model
from .context import case_seed, fresh_cases
from .core import Case, call, call_inplace, register

PUBLIC_IMPLEMENTATIONS: tuple[str, ...] = ()
ALLOWED = {
    "specdec_course.model.CharGPT": "the model whose attention the exercise re-derives",
    "specdec_course.model.GPTConfig": "the model's configuration",
    "specdec_course.model.load_pretrained": "the lesson's trained model",
    "specdec_course.train.next_token_probs": "the model's probabilities, for measure_alpha",
    "specdec_course.data.CharTokenizer": "data",
    "specdec_course.data.corpus_split": "data",
    "specdec_course.data.eval_windows": "data",
}

ATOL = 1e-5
# Logits of the check's model reach about 4; float32 reordering moves them by about 1e-6,
# a wrong mask or scale by more than 0.1.
LOGIT_ATOL = 1e-4
CFG = GPTConfig(vocab_size=13, block_size=24, n_layer=1, n_head=2, n_embd=12)
# (start lengths of the rows, new tokens per call): equal rows first (lesson 03's case, in a
# batch), then ragged ones, one row near the end of its buffer.
SCHEDULES = {
    "equal lengths, one token at a time": ([0, 0], [1] * 6),
    "equal lengths, a prompt then single tokens": ([0, 0], [6, 1, 1]),
    "ragged lengths, one new token per call": ([5, 0, 2], [1, 1, 1]),
    "ragged lengths, several new tokens per call": ([3, 9], [4, 2, 1]),
    "a row near the end of its buffer": ([1, 18], [3, 2]),
}


def _lengths_text(lengths) -> str:
    return "[" + ", ".join(str(int(n)) for n in lengths) + "]"


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


def _like(a, b: torch.Tensor) -> bool:
    """``a`` is a tensor of ``b``'s shape and dtype (what an in-place output must stay)."""
    return isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype


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
    points=4,
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


def _bad_rollback(rollback, K, V, lengths, rejected) -> Case:
    name = f"rollback with lengths {_lengths_text(lengths)}, {_lengths_text(rejected)} rejected"
    try:
        rollback(K, V, lengths.clone(), rejected.clone())
    except ValueError:
        return Case(f"{name} raises ValueError", True)
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - the wrong kind of error is a failed case
        return Case(
            f"{name} raises ValueError",
            False,
            "ValueError",
            type(e).__name__,
            "raise ValueError for a row that cannot be rolled back",
        )
    return Case(
        f"{name} raises ValueError",
        False,
        "ValueError",
        "no error",
        "a row cannot forget more positions than it holds, nor a negative number: that "
        "call must raise ValueError",
    )


@register(
    "ex03.rollback",
    points=2,
    needs=("cached_attention", "rollback"),
    title="rolling ragged rows back after verification",
    hint="each row forgets its own rejected positions, and a forgotten position needs no "
    "clearing: the next step overwrites it, provided every row's length says where its "
    "cache ends",
)
def check_rollback(attend, rollback) -> Iterator[Case]:
    cases = [
        ("nothing, some and everything rejected", [0, 0, 0], 8, [0, 3, 8]),
        ("ragged rows", [2, 6, 0], 5, [1, 5, 0]),
        ("equal rows, equal rollback", [4, 4], 3, [2, 2]),
    ]
    for seed, (name, start, fed, rejected) in enumerate(cases):
        ref = _Ragged(10 + seed, start)
        failed = _compare_step(f"{name}: before the rollback", attend, ref, fed)
        if failed is not None:
            yield failed
            return
        lengths, r = ref.lengths, torch.tensor(rejected)
        K_before, V_before = ref.K.clone(), ref.V.clone()
        label = f"{name}: rollback(K, V, {_lengths_text(lengths)}, {_lengths_text(r)})"
        raw, after = call_inplace(label, rollback, ref.K, ref.V, lengths, r)
        got = as_vector(raw)
        K_after, V_after, lengths_in, r_in = after
        want = lengths - r
        if got is None or got.shape != want.shape or not torch.equal(got, want.double()):
            msg = "the new lengths are wrong"
            if got is not None and got.shape == want.shape:
                if torch.equal(got, r.double()):
                    msg = "you returned the numbers rejected; return each row's new length"
                elif torch.equal(got, lengths.double()):
                    msg = "the lengths did not change: nothing was rolled back"
                elif torch.equal(got, (lengths + r).double()):
                    msg = "a rollback shortens each row by what it rejected; yours grew"
            yield Case(label, False, f"new lengths {_lengths_text(want)}", fmt(got), msg)
            return
        if not (
            _like(lengths_in, lengths)
            and _like(r_in, r)
            and torch.equal(lengths_in, lengths)
            and torch.equal(r_in, r)
        ):
            yield Case(
                label,
                False,
                "lengths and num_rejected unchanged",
                "changed in place",
                "your rollback changed the caller's lengths or num_rejected; return new lengths",
            )
            return
        if not (
            _like(K_after, K_before)
            and _like(V_after, V_before)
            and torch.equal(K_after, K_before)
            and torch.equal(V_after, V_before)
        ):
            yield Case(
                label,
                False,
                "K and V unchanged",
                "the buffers changed",
                "a rollback moves the lengths only: no copying, no zeroing",
            )
            return
        for cache, n in zip(ref.caches, want.tolist()):
            cache.crop(n)  # the package's rollback, row by row
        failed = _compare_step(f"{name}: the step after the rollback", attend, ref, 2)
        yield failed or Case(
            f"{name}: rolled back to {_lengths_text(want)}, the next step equals the package", True
        )
    ref = _Ragged(99, [0, 0, 0])
    lengths = torch.tensor([8, 8, 8])
    for bad in ([0, 9, 0], [-1, 0, 0]):
        yield _bad_rollback(rollback, ref.K, ref.V, lengths, torch.tensor(bad))


def _alpha(target, draft, x, lengths, temperature) -> float:
    p = next_token_probs(target, x, temperature)
    q = next_token_probs(draft, x, temperature)
    overlap = p.minimum(q).sum(-1)  # [N, T]
    text = torch.arange(x.shape[1])[None, :] < lengths[:, None]
    return overlap[text].mean().item()


def _alpha_wrong(target, draft, x, lengths, temperature) -> dict[str, float]:
    """What the usual mistakes return: padding counted, or each row averaged first."""
    p = next_token_probs(target, x, temperature)
    q = next_token_probs(draft, x, temperature)
    overlap = p.minimum(q).sum(-1)
    per_row = torch.stack([overlap[n, : int(lengths[n])].mean() for n in range(x.shape[0])])
    return {"all": overlap.mean().item(), "rows": per_row.mean().item()}


def _tiny(seed: int) -> CharGPT:
    return random_model(CFG, case_seed(seed), 8.0)  # far from uniform outputs


@register(
    "ex03.measure_alpha",
    points=4,
    needs="measure_alpha",
    title="acceptance rate between two models, over padded windows of text",
    hint="at every text position of every window, each model gives one next-token "
    "distribution at the temperature; α is the overlap of the two, averaged over those "
    "positions (lesson 02, section 1). Which positions are text, and does each of them count "
    "the same? At temperature 0 each distribution is a one-hot on its argmax, which no "
    "division reaches",
)
def check_measure_alpha(fn) -> Iterator[Case]:
    a, b = _tiny(1), _tiny(2)
    T = CFG.block_size
    x = torch.randint(
        0,
        CFG.vocab_size,
        (3, T),
        generator=torch.Generator().manual_seed(case_seed(0)),
    )
    full = torch.full((3,), T)
    ragged = torch.tensor([T, 7, 1])  # a full window, a short one, a single token
    cases = [
        ("a model with itself", a, a, full, 1.0),
        ("two models, full windows, T = 1", a, b, full, 1.0),
        ("padded windows (lengths 24, 7, 1), T = 1", a, b, ragged, 1.0),
        ("padded windows, T = 0.5", a, b, ragged, 0.5),
        ("padded windows, T = 2", a, b, ragged, 2.0),
        ("padded windows, T = 0: argmax agreement", a, b, ragged, 0.0),
    ]
    if fresh_cases():  # the batch grader's: lengths drawn for this run
        g = torch.Generator().manual_seed(case_seed(5))
        drawn = torch.randint(1, T + 1, (3,), generator=g)
        cases.append((f"padded windows, lengths {drawn.tolist()}, T = 1", a, b, drawn, 1.0))
    for name, t, d, lengths, temp in cases:
        exp = _alpha(t, d, x, lengths, temp)
        got = as_number(call(name, fn, t, d, x, lengths.clone(), temp))
        ok = got is not None and abs(got - exp) <= ATOL
        msg = ""
        if not ok:
            wrong = _alpha_wrong(t, d, x, lengths, temp)
            if got is None or got != got:
                msg = "no number (NaN?): at T = 0 the logits cannot be divided by the temperature"
            elif temp != 1.0 and abs(got - _alpha(t, d, x, lengths, 1.0)) <= ATOL:
                msg = "your α is the one at temperature 1: the temperature was not applied"
            elif abs(got - (1 - exp)) <= ATOL:
                msg = "you returned the TV distance, which is 1 - α"
            elif abs(got - wrong["all"]) <= ATOL:
                msg = (
                    "you averaged over the padding too: row n holds lengths[n] tokens of text, "
                    "and the positions after them are not text"
                )
            elif abs(got - wrong["rows"]) <= ATOL:
                msg = (
                    "you averaged each row, then the rows: every text position counts once, "
                    "so a row of 24 tokens weighs 24 times a row of one"
                )
            else:
                msg = "wrong α: is it the overlap of p and q, averaged over every text position?"
        yield Case(name, ok, f"{exp:.6g}", fmt(got), msg)
    try:
        target, draft = load_pretrained("target"), load_pretrained("draft")
    except (FileNotFoundError, ValueError):
        return  # no shipped pair here: the random models above decide
    from specdec_course import data

    val = data.corpus_split(data.CharTokenizer(target.vocab))[1]
    xv, _ = data.eval_windows(val, target.config.block_size, 2)
    lv = torch.tensor([target.config.block_size, 100])
    exp = _alpha(target, draft, xv, lv, 1.0)
    got = as_number(call("the shipped pair", fn, target, draft, xv, lv.clone(), 1.0))
    ok = got is not None and abs(got - exp) <= ATOL
    yield Case(
        f"the shipped pair, two validation windows of {lv[0].item()} and {lv[1].item()} tokens",
        ok,
        f"{exp:.6g}",
        fmt(got),
        "" if ok else "wrong α on the shipped pair, though right on the small models",
    )
