"""Dynamic draft length: the k policies, the confidence stop, and why both stay exact.

Exactness is tested on a tiny random target and draft over 3 symbols (1 layer, large
weights), whose law of the next 4 symbols is an exact enumeration of 81 sequences: 6,000
runs of the whole loop per policy (k="auto"'s ``AutoK`` among them), chi-square with
threshold df + 10 sqrt(2 df) over the merged bins (df of 20 to 80: false-failure rate below
1e-8 per test, asserted). The same test catches a stop rule that peeks at the target's
verdict on the drafts (1,500 runs put its statistic more than ten times over the threshold).
"""

import random

import pytest
import torch
from helpers import exact_sequence_law, sequence_codes, tiny_model

from specdec_course import decoding, stats, theory
from specdec_course.data import CharTokenizer, load_corpus, train_val_split
from specdec_course.decoding import ControllerK, HeuristicK
from specdec_course.decoding.auto_k import AutoK
from specdec_course.drafts import ModelProposer
from specdec_course.model import load_pretrained

RUNS, LENGTH = 6_000, 4


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(0), tiny_model(1)


def _law_test(target, draft, runs=RUNS, seed=0, **kw):
    prompt = torch.tensor([0])
    g = torch.Generator().manual_seed(seed)
    outs = torch.stack(
        [
            decoding.speculative_generate(target, draft, prompt, LENGTH, generator=g, **kw)[0][1:]
            for _ in range(runs)
        ]
    )
    V = target.config.vocab_size
    exact = exact_sequence_law(target, prompt, LENGTH)
    return stats.chi_square_test(stats.counts(sequence_codes(outs, V), V**LENGTH), exact)


class _Alternating:
    """A policy as outcome-driven as a policy can be: 1 draft after a fully accepted
    proposal, 3 after a rejection (it sees only what the loop tells it)."""

    def start(self, k_max):
        self.k = k_max

    def next_k(self):
        return self.k

    def update(self, drafted, accepted):
        self.k = 1 if accepted == drafted else 3


def test_heuristic_k_with_a_confidence_stop_keeps_the_law_of_the_target(tiny):
    target, draft = tiny
    res = _law_test(target, ModelProposer(draft, p_min=0.7), k=3, k_policy=HeuristicK(1))
    assert res.false_failure_rate < 1e-8
    assert res.passed, str(res)


def test_an_outcome_driven_policy_with_block_verification_keeps_the_law(tiny):
    target, draft = tiny
    res = _law_test(target, draft, seed=1, k=3, k_policy=_Alternating(), verify="block")
    assert res.false_failure_rate < 1e-8
    assert res.passed, str(res)


class _NoisyClock:
    """A clock whose every reading advances by a random amount (its own random numbers, never
    the loop's): k="auto" then sees calls whose costs jump about, so its choice moves
    between 0 and k_max from iteration to iteration, from the past only."""

    def __init__(self, seed):
        self.rng, self.t = random.Random(seed), 0.0

    def __call__(self):
        self.t += self.rng.expovariate(1.0)
        return self.t


class _Counting(AutoK):
    def observe(self, asked, *rest):
        self.seen[asked] = self.seen.get(asked, 0) + 1
        super().observe(asked, *rest)


def test_auto_k_keeps_the_law_of_the_target(tiny):
    # The same AutoK across all 6,000 runs (what it measured in one run starts the next), no
    # hysteresis, a probe after every plain step: k changes often, and 0 (plain steps) is
    # among the choices. False-failure rate below 1e-8 (asserted), as the module docstring says.
    target, draft = tiny
    auto = _Counting(clock=_NoisyClock(4), hysteresis=0.0, probe_every=1, probe_max=1)
    auto.seen = {}
    res = _law_test(target, draft, seed=4, k=3, k_policy=auto)
    assert res.false_failure_rate < 1e-8
    assert res.passed, str(res)
    assert all(auto.seen.get(k, 0) > 500 for k in range(4)), auto.seen  # every k was used


class _PeekingStop(ModelProposer):
    """A stop rule that peeks: it asks the target how likely each draft is and ends the
    proposal before the first draft the target gives less than 0.3. Its drafts are no longer
    samples of the q it reports (they are q conditioned on pleasing the target)."""

    def __init__(self, draft, target):
        super().__init__(draft)
        self.target = target

    def propose(self, ids, n, k, out):
        kk, q = super().propose(ids, n, k, out)
        with torch.inference_mode():
            seq = torch.cat([ids[:n], out[:kk]])[None]
            p = self.target(seq)[0, n - 1 : n - 1 + kk].softmax(-1)
        liked = p.gather(1, out[:kk, None])[:, 0] >= 0.3
        keep = int(liked.long().cumprod(0).sum())
        return keep, None if q is None else q[:keep]


def test_a_stop_rule_that_peeks_at_the_target_breaks_exactness(tiny):
    target, draft = tiny
    res = _law_test(target, _PeekingStop(draft, target), runs=1_500, seed=2, k=3)
    assert not res.passed, str(res)


# ------------------------------------------------------------------------------ the policies


def test_heuristic_k_adds_two_after_full_acceptance_and_drops_one_otherwise():
    pol = HeuristicK(initial=5)
    pol.start(8)
    seen = []
    for drafted, accepted in [(5, 5), (7, 7), (8, 2), (7, 0), (6, 6), (0, 0)]:
        pol.update(drafted, accepted)
        seen.append(pol.next_k())
    assert seen == [7, 8, 7, 6, 8, 8]  # capped at k_max; a draft-free iteration says nothing
    for _ in range(20):
        pol.update(3, 0)
    assert pol.next_k() == 1
    pol.start(3)
    assert pol.next_k() == 3  # the initial k is capped at the loop's k


def test_controller_k_is_optimal_gamma_of_its_running_alpha():
    pol = ControllerK(0.2, prior_alpha=0.5, prior_weight=2.0)
    pol.start(8)
    assert pol.alpha == 0.5 and pol.next_k() == max(1, theory.optimal_gamma(0.5, 0.2, 8))
    for _ in range(50):
        pol.update(4, 4)  # every draft accepted: alpha_hat -> 1, k -> k_max
    assert pol.alpha > 0.99 and pol.next_k() == 8
    pol.start(8)
    for _ in range(50):
        pol.update(4, 0)  # every first draft rejected: alpha_hat -> 0; k stays >= 1
    assert pol.alpha < 0.05 and pol.next_k() == 1
    forgetful, steady = ControllerK(0.05, memory=10), ControllerK(0.05)
    for pol in (forgetful, steady):
        pol.start(8)
        for _ in range(100):
            pol.update(4, 4)
        for _ in range(30):
            pol.update(4, 0)
    assert forgetful.alpha < 0.25 < 0.9 < steady.alpha  # with memory it follows the text


def test_bad_policies_and_options_raise_clear_errors(tiny):
    target, draft = tiny
    with pytest.raises(ValueError, match="k_policy must have"):
        decoding.speculative_generate(target, draft, torch.tensor([0]), 4, k_policy=3)
    with pytest.raises(ValueError, match="verify must be"):
        decoding.speculative_generate(target, draft, torch.tensor([0]), 4, verify="tree")
    with pytest.raises(ValueError, match="p_min"):
        ModelProposer(draft, p_min=1.5)
    with pytest.raises(ValueError, match="c must be"):
        ControllerK(-1.0)
    with pytest.raises(ValueError, match="initial"):
        HeuristicK(0)


# ------------------------------------------------------------------ the shipped pair, greedy


@pytest.fixture(scope="module")
def pair():
    return load_pretrained("target"), load_pretrained("draft")


@pytest.fixture(scope="module")
def prompts(pair):
    _, val = train_val_split(CharTokenizer(pair[0].vocab).encode(load_corpus()))
    return [val[i : i + 32] for i in (0, 20000)]


@pytest.mark.parametrize(
    "kw",
    [
        {"k_policy": HeuristicK()},
        {"k_policy": ControllerK(0.3)},
        {"p_min": 0.4},
        {"verify": "block", "k_policy": HeuristicK(2)},
    ],
    ids=["heuristic", "controller", "confidence-stop", "block+heuristic"],
)
def test_greedy_with_dynamic_k_matches_greedy_target(pair, prompts, kw):
    target, draft = pair
    kw = dict(kw)
    p_min = kw.pop("p_min", None)
    for prompt in prompts:
        ref = decoding.generate(target, prompt, 120, temperature=0)
        got, st = decoding.speculative_generate(
            target, ModelProposer(draft, p_min=p_min), prompt, 120, k=8, temperature=0, **kw
        )
        assert torch.equal(got, ref)
        assert st.accepted > 0


def test_the_confidence_stop_shortens_proposals_and_p_min_zero_changes_nothing(pair, prompts):
    target, draft = pair
    run = lambda prop: decoding.speculative_generate(  # noqa: E731
        target, prop, prompts[0], 120, k=6, generator=torch.Generator().manual_seed(3)
    )
    plain_out, plain_st = run(ModelProposer(draft))
    zero_out, zero_st = run(ModelProposer(draft, p_min=0.0))
    assert torch.equal(plain_out, zero_out) and plain_st.drafted == zero_st.drafted
    _, st = run(ModelProposer(draft, p_min=0.9))
    assert st.drafted / st.iterations < 0.8 * plain_st.drafted / plain_st.iterations
