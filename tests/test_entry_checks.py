"""Every public entry point refuses bad arguments the same way: one ValueError, on entry,
whose message names the argument.

One table of bad values per kind of argument (an int, a real number, token ids, a random
generator) drives every entry point that takes one: plain, speculative (draft model, n-gram,
EAGLE), batched, Medusa, block verification, the k policies, the n-gram draft itself and the
benchmarks. Nothing here generates text: each call must fail before any model runs (the
benchmarks would otherwise run for minutes). The values are the mistakes seen in practice:
``top_k=float("inf")`` (OverflowError from ``int(inf)`` before), a prompt of floats (silently
truncated to ints before), a seed passed as the generator.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from specdec_course import bench, data, decoding, drafts, medusa, sampling
from specdec_course.block_verifier import block_verify
from specdec_course.decoding.batched import generate_batch, speculative_generate_batch
from specdec_course.drafts.eagle import EagleDraft, EagleProposer
from specdec_course.drafts.ngram import NgramDraft
from specdec_course.model import CharGPT, GPTConfig

V = len(data.VOCAB)
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 4

# ------------------------------------------------------------------------- the bad values

BAD: dict[str, list[tuple[str, Any]]] = {
    "int": [
        ("float", 2.5),
        ("whole float", 4.0),
        ("bool", True),
        ("inf", math.inf),
        ("nan", math.nan),
        ("str", "4"),
        ("negative", -1),
    ],
    "real": [
        ("nan", math.nan),
        ("inf", math.inf),
        ("str", "0.5"),
        ("bool", True),
        ("negative", -1.0),
    ],
    "ids": [
        ("list of floats", [1.5, 2.0, 3.7]),
        ("float tensor", torch.tensor([1.0, 2.0])),
        ("float array", np.array([1.5, 2.5])),
        ("bools", [True, False]),
        ("text", "ROMEO"),
        ("negative id", [-1, 2]),
        ("huge id", [1, 10**30]),
        ("id past the vocabulary", [3, V + 5]),
    ],
    "generator": [
        ("int seed", 0),
        ("str", "seed"),
        ("numpy generator", np.random.default_rng(0)),
    ],
}


# ------------------------------------------------------------------------------ the models


def _model(n_layer: int, n_embd: int, seed: int) -> CharGPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=V, block_size=32, n_layer=n_layer, n_head=2, n_embd=n_embd)
    return CharGPT(cfg).eval()


TARGET = _model(2, 16, 0)
DRAFT = _model(1, 8, 1)
HEADS = medusa.MedusaHeads(16, V, 3)
EAGLE = EagleProposer(EagleDraft.from_target(TARGET), TARGET)
NGRAM = NgramDraft(3, text=TEXT)
PROMPT = torch.tensor([1, 2, 3])
BATCH = torch.tensor([[1, 2, 3], [4, 5, 6]])
P = torch.full((1, 3, V), 1.0 / V)
TOK = data.CharTokenizer()


def _gen(**kw):
    return decoding.generate(TARGET, kw.pop("prompt_ids", PROMPT), kw.pop("n", 4), **kw)


def _spec(draft, **kw):
    return decoding.speculative_generate(
        TARGET, draft, kw.pop("prompt_ids", PROMPT), kw.pop("n", 4), **kw
    )


def _batch(**kw):
    return generate_batch(TARGET, kw.pop("prompts", BATCH), kw.pop("n", 4), **kw)


def _spec_batch(**kw):
    return speculative_generate_batch(TARGET, DRAFT, kw.pop("prompts", BATCH), kw.pop("n", 4), **kw)


def _medusa(**kw):
    return medusa.medusa_generate(
        TARGET, HEADS, kw.pop("prompt_ids", PROMPT), kw.pop("n", 4), tree="chain", **kw
    )


def _speedup(prompts=(PROMPT,), **kw):
    return bench.measure_speedup(TARGET, {"draft": DRAFT}, list(prompts), **kw)


def _dynamic(prompts=(PROMPT,), c=0.3, **kw):
    return bench.measure_dynamic(TARGET, DRAFT, list(prompts), c=c, **kw)


def _batch_bench(prompts=BATCH, **kw):
    return bench.measure_batch(TARGET, DRAFT, prompts, **kw)


def _block(prompts=(PROMPT,), **kw):
    return bench.measure_block(TARGET, DRAFT, list(prompts), **kw)


class _FixedK:
    def __init__(self, k):
        self.k = k

    def start(self, k_max):
        pass

    def next_k(self):
        return self.k

    def update(self, drafted, accepted):
        pass

    def __repr__(self):
        return f"FixedK({self.k!r})"


# ------------------------------------------------------------------------------- the cases


@dataclass
class Case:
    entry: str  # the public function or class
    arg: str  # the argument the bad value goes to, as the message must name it
    kind: str  # which row of BAD
    call: Callable[[Any], object]
    valid: tuple[str, ...] = ()  # labels of BAD values this argument legitimately accepts


def _g(v):
    return {"generator": v}


def _batched(v):
    # A batch entry point gets the bad value as the row of a batch of one.
    return [v]


CASES = [
    # plain decoding
    Case("generate", "prompt_ids", "ids", lambda v: _gen(prompt_ids=v)),
    Case("generate", "max_new_tokens", "int", lambda v: _gen(n=v)),
    Case("generate", "top_k", "int", lambda v: _gen(top_k=v)),
    Case("generate", "temperature", "real", lambda v: _gen(temperature=v)),
    Case("generate", "top_p", "real", lambda v: _gen(top_p=v)),
    Case("generate", "generator", "generator", lambda v: _gen(generator=v)),
    # speculative decoding with the draft model
    Case("speculative_generate", "prompt_ids", "ids", lambda v: _spec(DRAFT, prompt_ids=v)),
    Case("speculative_generate", "max_new_tokens", "int", lambda v: _spec(DRAFT, n=v)),
    Case("speculative_generate", "k", "int", lambda v: _spec(DRAFT, k=v)),
    Case("speculative_generate", "top_k", "int", lambda v: _spec(DRAFT, top_k=v)),
    Case("speculative_generate", "temperature", "real", lambda v: _spec(DRAFT, temperature=v)),
    Case("speculative_generate", "top_p", "real", lambda v: _spec(DRAFT, top_p=v)),
    Case("speculative_generate", "generator", "generator", lambda v: _spec(DRAFT, generator=v)),
    Case("speculative_generate[block]", "k", "int", lambda v: _spec(DRAFT, k=v, verify="block")),
    # ... with the n-gram draft and the EAGLE proposer
    Case("speculative_generate[ngram]", "prompt_ids", "ids", lambda v: _spec(NGRAM, prompt_ids=v)),
    Case("speculative_generate[ngram]", "k", "int", lambda v: _spec(NGRAM, k=v)),
    Case("speculative_generate[ngram]", "top_k", "int", lambda v: _spec(NGRAM, top_k=v)),
    Case("speculative_generate[eagle]", "prompt_ids", "ids", lambda v: _spec(EAGLE, prompt_ids=v)),
    Case("speculative_generate[eagle]", "k", "int", lambda v: _spec(EAGLE, k=v)),
    Case("speculative_generate[eagle]", "top_p", "real", lambda v: _spec(EAGLE, top_p=v)),
    # batched
    Case("generate_batch", "prompts", "ids", lambda v: _batch(prompts=_batched(v))),
    Case("generate_batch", "max_new_tokens", "int", lambda v: _batch(n=v)),
    Case("generate_batch", "top_k", "int", lambda v: _batch(top_k=v)),
    Case("generate_batch", "temperature", "real", lambda v: _batch(temperature=v)),
    Case("generate_batch", "generator", "generator", lambda v: _batch(generator=v)),
    Case("speculative_generate_batch", "prompts", "ids", lambda v: _spec_batch(prompts=[v, v])),
    Case("speculative_generate_batch", "max_new_tokens", "int", lambda v: _spec_batch(n=v)),
    Case("speculative_generate_batch", "k", "int", lambda v: _spec_batch(k=v)),
    Case("speculative_generate_batch", "top_k", "int", lambda v: _spec_batch(top_k=v)),
    Case("speculative_generate_batch", "top_p", "real", lambda v: _spec_batch(top_p=v)),
    Case("speculative_generate_batch", "generator", "generator", lambda v: _spec_batch(**_g(v))),
    # Medusa
    Case("medusa_generate", "prompt_ids", "ids", lambda v: _medusa(prompt_ids=v)),
    Case("medusa_generate", "max_new_tokens", "int", lambda v: _medusa(n=v)),
    Case("medusa_generate", "top_k", "int", lambda v: _medusa(top_k=v)),
    Case("medusa_generate", "temperature", "real", lambda v: _medusa(temperature=v)),
    Case("medusa_generate", "generator", "generator", lambda v: _medusa(generator=v)),
    # the n-gram draft and the proposer audit
    Case("NgramDraft", "order", "int", lambda v: NgramDraft(v, text=TEXT)),
    Case("NgramDraft", "discount", "real", lambda v: NgramDraft(3, v, text=TEXT)),
    Case("NgramDraft", "ids", "ids", lambda v: NgramDraft(2, ids=v)),
    Case("NgramDraft.probs", "context", "ids", NGRAM.probs, valid=("text",)),
    Case("NgramDraft.batch_probs", "contexts", "ids", lambda v: NGRAM.batch_probs([v])),
    Case("audit_proposer", "prompt_ids", "ids", lambda v: drafts.audit_proposer(NGRAM, v)),
    Case("audit_proposer", "runs", "int", lambda v: drafts.audit_proposer(NGRAM, PROMPT, runs=v)),
    Case("audit_proposer", "seed", "int", lambda v: drafts.audit_proposer(NGRAM, PROMPT, seed=v)),
    Case("ModelProposer", "p_min", "real", lambda v: drafts.ModelProposer(DRAFT, p_min=v)),
    # block verification (the batched verifier's inputs; its batch-1 row runs in the loop)
    Case("block_verify", "draft_token_ids", "ids", lambda v: block_verify(_batched(v), None, P)),
    # k policies
    Case("HeuristicK", "initial", "int", lambda v: decoding.HeuristicK(v)),
    Case("HeuristicK", "increase", "int", lambda v: decoding.HeuristicK(increase=v)),
    Case("ControllerK", "c", "real", lambda v: decoding.ControllerK(v)),
    Case("ControllerK", "prior_alpha", "real", lambda v: decoding.ControllerK(0.5, prior_alpha=v)),
    Case(
        "ControllerK", "prior_weight", "real", lambda v: decoding.ControllerK(0.5, prior_weight=v)
    ),
    Case("ControllerK", "memory", "int", lambda v: decoding.ControllerK(0.5, memory=v)),
    # logit processing, as every sampler calls it
    Case("process_logits", "top_k", "int", lambda v: sampling.process_logits(P[0], top_k=v)),
    Case("process_logits", "top_p", "real", lambda v: sampling.process_logits(P[0], top_p=v)),
    # benchmarks: refused before anything is timed
    Case("measure_speedup", "ks", "int", lambda v: _speedup(ks=[v])),
    Case("measure_speedup", "repeats", "int", lambda v: _speedup(repeats=v)),
    Case("measure_speedup", "max_new_tokens", "int", lambda v: _speedup(max_new_tokens=v)),
    Case("measure_speedup", "seed", "int", lambda v: _speedup(seed=v)),
    Case("measure_speedup", "temperature", "real", lambda v: _speedup(temperature=v)),
    Case("measure_speedup", "prompts", "ids", lambda v: _speedup(prompts=[v])),
    Case("measure_dynamic", "c", "real", lambda v: _dynamic(c=v)),
    Case("measure_dynamic", "repeats", "int", lambda v: _dynamic(repeats=v)),
    Case("measure_dynamic", "prompts", "ids", lambda v: _dynamic(prompts=[v])),
    Case("measure_batch", "ks", "int", lambda v: _batch_bench(ks=[v])),
    Case("measure_batch", "batch_sizes", "int", lambda v: _batch_bench(batch_sizes=[v])),
    Case("measure_batch", "max_new_tokens", "int", lambda v: _batch_bench(max_new_tokens=v)),
    Case("measure_batch", "prompts", "ids", lambda v: _batch_bench(prompts=[v, v])),
    Case("measure_block", "ks", "int", lambda v: _block(ks=[v])),
    Case("measure_block", "runs", "int", lambda v: _block(runs=v)),
    Case("measure_block", "prompts", "ids", lambda v: _block(prompts=[v])),
    Case("measure_eagle", "ks", "int", lambda v: bench.measure_eagle(ks=[v])),
    Case("measure_eagle", "repeats", "int", lambda v: bench.measure_eagle(repeats=v)),
    Case("measure_eagle", "temperature", "real", lambda v: bench.measure_eagle(temperatures=[v])),
    Case("forward_costs", "sizes", "int", lambda v: bench.forward_costs(TARGET, DRAFT, sizes=[v])),
    Case("forward_costs", "repeats", "int", lambda v: bench.forward_costs(TARGET, DRAFT, (1,), v)),
    Case("time_forward", "n_new", "int", lambda v: bench.time_forward(TARGET, v)),
    Case("time_forward", "context", "int", lambda v: bench.time_forward(TARGET, 1, context=v)),
    Case("validation_prompts", "n", "int", lambda v: bench.validation_prompts(TOK, n=v)),
    Case("validation_prompts", "length", "int", lambda v: bench.validation_prompts(TOK, length=v)),
    Case("time_round_robin", "repeats", "int", lambda v: bench.time_round_robin({"x": int}, v)),
    Case("fastest_method", "temperature", "real", lambda v: bench.fastest_method({}, v)),
]


def _params():
    for case in CASES:
        for label, value in BAD[case.kind]:
            if label in case.valid:
                continue
            yield pytest.param(case, value, id=f"{case.entry}-{case.arg}-{label}")


@pytest.mark.parametrize(("case", "value"), list(_params()))
def test_every_entry_point_refuses_a_bad_argument_with_a_value_error_naming_it(case, value):
    with pytest.raises(ValueError, match=re.escape(case.arg)):
        case.call(value)


def test_the_table_reaches_every_public_entry_point():
    # A new entry point or argument kind is added to the table, not forgotten.
    entries = {c.entry.split("[")[0] for c in CASES}
    for name in (
        "generate",
        "speculative_generate",
        "generate_batch",
        "speculative_generate_batch",
        "medusa_generate",
        "NgramDraft",
        "block_verify",
        "HeuristicK",
        "ControllerK",
        "measure_speedup",
        "measure_dynamic",
        "measure_batch",
        "measure_block",
        "measure_eagle",
    ):
        assert name in entries
    assert {c.kind for c in CASES} == set(BAD)
    proposers = {"speculative_generate[ngram]", "speculative_generate[eagle]"}
    assert proposers <= {c.entry for c in CASES}


# ------------------------------------------------------------- what the table cannot show


def test_a_prompt_of_floats_is_refused_not_truncated_and_int_containers_all_work():
    with pytest.raises(ValueError, match=r"prompt_ids\[0\] is 1\.5"):
        decoding.generate(TARGET, [1.5, 2.0, 3.7], 5, temperature=0)
    want = decoding.generate(TARGET, torch.tensor([1, 2, 3]), 5, temperature=0)
    for same in ([1, 2, 3], (1, 2, 3), range(1, 4), np.array([1, 2, 3]), [np.int64(1), 2, 3]):
        assert torch.equal(decoding.generate(TARGET, same, 5, temperature=0), want)
    assert torch.equal(decoding.generate(TARGET, torch.tensor([[1, 2, 3]]), 5, temperature=0), want)


def test_top_k_infinity_is_a_value_error_not_an_overflow():
    with pytest.raises(ValueError, match=r"top_k .*got inf \(infinite\)"):
        decoding.generate(TARGET, PROMPT, 4, top_k=float("inf"))
    # NumPy ints are ints: a k read from an array is not refused.
    out, _ = decoding.speculative_generate(
        TARGET, DRAFT, PROMPT, 4, k=np.int64(2), top_k=np.int32(5), temperature=0
    )
    assert out.numel() == 7


def test_an_eagle_proposer_for_another_target_is_refused_on_entry():
    # The case: the draft model passed as the target of a proposer built for the
    # real target, same vocabulary, another width. Refused before the proposer starts.
    prop = EagleProposer(EagleDraft.from_target(TARGET), TARGET)
    with pytest.raises(ValueError, match="built for another target"):
        decoding.speculative_generate(DRAFT, prop, PROMPT, 4)
    assert prop.cache is None  # start() never ran
    # A target of the same shape but another object is refused too: the proposer computes
    # the prompt's features with its own target, which would then not be the one verifying.
    twin = _model(2, 16, 5)
    with pytest.raises(ValueError, match="built for another target"):
        decoding.speculative_generate(twin, prop, PROMPT, 4)
    out, _ = decoding.speculative_generate(TARGET, prop, PROMPT, 4, k=2, temperature=0)
    assert torch.equal(out, decoding.generate(TARGET, PROMPT, 4, temperature=0))


def test_the_shipped_eagle_proposer_refuses_the_draft_model_as_its_target():
    from specdec_course.drafts.eagle import load_eagle
    from specdec_course.model import load_pretrained

    target, draft = load_pretrained("target"), load_pretrained("draft")
    prop = EagleProposer(load_eagle(target=target), target)
    with pytest.raises(ValueError, match="built for another target"):
        decoding.speculative_generate(draft, prop, PROMPT, 20)


def test_a_draft_whose_ids_mean_other_characters_is_refused():
    # Same size, another order: exact but useless, and always a mistake; refused with the
    # first id that differs.
    target, draft = _model(1, 8, 2), _model(1, 8, 3)
    target.vocab = data.VOCAB
    draft.vocab = data.VOCAB[::-1]
    with pytest.raises(ValueError, match=r"other characters than the target's \(id 0 is"):
        decoding.speculative_generate(target, draft, PROMPT, 4)
    with pytest.raises(ValueError, match="other characters"):
        speculative_generate_batch(target, draft, BATCH, 4)
    ngram = NgramDraft(2, text=TEXT[::-1], vocab=data.VOCAB[::-1])
    with pytest.raises(ValueError, match="other characters"):
        decoding.speculative_generate(target, ngram, PROMPT, 4)
    with pytest.raises(ValueError, match="other characters"):
        bench.measure_speedup(target, {"ngram": ngram}, [PROMPT])
    draft.vocab = data.VOCAB  # the same characters: accepted
    decoding.speculative_generate(target, draft, PROMPT, 4)


@pytest.mark.parametrize("bad", [2.5, None, -1, "3", True, 2.0])
def test_a_k_policy_whose_next_k_is_not_an_int_is_named(bad):
    with pytest.raises(ValueError, match=re.escape(f"k_policy FixedK({bad!r}): next_k()")):
        decoding.speculative_generate(TARGET, DRAFT, PROMPT, 6, k=3, k_policy=_FixedK(bad))


def test_a_k_policy_may_answer_with_a_numpy_int():
    out, st = decoding.speculative_generate(
        TARGET, DRAFT, PROMPT, 6, k=3, k_policy=_FixedK(np.int64(2)), temperature=0
    )
    assert torch.equal(out, decoding.generate(TARGET, PROMPT, 6, temperature=0))
    assert max(st.accepted_per_iteration) <= 2
