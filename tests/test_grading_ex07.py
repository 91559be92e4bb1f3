"""The checks of exercise 07: the lossless tree walk and the compaction of the accepted path.

A correct walk and compaction get full points; each mutation below is a mistake students
make (the issue names the first three), and its check must fail with a diagnosis that names
it. The walk's checks are chi-square tests against the exact law of (last accepted node,
token), which the judge enumerates; with the course's rule (reject when chi2 > df + 10
sqrt(2 df)) a correct walk fails them by chance with probability below 1e-6 (asserted
below), and the seeds are fixed, so these tests are deterministic.
"""

from __future__ import annotations

import torch

import specdec_grader as grading
from specdec_course import medusa
from specdec_grader import run_check
from specdec_grader.judge import ex07

# --------------------------------------------------------------------------- correct answers


def tree_walk(probs, tokens, children, generator=None, *, resample="rest", remove=True):
    """The lossless walk; ``resample`` and ``remove`` swap in a common mistake."""
    node, path = 0, []
    while True:
        left = probs[node].clone()
        for c in children[node]:
            x = int(tokens[c])
            mass = left.sum()
            u = torch.rand((), dtype=torch.float64, generator=generator)
            if mass > 0 and u * mass < left[x]:
                node = c
                path.append(c)
                break
            if remove:
                left[x] = 0.0
        else:
            dist = left if resample == "rest" else probs[node]
            return path, int(torch.multinomial(dist, 1, generator=generator))


def compact_cache(cache, start, path, *, offset=0, move=True):
    """The compaction; ``offset`` and ``move`` swap in a common mistake."""
    for d, node in enumerate(path, 1):
        src, dst = start + node + offset, start + d
        if move and src != dst:
            cache.k[:, :, :, dst] = cache.k[:, :, :, src]
            cache.v[:, :, :, dst] = cache.v[:, :, :, src]
    cache.length = start + 1 + len(path)


def _fails(check_id, fn, *words):
    res = run_check(check_id, fn)
    assert res.status in ("failed", "error") and res.points == 0, res.report()
    text = (res.message + " " + res.report()).lower()
    for w in words:
        assert w.lower() in text, f"{w!r} not in: {res.report()}"
    return res


def test_ex07_grades_each_function_once_for_ten_points():
    specs = grading.checks_for("ex07")
    assert [s.id for s in specs] == ["ex07.tree_walk", "ex07.compact_cache"]
    assert [s.needs for s in specs] == [("tree_walk",), ("compact_cache",)]
    assert sum(s.points for s in specs) == 10


def test_a_correct_walk_gets_full_points_at_a_stated_false_failure_rate():
    res = run_check("ex07.tree_walk", tree_walk)
    assert res.status == "passed", res.report()
    assert 0 < res.false_failure_rate < 1e-6


def test_a_correct_compaction_gets_full_points():
    res = run_check("ex07.compact_cache", compact_cache)
    assert res.status == "passed", res.report()


def test_the_exact_law_matches_the_package_walk():
    # The judge's law, against the package's sampled walk (a different implementation).
    probs, tokens, children = ex07.make_tree_case(ex07.DEEP, 5)
    law = ex07.exact_law(probs, tokens, children)
    assert law.shape == probs.shape and abs(float(law.sum()) - 1) < 1e-12
    g = torch.Generator().manual_seed(0)
    tl, T, V = tokens.tolist(), probs.shape[0], probs.shape[1]
    counts = torch.zeros(T * V)
    from specdec_course.medusa.medusa_generate import _sampled_walk

    for _ in range(20_000):
        us = (1.0 - torch.rand(2 * T, dtype=torch.float64, generator=g)).tolist()
        node, tok = _sampled_walk(probs.log(), None, tl, children, T, us)
        counts[node * V + tok] += 1
    r = ex07.chi_square_test(counts, law.flatten())
    assert r.passed and r.false_failure_rate < 1e-6, r


# --------------------------------------------------------------------------- mutations


def test_resampling_from_p_instead_of_what_is_left_is_caught():
    def from_p(probs, tokens, children, generator=None):
        return tree_walk(probs, tokens, children, generator, resample="p")

    _fails("ex07.tree_walk", from_p, "just rejected", "sampled from p")


def test_forgetting_to_remove_a_rejected_child_is_caught():
    def keep(probs, tokens, children, generator=None):
        return tree_walk(probs, tokens, children, generator, remove=False)

    _fails("ex07.tree_walk", keep, "just rejected", "left in the node's distribution")


def test_compacting_the_wrong_positions_is_caught():
    def off_by_one(cache, start, path):
        compact_cache(cache, start, path, offset=-1)

    _fails("ex07.compact_cache", off_by_one, "does not hold node", "path order")


def test_setting_the_length_without_moving_the_path_is_caught():
    def no_move(cache, start, path):
        compact_cache(cache, start, path, move=False)

    _fails("ex07.compact_cache", no_move, "nothing moved")


def test_a_walk_that_always_stops_at_the_root_is_caught():
    def root_only(probs, tokens, children, generator=None):
        return [], int(torch.multinomial(probs[0], 1, generator=generator))

    _fails("ex07.tree_walk", root_only)


def test_untouched_stubs_are_not_attempted():
    def stub(*args, **kwargs):
        raise NotImplementedError("replace this line with your code")

    report = grading.grade_namespace("ex07", {"tree_walk": stub, "compact_cache": stub})
    assert report.points == 0
    assert {r.status for r in report.results} == {"not attempted"}


def test_the_package_compaction_passes_the_check():
    # The check agrees with the package it is built on.
    assert run_check("ex07.compact_cache", medusa.compact_cache).status == "passed"


def test_accepting_without_renormalising_is_caught():
    def no_renorm(probs, tokens, children, generator=None):
        node, path = 0, []
        while True:
            left = probs[node].clone()
            for c in children[node]:
                x = int(tokens[c])
                if torch.rand((), dtype=torch.float64, generator=generator) < left[x]:
                    node = c
                    path.append(c)
                    break
                left[x] = 0.0
            else:
                return path, int(torch.multinomial(left, 1, generator=generator))

    _fails("ex07.tree_walk", no_renorm, "renormalised")
