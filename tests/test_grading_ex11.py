"""Exercise 11's checks: a correct prompt lookup passes (visible and fresh cases), each slip
fails with its diagnosis, and the grader's copy rule is the package's (``llm.lookup``).

The statistical case (the chi-square of 1,200 runs at temperature 1) runs on fixed seeds; a
correct proposer fails it by chance with probability below 1e-6 (the report states it), and
the wrong rows below miss by orders of magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import specdec_grader as grading
from specdec_course.llm.lookup import lookup
from specdec_grader import run_check
from specdec_grader.judge import ex11
from specdec_grader.judge.context import grading_seed
from specdec_grader.judge.core import public_implementations


def lookup_copy(context, k, min_n, max_n, **slip):
    return ex11.copy_variant(context, k, min_n, max_n, **slip)


def lookup_propose(context, k, vocab_size, min_n, max_n, *, rows=None, drafts=None):
    d, q = ex11.reference_propose(context, k, vocab_size, min_n, max_n)
    if drafts is not None:
        d = torch.tensor(drafts(context, k, min_n, max_n), dtype=torch.int64)
        q = torch.nn.functional.one_hot(d, vocab_size).float()
    return d, (q if rows is None else rows(d, q, vocab_size))


CORRECT = {"ex11.lookup_copy": lookup_copy, "ex11.lookup_propose": lookup_propose}


def _fails(check_id, fn, *words):
    res = run_check(check_id, fn)
    assert res.status in ("failed", "error") and res.points == 0, res.report()
    text = (res.message + " " + res.report()).lower()
    for w in words:
        assert w.lower() in text, f"{w!r} not in: {res.report()}"
    return res


def test_the_graders_copy_rule_is_the_packages():
    # llm.lookup.lookup is the course's rule; the grader may not import it, so it states the
    # rule once more, and this pins the two together (named and random contexts).
    cases = [(c, k, lo, hi) for _, c, k, lo, hi in ex11.NAMED]
    g = np.random.default_rng(0)
    for _ in range(3000):
        V, n = int(g.integers(2, 6)), int(g.integers(0, 40))
        lo = int(g.integers(1, 4))
        cases.append(
            (g.integers(0, V, n).tolist(), int(g.integers(1, 9)), lo, lo + int(g.integers(0, 3)))
        )
    for ctx, k, lo, hi in cases:
        want = lookup(np.asarray(ctx, dtype=np.int64), k, lo, hi).tolist()
        assert ex11.reference_copy(ctx, k, lo, hi) == want, (ctx, k, lo, hi)


def test_each_named_case_tells_the_rule_from_the_slip_it_names():
    named = {name: (c, k, lo, hi) for name, c, k, lo, hi in ex11.NAMED}
    for name, slip in [
        ("several matches of the same n-gram", dict(latest=True)),
        ("a longer match beats a shorter, earlier one", dict(shortest_first=True)),
        ("a match that overlaps the last n-gram", dict(no_overlap=True)),
        ("the longest n-grams occur only as themselves", dict(self_match=True)),
        ("one match: copy what followed it", dict(with_ngram=True)),
    ]:
        c, k, lo, hi = named[name]
        assert ex11.copy_variant(c, k, lo, hi, **slip) != ex11.reference_copy(c, k, lo, hi), name
    c, k, lo, hi = named["max_n caps the n-gram"]
    assert ex11.copy_variant(c, k, lo, len(c)) != ex11.reference_copy(c, k, lo, hi)
    c, k, lo, hi = named["min_n: a shorter match does not count"]
    assert ex11.copy_variant(c, k, 1, hi) != [] == ex11.reference_copy(c, k, lo, hi)


def test_ex11_registers_two_checks_worth_ten_points_and_withholds_the_packages_lookup():
    specs = grading.checks_for("ex11")
    assert [s.id for s in specs] == list(CORRECT)
    assert sum(s.points for s in specs) == 10
    assert "specdec_course.llm.lookup.lookup" in public_implementations("ex11")


@pytest.mark.parametrize("seed", [None, 11])
@pytest.mark.parametrize("check_id", list(CORRECT))
def test_a_correct_prompt_lookup_gets_full_points_on_visible_and_fresh_cases(check_id, seed):
    with grading_seed(seed):
        res = run_check(check_id, CORRECT[check_id])
    assert res.status == "passed", res.report()
    assert res.false_failure_rate < 1e-6


@pytest.mark.parametrize(
    "slip, says",
    [
        (dict(latest=True), "most recent occurrence"),
        (dict(shortest_first=True), "shortest n first"),
        (dict(self_match=True), "matched itself"),
        (dict(no_overlap=True), "may overlap"),
        (dict(with_ngram=True), "copied the matched n-gram"),
    ],
)
def test_each_slip_of_the_copy_rule_is_named(slip, says):
    _fails("ex11.lookup_copy", lambda c, k, lo, hi: lookup_copy(c, k, lo, hi, **slip), says)


def test_the_bounds_on_n_and_k_are_checked():
    _fails("ex11.lookup_copy", lambda c, k, lo, hi: lookup_copy(c, k, lo, len(c)), "max_n = 2")
    _fails("ex11.lookup_copy", lambda c, k, lo, hi: lookup_copy(c, k, 1, hi), "min_n = 2")
    _fails("ex11.lookup_copy", lambda c, k, lo, hi: lookup_copy(c, k + 1, lo, hi), "at most k")


def test_rows_at_another_token_fail_the_audit_and_bias_the_text():
    def shifted(d, q, V):
        return torch.nn.functional.one_hot((d + 1) % V, V).float()

    res = _fails(
        "ex11.lookup_propose",
        lambda *a: lookup_propose(*a, rows=shifted),
        "row 0 puts its mass on token",
    )
    law = [c for c in res.cases if c.name.startswith("temperature 1")]
    assert law and not law[0].passed and "not follow the target's law" in law[0].message


def test_a_uniform_row_fails_the_audit_and_biases_the_text():
    res = _fails(
        "ex11.lookup_propose",
        lambda *a: lookup_propose(*a, rows=lambda d, q, V: torch.full_like(q, 1.0 / V)),
        "spreads its mass",
    )
    law = [c for c in res.cases if c.name.startswith("temperature 1")]
    assert law and not law[0].passed


def test_drafts_that_are_not_the_copy_rules_fail_the_audit_and_the_call_count():
    res = _fails(
        "ex11.lookup_propose",
        lambda *a: lookup_propose(
            *a, drafts=lambda c, k, lo, hi: lookup_copy(c, k, lo, hi, latest=True)
        ),
        "not the copy rule's",
        "most recent",
    )
    greedy = [c for c in res.cases if c.name.startswith("greedy identity")]
    assert greedy and all(c.got.startswith("the same text") for c in greedy)
    assert any(not c.passed and "target calls" in c.message for c in greedy)


def test_broken_shapes_and_too_many_drafts_are_named():
    _fails("ex11.lookup_propose", lambda c, k, V, lo, hi: lookup_copy(c, k, lo, hi), "pair")
    _fails(
        "ex11.lookup_propose",
        lambda *a: lookup_propose(*a, rows=lambda d, q, V: q[:, :-1]),
        "one row of 10 probabilities per draft",
    )
    _fails(
        "ex11.lookup_propose",
        lambda c, k, V, lo, hi: lookup_propose(c + c, k + 3, V, lo, hi),
        "at most k",
    )


def test_no_drafts_may_come_with_q_none():
    def none_when_empty(*a):
        d, q = lookup_propose(*a)
        return d, (None if d.numel() == 0 else q)

    assert run_check("ex11.lookup_propose", none_when_empty).status == "passed"


def test_untouched_stubs_are_not_attempted():
    def stub(*args):
        raise NotImplementedError("replace this line with your code")

    for check_id in CORRECT:
        assert run_check(check_id, stub).status == "not attempted"


def test_a_notebook_that_forwards_to_the_packages_lookup_is_flagged():
    from specdec_grader.judge.copying import scan

    cell = (
        "import numpy as np\n"
        "from specdec_course.llm.lookup import lookup\n"
        "def lookup_copy(context, k, min_n, max_n):\n"
        "    return lookup(np.array(context), k, min_n, max_n).tolist()\n"
    )
    found = scan([cell], {"lookup_copy", "lookup_propose"}, public_implementations("ex11"))
    assert set(found.forwarders) == {"lookup_copy"}
