"""Check ``ex03.measure_alpha``: the acceptance rate α between two models, averaged over the
text positions of padded windows, at several temperatures (0 included), on small random models
and, where the course ships them, on the trained pair.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from specdec_course.model import CharGPT, load_pretrained
from specdec_course.train import next_token_probs

from .._support import as_number, fmt, random_model
from ..context import case_seed, fresh_cases
from ..core import Case, call, register
from ._common import ATOL, CFG


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
