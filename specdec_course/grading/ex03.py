"""Checks of exercise 03: one step of cached attention, rollback, and α between two models.

Students implement, in ``exercises/ex03_char_lm.ipynb``:

- ``cached_attention(q, k, v, K, V, length)``: ``q, k, v`` ``[B, nh, T_new, hs]`` for the new
  tokens, ``K, V`` ``[B, nh, block_size, hs]`` preallocated buffers whose first ``length``
  positions are filled. Write ``k, v`` at ``length .. length + T_new - 1`` (in place), let new
  token ``i`` attend to positions ``0 .. length + i``, and return ``(y, length + T_new)`` with
  ``y`` ``[B, nh, T_new, hs]``;
- ``crop(K, V, length, n)``: roll back to the first ``n`` positions: return ``n`` without
  copying or changing the buffers; a ``ValueError`` unless ``0 <= n <= length``;
- ``measure_alpha(target, draft, x, temperature)``: the mean over every position of the
  windows ``x`` ``[N, T]`` of ``sum(min(p, q))``, ``p`` and ``q`` the two models' next-token
  distributions at ``temperature`` (0: one-hot argmax, so α is the argmax agreement).

The reference is the package: :class:`specdec_course.model.KVCache` driven by the model's own
attention layer, and :func:`specdec_course.train.next_token_probs`. Everything is exact
arithmetic on random inputs (no sampling): logits compared to 1e-4, α and buffers to 1e-5.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from specdec_course.model import CharGPT, GPTConfig, load_pretrained
from specdec_course.train import next_token_probs

from ._support import as_number, as_vector, fmt, random_model
from .context import case_seed
from .core import Case, call, register

ATOL = 1e-5
# Logits of the check's model reach about 4; float32 reordering moves them by about 1e-6,
# a wrong mask or scale by more than 0.1.
LOGIT_ATOL = 1e-4
CFG = GPTConfig(vocab_size=13, block_size=24, n_layer=1, n_head=2, n_embd=12)
SCHEDULES = {
    "one token at a time": [1] * 8,
    "a prompt, then single tokens": [6, 1, 1, 1],
    "mixed chunks": [3, 1, 4, 2, 1],
    "the whole context in two calls": [20, 4],
}


class _Reference:
    """A one-layer package ``CharGPT`` decoding with its ``KVCache``, q/k/v exposed.

    Each step feeds random new token ids to the model's own cached forward (the reference
    logits) and hands the student the same tokens' queries, keys and values; the student's
    attention output is then finished through the same layer (output projection, MLP, final
    norm, ``lm_head``) and compared logit for logit.
    """

    def __init__(self, seed: int, batch: int = 2):
        seed = case_seed(seed)  # the visible case, or a fresh one under the batch grader
        # Larger weights than at initialisation: sharp attention, so a wrong mask or scale
        # shows in the logits.
        self.model = random_model(CFG, seed, 4.0)
        self.cache = self.model.new_cache(batch)
        self.gen = torch.Generator().manual_seed(seed)
        self.B = batch
        self.K = torch.zeros(batch, CFG.n_head, CFG.block_size, CFG.head_dim)
        self.V = torch.zeros_like(self.K)

    def step(self, T_new: int):
        """New ``(q, k, v)`` and the package's logits for the same new tokens."""
        idx = torch.randint(0, CFG.vocab_size, (self.B, T_new), generator=self.gen)
        m, start = self.model, self.cache.length
        block = m.transformer.h[0]
        with torch.no_grad():
            expected = m(idx, self.cache)  # the package's cached forward; extends its cache
            self.x = m.transformer.wte(idx) + m.transformer.wpe.weight[start : start + T_new]
            q, k, v = block.attn.c_attn(block.ln_1(self.x)).split(CFG.n_embd, dim=2)
        q, k, v = (
            t.view(self.B, T_new, CFG.n_head, CFG.head_dim).transpose(1, 2).contiguous()
            for t in (q, k, v)
        )
        return q, k, v, expected

    def finish(self, y):
        """The student's per-head attention output ``y``, through the rest of the model."""
        m = self.model
        block = m.transformer.h[0]
        B, _, T, _ = y.shape
        with torch.no_grad():
            x = self.x + block.attn.c_proj(y.float().transpose(1, 2).reshape(B, T, CFG.n_embd))
            x = x + block.mlp(block.ln_2(x))
            return m.lm_head(m.transformer.ln_f(x))


def _compare_step(label, fn, ref: _Reference, length: int, T_new: int):
    q, k, v, expected = ref.step(T_new)
    out = call(label, fn, q, k, v, ref.K, ref.V, length)
    if not (isinstance(out, tuple) and len(out) == 2):
        return None, Case(
            label,
            False,
            "(y, new_length)",
            fmt(out),
            "the function must return a pair: the attention output and the new length",
        )
    y, new_len = out
    y = as_vector(y)
    if as_number(new_len) != length + T_new:
        return None, Case(
            label,
            False,
            f"new length {length + T_new}",
            fmt(new_len),
            "the new length is not the old one grown by the new tokens",
        )
    shape = (ref.B, CFG.n_head, T_new, CFG.head_dim)
    if y is None or tuple(y.shape) != shape:
        return None, Case(
            label,
            False,
            f"y of shape {shape}",
            fmt(None if y is None else tuple(y.shape)),
            "y holds one output per new token: [B, n_head, T_new, head_dim]",
        )
    end = length + T_new
    if not torch.allclose(
        ref.K[:, :, :end].double(), ref.cache.k[0, :, :, :end].double(), atol=ATOL
    ) or not torch.allclose(
        ref.V[:, :, :end].double(), ref.cache.v[0, :, :, :end].double(), atol=ATOL
    ):
        return None, Case(
            label,
            False,
            "K, V hold the keys/values of every position so far",
            "buffers differ from the package's KVCache",
            "the buffers K, V do not hold the new keys and values at the new positions "
            "(in place: the caller keeps the buffers)",
        )
    got = ref.finish(y)
    diff = (got - expected).abs().max().item()
    if diff > LOGIT_ATOL:
        msg = (
            "a single new token sees every cached position: does a mask hide some of "
            "them, or are the scores scaled wrong?"
        )
        if T_new > 1:
            msg = (
                "with several new tokens, token i may see positions 0 .. length + i only "
                "(is the mask aligned to the cache's positions?)"
            )
        return None, Case(
            label,
            False,
            fmt(expected[0, -1]),
            fmt(got[0, -1]),
            f"largest difference {diff:.2e}; {msg}",
        )
    return end, None


@register(
    "ex03.cached_attention",
    points=4,
    needs="cached_attention",
    title="one step of cached attention",
    hint="work out, for new token i, which cached positions it may see; lesson 03, "
    "section 4, draws the scores of a cached step. Where in the buffers do the new keys go?",
)
def check_cached_attention(fn) -> Iterator[Case]:
    for seed, (name, sizes) in enumerate(SCHEDULES.items()):
        ref = _Reference(seed)
        length, failed = 0, None
        for i, n in enumerate(sizes):
            label = f"{name}: call {i + 1} (length {length}, {n} new)"
            length, failed = _compare_step(label, fn, ref, length, n)
            if failed is not None:
                break
        yield failed or Case(f"{name} ({'+'.join(map(str, sizes))} tokens)", True)


@register(
    "ex03.crop",
    points=2,
    needs=("cached_attention", "crop"),
    title="rolling the cache back with crop",
    hint="what happens to the positions past the new length at the next step? Which "
    "lengths can a cache of `length` positions be cropped to?",
)
def check_crop(attend, crop) -> Iterator[Case]:
    for n in (0, 3, 7, 8):
        ref = _Reference(10 + n)
        length = 0
        for T_new in (5, 3):
            length, failed = _compare_step(f"before crop({n})", attend, ref, length, T_new)
            if failed is not None:
                yield failed
                return
        K_before, ptr = ref.K.clone(), ref.K.data_ptr()
        got = call(f"crop(K, V, {length}, {n})", crop, ref.K, ref.V, length, n)
        if as_number(got) != n:
            yield Case(
                f"crop(K, V, 8, {n}) returns {n}",
                False,
                str(n),
                fmt(got),
                "crop must return the new length",
            )
            continue
        if ref.K.data_ptr() != ptr or not torch.equal(ref.K, K_before):
            yield Case(
                f"crop({n}) leaves the buffers alone",
                False,
                "K unchanged",
                "K changed",
                "the buffers changed: a rollback moves the length only",
            )
            continue
        ref.cache.crop(n)  # the package's rollback
        _, failed = _compare_step(f"step after crop({n})", attend, ref, n, 2)
        yield failed or Case(f"crop(K, V, 8, {n}), then a step equals the package", True)
    ref = _Reference(99)
    for bad in (-1, 9):
        try:
            crop(ref.K, ref.V, 8, bad)
        except ValueError:
            yield Case(f"crop(K, V, 8, {bad}) raises ValueError", True)
        except Exception as e:  # noqa: BLE001 - the wrong kind of error is a failed case
            yield Case(
                f"crop(K, V, 8, {bad}) raises ValueError",
                False,
                "ValueError",
                type(e).__name__,
                "the wrong kind of error for a length the cache cannot hold",
            )
        else:
            yield Case(
                f"crop(K, V, 8, {bad}) raises ValueError",
                False,
                "ValueError",
                "no error",
                "a length the cache cannot hold must raise ValueError",
            )


def _alpha(target, draft, x, temperature) -> float:
    p = next_token_probs(target, x, temperature)
    q = next_token_probs(draft, x, temperature)
    return p.minimum(q).sum(-1).mean().item()


def _tiny(seed: int) -> CharGPT:
    return random_model(CFG, case_seed(seed), 8.0)  # far from uniform outputs


@register(
    "ex03.measure_alpha",
    points=4,
    needs="measure_alpha",
    title="acceptance rate between two models",
    hint="lesson 01 defines alpha for one position from the two distributions; here it is "
    "averaged over every position. What is a distribution at temperature 0?",
)
def check_measure_alpha(fn) -> Iterator[Case]:
    a, b = _tiny(1), _tiny(2)
    x = torch.randint(
        0,
        CFG.vocab_size,
        (3, CFG.block_size),
        generator=torch.Generator().manual_seed(case_seed(0)),
    )
    cases = [
        ("a model with itself", a, a, 1.0),
        ("two models, T = 1", a, b, 1.0),
        ("T = 0.5", a, b, 0.5),
        ("T = 2", a, b, 2.0),
        ("T = 0: argmax agreement", a, b, 0.0),
    ]
    for name, t, d, temp in cases:
        exp = _alpha(t, d, x, temp)
        got = as_number(call(name, fn, t, d, x, temp))
        ok = got is not None and abs(got - exp) <= ATOL
        msg = ""
        if not ok:
            if got is None or got != got:
                msg = "not a number (at T = 0, did you divide by the temperature?)"
            elif temp != 1.0 and abs(got - _alpha(t, d, x, 1.0)) <= ATOL:
                msg = "the temperature was not applied"
            elif abs(got - (1 - exp)) <= ATOL:
                msg = "that is the total variation distance, 1 - alpha"
            else:
                msg = "wrong value: alpha is averaged over every position of every window"
        yield Case(name, ok, f"{exp:.6g}", fmt(got), msg)
    try:
        target, draft = load_pretrained("target"), load_pretrained("draft")
    except (FileNotFoundError, ValueError):
        return  # no shipped pair here: the random models above decide
    from specdec_course import data

    val = data.train_val_split(data.CharTokenizer(target.vocab).encode(data.load_corpus()))[1]
    xv, _ = data.eval_windows(val, target.config.block_size, 1)
    exp = _alpha(target, draft, xv, 1.0)
    got = as_number(call("the shipped pair", fn, target, draft, xv, 1.0))
    ok = got is not None and abs(got - exp) <= ATOL
    yield Case(
        "the shipped pair, one validation window",
        ok,
        f"{exp:.6g}",
        fmt(got),
        "" if ok else "average sum(min(p, q)) over every position",
    )
