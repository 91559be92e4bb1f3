"""Prompt lookup's proposal length (``llm.lookup.PromptLookup``, ``grow=True``): the schedule
on its own, and greedy identity through the loop, on a small character model (no real LLM:
these run without the ``[llm]`` extra)."""

from __future__ import annotations

import torch

from specdec_course import decoding
from specdec_course.llm.lookup import PromptLookup
from specdec_course.model import CharGPT, GPTConfig
from specdec_course.sampling import SamplingOptions


def _model():
    torch.manual_seed(0)
    return CharGPT(GPTConfig(vocab_size=12, block_size=64, n_layer=1, n_head=2, n_embd=16)).eval()


def test_the_limit_shrinks_on_a_cut_proposal_and_grows_on_a_whole_one():
    model = _model()
    look = PromptLookup(model, min_n=2)
    ids = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 1, 2] + [0] * 20)
    look.start(ids, 10, SamplingOptions(), None, 20, 4)
    out = torch.empty(4, dtype=torch.long)
    limits = []
    for accepted in (0, 0, 0, 0):  # every proposal rejected at once: 4 -> 3 -> 2 -> 1 -> 1
        kk, _ = look.propose(ids, 10, 4, out)
        assert kk == look.limit or kk == 0
        look.commit(ids, 10 + accepted + 1)
        limits.append(look.limit)
    assert limits == [3, 2, 1, 1]
    kk, _ = look.propose(ids, 10, 4, out)
    assert kk == 1 and out[0] == 3  # " 1 2" was followed by 3
    look.commit(ids, 10 + kk + 1)  # accepted whole: 1 -> 3
    assert look.limit == 3
    look.propose(ids, 10, 4, out)
    look.commit(ids, 10 + 3 + 1)  # whole again: 3 -> 4 (never above k)
    assert look.limit == 4
    look.start(ids, 10, SamplingOptions(), None, 20, 4)  # a new generation starts at k
    assert look.limit == 4


def test_without_grow_every_proposal_copies_up_to_k():
    model = _model()
    look = PromptLookup(model, min_n=2, grow=False)
    ids = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 1, 2] + [0] * 20)
    look.start(ids, 10, SamplingOptions(), None, 20, 4)
    out = torch.empty(4, dtype=torch.long)
    for _ in range(3):
        kk, _ = look.propose(ids, 10, 4, out)
        look.commit(ids, 11)
        assert kk == 4


def test_greedy_lookup_with_a_learnt_length_is_greedy_decoding():
    model = _model()
    prompt = torch.tensor([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2])
    ref = decoding.generate(model, prompt, 30, temperature=0)
    for grow in (True, False):
        look = PromptLookup(model, min_n=2, grow=grow)
        out, st = decoding.speculative_generate(model, look, prompt, 30, k=4, temperature=0)
        assert torch.equal(out, ref)
        assert st.drafted > 0
