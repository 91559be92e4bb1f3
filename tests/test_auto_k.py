"""k="auto": the decision rule with injected costs and acceptance (no clock), and greedy
identity with it on for every draft of the character pair.

The rule's tests set the estimates directly (``CallCosts.observe`` with fixed seconds, the
per-depth counts) and compare the choice with the course's formula: with a flat target call
and a draft costing ``c`` of it per token, expected tokens per second is Theorem 3.8's
speedup, so the choice is ``theory.optimal_gamma``. The exact law with k="auto" is tested in
test_dynamic.py; the real model's greedy identity in test_auto_k_llm.py.
"""

import pytest
import torch

from specdec_course import decoding, theory
from specdec_course.data import CharTokenizer, load_corpus, train_val_split
from specdec_course.decoding.auto_k import AutoK, CallCosts, expected_tokens_by_depth
from specdec_course.drafts import ModelProposer, NgramDraft
from specdec_course.model import load_pretrained


def _auto(alpha, c, *, k_max=8, call=None, seen=1e12, **kw):
    """An AutoK whose estimates are: acceptance ``alpha`` at every depth (``seen`` observations
    each), a plain step of 1 s, a call over n tokens ``call(n)`` (1 s when
    None), a proposal of k tokens ``c * k`` s; the proposer drafts whatever it is asked."""
    auto = AutoK(rethink_seconds=0.0, **kw)
    auto.start(k_max)
    big = seen
    auto.reached[:] = [big] * k_max
    auto.hits[:] = [alpha * big] * k_max
    auto.asked[:] = auto.made[:] = [big] * k_max
    auto.step.observe(1, 1.0)
    for n in range(2, k_max + 2):
        auto.call.observe(n, 1.0 if call is None else call(n))
    for k in range(1, k_max + 1):
        auto.draft.observe(k, c * k)
    return auto


def test_expected_tokens_by_depth_is_the_courses_formula_at_one_alpha():
    for alpha in (0.0, 0.3, 0.8, 1.0):
        for k in range(6):
            assert expected_tokens_by_depth([alpha] * k) == pytest.approx(
                theory.expected_tokens(alpha, k)
            )
    assert expected_tokens_by_depth([0.9, 0.5, 0.0, 1.0]) == pytest.approx(1 + 0.9 + 0.45)


@pytest.mark.parametrize(
    "alpha, c", [(0.9, 0.05), (0.8, 0.1), (0.6, 0.02), (0.5, 0.3), (0.3, 0.5), (0.1, 0.2)]
)
def test_the_rule_picks_theorem_3_8s_best_k_including_plain_decoding(alpha, c):
    auto = _auto(alpha, c, hysteresis=0.0)
    rates = auto.rates()
    for k in range(9):  # a flat call: tokens per second is the speedup, in plain steps/s
        assert rates[k] == pytest.approx(theory.speedup(alpha, k, c), rel=1e-9)
    assert auto.choose() == theory.optimal_gamma(alpha, c, max_gamma=8)


def test_plain_decoding_when_drafting_cannot_pay():
    # alpha <= c: no k beats plain decoding (Theorem 3.8); nor does a call whose every
    # drafted token costs as much as a step, however good the draft.
    assert _auto(0.2, 0.25).choose() == 0
    assert _auto(0.95, 0.0, call=lambda n: 1.0 * n).choose() == 0
    # A call that verifies drafts costing twice a plain step: k = 1 cannot pay, more can.
    auto = _auto(0.9, 0.0, call=lambda n: 2.0 + 0.05 * n, hysteresis=0.0)
    rates = auto.rates()
    assert rates[1] < rates[0] < max(rates) and auto.choose() > 1


def test_hysteresis_keeps_the_choice_until_another_k_is_clearly_faster_or_plain_is_faster():
    auto = _auto(0.8, 0.1, hysteresis=0.1)
    best = auto.choose()
    rates = auto.rates()
    near = next(k for k in range(1, 9) if k != best and rates[k] > rates[best] / 1.1)
    auto.choice = near  # a choice within 10% of the best one is kept ...
    assert auto.choose() == near
    far = min(range(9), key=rates.__getitem__)
    assert rates[best] > 1.1 * rates[far]
    auto.choice = far  # ... one more than 10% slower is left for the best
    assert auto.choose() == best
    # Drafting that is expected to be slower than plain steps at all is dropped at once.
    slow = _auto(0.8, 0.1, call=lambda n: 0.5 + 0.5 * n, hysteresis=0.1)
    r = slow.rates()
    assert r[4] < r[0] < r[1] / 1.1 and max(r) == r[1]
    slow.choice = 4  # within 10% of plain's rate, but below it: left, and k = 1 is better
    assert slow.choose() == 1
    # From plain decoding: drafting must beat it by the margin too.
    flat = _auto(0.35, 0.25, hysteresis=0.1)
    r = flat.rates()
    assert r[0] < max(r) < 1.1 * r[0]
    flat.choice = 0
    assert flat.choose() in (0, 1)  # 0, or the scheduled probe, never a switch


def test_at_plain_decoding_it_probes_rarely_and_less_often_while_probes_do_not_pay():
    auto = _auto(0.05, 0.5, probe_every=4, probe_max=16, probe_k=2)
    assert auto.choose() == 0
    asked = []
    for _ in range(60):
        k = auto.next_k()
        asked.append(k)
        # the probe's draft is rejected: drafting still does not pay
        auto.observe(k, k, 0, 0.5 * k, 1.0 if k == 0 else 1.1)
    probes = [i for i, k in enumerate(asked) if k]
    assert all(asked[i] == 2 for i in probes)
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[:3] == [9, 17, 17] and auto.choice == 0  # every 8, then every 16 plain steps


def test_a_probe_that_pays_switches_drafting_on():
    auto = _auto(0.05, 0.05, probe_every=2, seen=20)
    assert auto.choose() == 0
    for _ in range(200):  # the text turns copyable: every probe's draft is accepted
        k = auto.next_k()
        auto.observe(k, k, k, 0.05 * k, 1.0)
        if auto.choice:
            break
    assert auto.choice > 0


def test_call_costs_read_a_line_through_what_was_timed_and_ignore_a_descheduled_call():
    costs = CallCosts()
    assert costs.cost(3) is None
    for n, s in [(2, 1.2), (4, 1.4), (2, 1.2), (4, 1.4), (2, 1.2), (4, 1.4)]:
        costs.observe(n, s)
    assert costs.cost(3) == pytest.approx(1.3) and costs.cost(8) == pytest.approx(1.8)
    for _ in range(3):
        costs.observe(4, 1.4)
    costs.observe(4, 40.0)  # descheduled: the median of size 4 does not move
    assert costs.cost(4) == pytest.approx(1.4)
    curved = CallCosts(curve={1: 1.0, 2: 1.5, 4: 2.0})
    assert curved.cost(2) == pytest.approx(1.5)  # the curve as given, until timed
    curved.observe(1, 2.0)  # this machine is twice as slow: the curve's shape, scaled
    assert curved.cost(4) == pytest.approx(4.0) and curved.cost(3) == pytest.approx(3.5)


def test_auto_k_refuses_bad_options_and_a_policy_beside_it():
    target, draft = load_pretrained("target"), load_pretrained("draft")
    with pytest.raises(ValueError, match="k='auto' chooses k itself"):
        decoding.speculative_generate(
            target, draft, torch.tensor([1]), 5, k="auto", k_policy=AutoK()
        )
    with pytest.raises(ValueError, match="'auto'"):
        decoding.speculative_generate(target, draft, torch.tensor([1]), 5, k="fast")
    with pytest.raises(ValueError, match="hysteresis"):
        AutoK(hysteresis=-0.1)
    with pytest.raises(ValueError, match="probe_every"):
        AutoK(probe_every=0)


# --------------------------------------------------- greedy identity, every draft of the pair


@pytest.fixture(scope="module")
def pair():
    return load_pretrained("target"), load_pretrained("draft")


@pytest.fixture(scope="module")
def prompts(pair):
    _, val = train_val_split(CharTokenizer(pair[0].vocab).encode(load_corpus()))
    return [val[i : i + 32] for i in (0, 20000)]


def _drafts(target, draft):
    from specdec_course.drafts.distilled import load_distilled
    from specdec_course.drafts.eagle import EagleProposer, load_eagle

    return {
        "draft model": draft,
        "draft model, confidence stop": ModelProposer(draft, p_min=0.4),
        "n-gram": NgramDraft(),
        "distilled n-gram": load_distilled(),
        "eagle": EagleProposer(load_eagle(target=target), target),
    }


def test_greedy_with_auto_k_is_the_greedy_target_for_every_draft(pair, prompts):
    target, draft = pair
    for name, prop in _drafts(target, draft).items():
        for prompt in prompts:
            ref = decoding.generate(target, prompt, 100, temperature=0)
            for _ in range(2):  # the second run starts from what the first measured
                out, st = decoding.speculative_generate(
                    target, prop, prompt, 100, k="auto", temperature=0
                )
                assert torch.equal(out, ref), name
                assert st.emitted == 100 and st.k == 8


def test_timed_runs_take_one_thread_unless_told_otherwise(monkeypatch):
    from specdec_course.decoding.threads import threads_that_fit

    assert threads_that_fit()[0] == 1 and "1 thread" in threads_that_fit()[1]
    assert threads_that_fit(3) == (3, "3 thread(s), as asked")
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    monkeypatch.setattr("os.getloadavg", lambda: (2.6, 0.0, 0.0))
    assert threads_that_fit("idle")[0] == 1  # 4 CPUs, 2.6 busy: one idle core
    monkeypatch.setattr("os.getloadavg", lambda: (0.2, 0.0, 0.0))
    assert threads_that_fit("idle")[0] == 3
    monkeypatch.setattr("os.getloadavg", lambda: (9.0, 0.0, 0.0))
    assert threads_that_fit("idle")[0] == 1  # never fewer than one
    with pytest.raises(ValueError, match="threads"):
        threads_that_fit("many")
    with pytest.raises(ValueError, match="threads"):
        threads_that_fit(0)


def test_auto_k_at_the_shortest_lengths_is_plain_greedy(pair):
    target, draft = pair
    prompt = torch.tensor([1, 2, 3])
    for n in (0, 1, 2, 3):  # k is capped at n - 1: no draft at all for n <= 1
        ref = decoding.generate(target, prompt, n, temperature=0)
        out, st = decoding.speculative_generate(target, draft, prompt, n, k="auto", temperature=0)
        assert torch.equal(out, ref) and st.emitted == n


def test_a_new_generation_starts_at_the_best_k_not_at_the_last_runs_plain_steps():
    # A run that ended at plain steps (the estimates then said drafting did not pay by the
    # hysteresis) does not lock the next run into plain steps: with estimates that now say
    # drafting is faster, start() takes the best k at once, with no probe to wait for.
    auto = _auto(0.3, 0.1, hysteresis=0.5)  # drafting 18% faster: within the hysteresis
    auto.choice = 0  # where the last run ended
    best = max(range(9), key=auto.rates().__getitem__)
    assert best > 0 and auto.rates()[best] < 1.5 * auto.rates()[0]  # within the hysteresis
    auto.start(8)
    assert auto.choice == best and auto.next_k() == best
    # ... and where plain steps are best, it starts there (no draft to pay for).
    slow = _auto(0.1, 0.5, hysteresis=0.5)
    slow.choice = 3
    slow.start(8)
    assert slow.choice == 0 and slow.next_k() == 0
