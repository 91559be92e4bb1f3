"""Checks of exercise 09: an n-gram proposer that reports the exact q it drafted from.

Students implement, in ``exercises/ex09_ngram_proposer.ipynb``, a counted n-gram draft with
**add-one smoothing and back-off** (not lesson 07's interpolated absolute discounting):

- ``ngram_q(table, context) -> [V]``: with ``h`` the longest suffix of the last ``n - 1``
  tokens of ``context`` that is a key of ``table`` (the empty tuple always is),
  ``q(w) = (c(h, w) + 1) / (c(h) + V)``;
- ``ngram_propose(table, context, k, generator) -> (drafts [k], q [k, V])``: ``k`` drafts,
  each sampled from the smoothed distribution after the context and the drafts before it,
  and the rows ``q`` it sampled them from (what a verifier needs to stay lossless).

``table`` maps every context seen in the text, as a tuple of 0 .. n - 1 token ids, to its
int64 count vector ``[V]`` (``table[()]`` holds the unigram counts); the order ``n`` is one
more than its longest key.

``ngram_q`` is compared exactly (to 1e-6, so float32 passes) with the judge's own
``reference_q``. ``ngram_propose`` is graded by an **audit** (every reported row equals the
judge's q for the context it was drafted after, is finite, non-negative and sums to 1) and
by a **chi-square test** of the drafted blocks against their exact joint law, the product of
the judge's rows, over thousands of seeded calls: a proposer that reports one q but samples
from another fails it. The statistical cases of a run fail a correct proposer with
probability below 1e-6 together (each result reports its rate; the summed-fit case adds
1e-8).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import torch

from specdec_course.stats import chi_square_test
from specdec_course.stats import counts as _counts

from ._support import FitLog, as_vector, fmt, seeded
from .context import case_seed, fresh_cases
from .core import Case, call, call_repeat, register

PUBLIC_IMPLEMENTATIONS: tuple[str, ...] = ()
ALLOWED = {
    "specdec_course.stats.chi_square_test": "the statistics tool the checks use",
    "specdec_course.stats.counts": "a histogram",
}

__all__ = ["count_table", "random_table", "reference_q", "block_law"]

_TOL = 1e-6  # float32 rows pass; any real slip is far larger


# --------------------------------------------------------------------------- references


def count_table(ids: Sequence[int], order: int, V: int) -> dict[tuple[int, ...], torch.Tensor]:
    """Every context of 0 .. order - 1 tokens seen in ``ids``, with its count vector [V]."""
    ids = [int(i) for i in ids]
    table: dict[tuple[int, ...], torch.Tensor] = {}
    for L in range(order):
        for t in range(L, len(ids)):
            h = tuple(ids[t - L : t])
            if h not in table:
                table[h] = torch.zeros(V, dtype=torch.int64)
            table[h][ids[t]] += 1
    return table


def _clone(table) -> dict:
    """The student's own copy: what their code does to the counts stays there."""
    return {h: c.clone() for h, c in table.items()}


def _order(table) -> int:
    return 1 + max(len(h) for h in table)


def _backoff(table, context: Sequence[int]) -> tuple[int, ...]:
    n = _order(table)
    ctx = tuple(int(c) for c in context)
    longest = min(n - 1, len(ctx))
    for L in range(longest, -1, -1):
        h = ctx[len(ctx) - L :] if L else ()
        if h in table:
            return h
    raise ValueError("the table has no empty context ()")


def reference_q(table, context: Sequence[int]) -> torch.Tensor:
    """Add-one smoothed distribution (float64) at the longest seen suffix of the context."""
    c = table[_backoff(table, context)].double()
    return (c + 1) / (c.sum() + c.numel())


def block_law(table, context: Sequence[int], k: int) -> torch.Tensor:
    """Exact law of the k drafts, flattened over V**k blocks (first draft most significant)."""
    V = table[()].numel()
    law = torch.empty(V**k, dtype=torch.float64)
    for i, block in enumerate(itertools.product(range(V), repeat=k)):
        pr = 1.0
        for j in range(k):
            pr *= float(reference_q(table, [*context, *block[:j]])[block[j]])
        law[i] = pr
    return law


def random_table(seed: int, V: int, order: int, length: int) -> tuple[dict, list[int]]:
    """A table counted from ``length`` tokens of a random sparse Markov chain (so that some
    contexts are unseen and many counts small), and the text."""
    g = torch.Generator().manual_seed(seed)
    trans = torch.rand(V, V, generator=g, dtype=torch.float64) ** 4
    trans[torch.rand(V, V, generator=g) < 0.3] = 0.0
    trans[torch.arange(V), torch.randint(0, V, (V,), generator=g)] += 0.2
    text = [int(torch.randint(0, V, (), generator=g))]
    for _ in range(length - 1):
        text.append(int(torch.multinomial(trans[text[-1]], 1, generator=g)))
    return count_table(text, order, V), text


def _unseen_context(table, V: int, g: torch.Generator, L: int) -> list[int]:
    for _ in range(200):
        ctx = torch.randint(0, V, (L,), generator=g).tolist()
        if tuple(ctx) not in table:
            return ctx
    return torch.randint(0, V, (L,), generator=g).tolist()


# --------------------------------------------------------------------------- ngram_q

# A small fixed table (V = 4, order 3) from a text of 40 tokens, for the named cases.
_TEXT = [0, 1, 2, 0, 1, 3, 0, 1, 2, 2, 0, 1, 2, 0, 3, 3, 1, 2, 0, 1] * 2
_TABLE = count_table(_TEXT, 3, 4)


def _q_cases():
    t1 = count_table(_TEXT, 1, 4)
    named = [
        ("a context seen in the text", _TABLE, [3, 0, 1]),
        ("an unseen context: back off to its longest seen suffix", _TABLE, [3, 2, 3]),
        ("nothing of the context seen: the unigram", _TABLE, [1, 1]),
        ("a context shorter than n - 1 tokens", _TABLE, [2]),
        ("the empty context", _TABLE, []),
        ("order 1: the unigram whatever the context", t1, [0, 1, 2]),
    ]
    g = torch.Generator().manual_seed(case_seed(1))
    rand = []
    for i in range(60):
        V = int(torch.randint(2, 9, (), generator=g))
        order = int(torch.randint(1, 5, (), generator=g))
        length = int(torch.randint(20, 200, (), generator=g))
        table, text = random_table(case_seed(1000 + i), V, order, length)
        L = int(torch.randint(0, order + 2, (), generator=g))
        if i % 2:
            ctx = _unseen_context(table, V, g, L)
        else:
            s = int(torch.randint(0, len(text) - L + 1, (), generator=g))
            ctx = text[s : s + L]
        rand.append((f"random table {i} (V = {V}, order {order})", table, ctx))
    return named, rand


def _candidates(table, context) -> list[tuple[str, torch.Tensor]]:
    """What common slips return, to name the slip."""
    n, V = _order(table), table[()].numel()
    h = _backoff(table, context)
    c = table[h].double()
    out = [
        ("the raw frequencies c(h, w) / c(h): a token never seen after h gets q = 0, and "
         "add-one smoothing gives every token one extra count", c / c.sum()),
        ("each count got one extra, but the total only one: the row no longer sums to 1 "
         "(how many extra counts were added in all?)", (c + 1) / (c.sum() + 1)),
    ]  # fmt: skip
    ctx = tuple(int(x) for x in context)
    full = ctx[len(ctx) - min(n - 1, len(ctx)) :] if n > 1 else ()
    if full not in table:
        out.append((
            "the full context is unseen and you smoothed zero counts (a uniform row): back "
            "off to its longest suffix that the table has",
            torch.full((V,), 1.0 / V, dtype=torch.float64),
        ))  # fmt: skip
    if len(h) >= 1:
        c0 = table[()].double()
        out.append((
            "you used the unigram although a longer suffix of the context is in the table",
            (c0 + 1) / (c0.sum() + V),
        ))  # fmt: skip
    old = ctx[: n - 1] if len(ctx) > n - 1 else None
    if old is not None and n > 1 and old in table and old != full:
        co = table[old].double()
        out.append((
            "you took the oldest tokens of the context: the next token depends on the "
            "last n - 1", (co + 1) / (co.sum() + V),
        ))  # fmt: skip
    return out


def _diagnose_row(table, context, got: torch.Tensor) -> str:
    if not torch.isfinite(got).all():
        return "NaN or inf in the row: something you divide by can be 0"
    if (got < 0).any():
        return "negative entries: a probability is never negative"
    for what, cand in _candidates(table, context):
        if (got - cand).abs().max().item() <= _TOL:
            return what
    s = got.sum().item()
    if not abs(s - 1) <= _TOL:
        return f"the row sums to {s:.6g}, not 1: it is not a distribution"
    return "not the add-one smoothed row of the longest seen suffix of the context"


def _row_case(name, table, context, raw) -> Case:
    exp = reference_q(table, context)
    got = as_vector(raw)
    if got is None or got.shape != exp.shape:
        shape = "?" if got is None else tuple(got.shape)
        return Case(name, False, f"a tensor of shape ({exp.numel()},)", f"{fmt(raw)} (shape "
                    f"{shape})", "return one probability per token of the vocabulary")  # fmt: skip
    ok = bool((got - exp).abs().max() <= _TOL) and bool(torch.isfinite(got).all())
    return Case(name, ok, fmt(exp), fmt(got), "" if ok else _diagnose_row(table, context, got))


@register(
    "ex09.ngram_q",
    points=4,
    needs="ngram_q",
    title="the add-one smoothed distribution after a context, with back-off",
    hint="first find which key of the table speaks for this context: the longest piece at "
    "the end of the context that the table has, never longer than the order allows. Then "
    "give every token of the vocabulary one extra count, and make the row a distribution",
)
def check_ngram_q(fn) -> Iterator[Case]:
    named, rand = _q_cases()
    for name, table, ctx in named:
        label = f"{name}: context {ctx}"
        yield _row_case(label, table, ctx, call(label, fn, _clone(table), list(ctx)))
    for name, table, ctx in rand:
        label = f"{name}: context {ctx}"
        case = _row_case(label, table, ctx, call(label, fn, _clone(table), list(ctx)))
        if not case.passed:
            yield Case(f"60 random tables: {label}", False, case.expected, case.got, case.message)
            return
    yield Case("60 random tables, seen and unseen contexts", True)


# --------------------------------------------------------------------------- ngram_propose


# (name, table, context, k, calls). Small vocabularies and short texts: small counts, where
# add-one smoothing and the raw counts differ most, and a joint law of at most 64 blocks.
def _propose_cases():
    t4, _ = random_table(case_seed(21), 4, 3, 60)
    t3, _ = random_table(case_seed(22), 3, 2, 30)
    cases = [
        ("V = 4, order 3, a seen context, 3 drafts", _TABLE, [2, 0, 1], 3, 3000),
        ("V = 4, order 3, an unseen context, 2 drafts", t4, _unseen_context(
            t4, 4, torch.Generator().manual_seed(case_seed(23)), 2), 2, 2000),
        ("V = 3, order 2, 3 drafts", t3, [1], 3, 2000),
    ]  # fmt: skip
    if fresh_cases():
        g = torch.Generator().manual_seed(case_seed(24))
        V = int(torch.randint(3, 5, (), generator=g))
        order = int(torch.randint(2, 4, (), generator=g))
        table, text = random_table(case_seed(25), V, order, 50)
        cases.append((f"a random table (V = {V}, order {order})", table, text[-2:], 3, 2000))
    return cases


def _valid_proposal(out, k: int, V: int) -> str:
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        return "return a pair (drafts, q)"
    d, q = as_vector(out[0]), as_vector(out[1])
    if d is None or d.shape != (k,) or not all(float(x).is_integer() for x in d.tolist()):
        return f"drafts: {k} token ids (a 1-D int64 tensor or a list of ints)"
    if d.min() < 0 or d.max() >= V:
        return f"drafts must be token ids in 0 .. {V - 1}"
    if q is None or q.shape != (k, V):
        return f"q: one row of {V} probabilities per draft, shape ({k}, {V})"
    return ""


def _audit(table, ctx, drafts: torch.Tensor, rows: torch.Tensor, cache: dict) -> str:
    """'' when every reported row is the judge's q after its context, else the diagnosis."""
    for j in range(len(drafts)):
        key = (*ctx, *drafts[:j].tolist())
        if key not in cache:
            cache[key] = reference_q(table, key)
        got = rows[j]
        if torch.isfinite(got).all() and (got - cache[key]).abs().max() <= _TOL:
            continue
        if j >= 1:
            stale = reference_q(table, ctx)
            if torch.isfinite(got).all() and (got - stale).abs().max() <= _TOL:
                return (
                    f"row {j} is the distribution after the context alone: draft {j + 1} "
                    "comes after the context and the drafts before it"
                )
        return f"row {j} (after drafts {drafts[:j].tolist()}): " + _diagnose_row(table, key, got)
    return ""


@register(
    "ex09.ngram_propose",
    points=6,
    needs="ngram_propose",
    title="k drafts and the exact q of each (audited, then chi-square)",
    hint="a draft is one more token of the context the next draft is predicted from. Each "
    "row you report must be the very distribution that draft was sampled from (lesson 07, "
    "section 4: why the verifier needs it exactly); sample with the generator you are given",
)
def check_ngram_propose(fn) -> Iterator[Case]:
    cases = _propose_cases()
    name0, table0, ctx0, k0, _ = cases[0]
    V0 = table0[()].numel()
    with seeded(case_seed(30)) as g:
        out = call("returns (drafts, q)", fn, _clone(table0), list(ctx0), k0, g)
    bad = _valid_proposal(out, k0, V0)
    yield Case("returns (drafts, q)", not bad, "(drafts [k], q [k, V])", fmt(out), bad)
    if bad:
        return
    fits = FitLog()
    for c, (name, table, ctx, k, n) in enumerate(cases):
        V = table[()].numel()
        with seeded(case_seed(40 + c)) as g:
            outs = call_repeat(name, n, fn, _clone(table), list(ctx), k, g)
        blocks = torch.empty(n, dtype=torch.int64)
        cache: dict = {}
        audit_bad = ""
        for i, out in enumerate(outs):
            bad = _valid_proposal(out, k, V)
            if bad:
                yield Case(f"{name}: call {i}", False, "(drafts [k], q [k, V])", fmt(out), bad)
                return
            d = as_vector(out[0]).long()
            rows = as_vector(out[1])
            if not audit_bad:
                why = _audit(table, ctx, d, rows, cache)
                if why:
                    audit_bad = why
                    label = f"{name}: audit of call {i}, drafts {d.tolist()}"
                    yield Case(
                        label, False, "each row the exact q after its context", fmt(rows), why
                    )
            blocks[i] = int(sum(int(x) * V ** (k - 1 - j) for j, x in enumerate(d.tolist())))
        if not audit_bad:
            yield Case(f"{name}: audit of {n} calls (every row finite, sums to 1, exact)", True)
        law = block_law(table, ctx, k)
        r = fits.add(chi_square_test(_counts(blocks, V**k), law))
        freq = _counts(blocks, V**k) / n
        yield Case(
            f"{name}: {n} calls, chi-square of the drafted blocks against their exact law",
            r.passed,
            expected=f"block frequencies {fmt(law)}",
            got=f"{fmt(torch.as_tensor(freq))} ({r})",
            message=""
            if r.passed
            else "the drafts do not follow the rows you report: sample "
            "each draft from the row you return for it (and from nothing else)",
            false_failure_rate=r.false_failure_rate,
        )
    yield fits.case()
