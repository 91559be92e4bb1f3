"""``stop_ids``: plain and speculative decoding end at the first end-of-turn id, keeping it."""

import pytest
import torch

from specdec_course.data import CharTokenizer
from specdec_course.decoding import generate, speculative_generate
from specdec_course.model import load_pretrained


@pytest.fixture(scope="module")
def pair():
    target, draft = load_pretrained("target"), load_pretrained("draft")
    return target, draft, CharTokenizer(target.vocab)


def _cut(ids, n0, stop):
    new = ids[n0:].tolist()
    hits = [i for i, t in enumerate(new) if t in stop]
    return ids[: n0 + hits[0] + 1] if hits else ids


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_both_loops_end_at_the_first_stop_id_and_keep_the_same_prefix(pair, temperature):
    target, draft, tok = pair
    prompt = torch.as_tensor(tok.encode("ROMEO:\n"))
    n0 = prompt.numel()
    full = generate(
        target, prompt, 60, temperature=temperature, generator=torch.Generator().manual_seed(3)
    )
    stop = {int(tok.encode("\n")[0]), int(tok.encode(" ")[0])}
    assert any(t in stop for t in full[n0:].tolist())  # so the cut below is a real cut
    expected = _cut(full, n0, stop)
    assert expected.numel() < full.numel()
    plain = generate(
        target,
        prompt,
        60,
        temperature=temperature,
        generator=torch.Generator().manual_seed(3),
        stop_ids=stop,
    )
    assert torch.equal(plain, expected)
    spec_full, _ = speculative_generate(
        target,
        draft,
        prompt,
        60,
        k=4,
        temperature=temperature,
        generator=torch.Generator().manual_seed(3),
    )
    spec, stats = speculative_generate(
        target,
        draft,
        prompt,
        60,
        k=4,
        temperature=temperature,
        generator=torch.Generator().manual_seed(3),
        stop_ids=stop,
    )
    assert torch.equal(spec, _cut(spec_full, n0, stop))
    assert stats.emitted == spec.numel() - n0 and spec[-1].item() in stop
    if temperature == 0:
        assert torch.equal(spec, plain)


def test_stop_ids_outside_the_vocabulary_are_refused(pair):
    target, _, tok = pair
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(target, torch.tensor([1]), 4, stop_ids=[target.config.vocab_size])
    with pytest.raises(ValueError, match="collection of token ids"):
        generate(target, torch.tensor([1]), 4, stop_ids=3)
