"""The live speculation view (``token_view``): the coloured picture of a run is the run.

Checked on every shipped proposer of the character pair (the draft model, the counted and
distilled n-grams, the EAGLE-style feature, fused and recurrent drafts) at temperature 0 and
1, and on the real model's proposers where the ``[llm]`` extra is installed: each iteration's
accepted drafts and the target's own token are exactly the committed ids, in order; the
refused draft is the draft the verdict stopped at and differs from the token that replaced it
at temperature 0; the counts agree with ``SpecStats``; the text without the refused drafts is
the decoded output; at temperature 0 it is plain greedy decoding's. The HTML and the plain
text marks carry each kind. No timing is asserted (only that one was taken).
"""

from __future__ import annotations

import pytest
import torch

from specdec_course import decoding, token_view
from specdec_course.bench.shipped_drafts import load_drafts
from specdec_course.data import CharTokenizer
from specdec_course.model import load_pretrained

CHAR_DRAFTS = ("draft", "ngram", "distilled", "eagle", "fused", "recurrent")


@pytest.fixture(scope="module")
def pair():
    target = load_pretrained("target")
    return target, load_drafts(target, CHAR_DRAFTS), CharTokenizer(target.vocab)


def _check_run(run: token_view.Watched, temperature: float):
    committed = run.ids[run.prompt_len :].tolist()
    pos = 0
    for it in run.iterations:
        assert 0 <= it.accepted <= len(it.drafted)
        segment = it.drafted[: it.accepted] + [it.token]
        assert committed[pos : pos + len(segment)] == segment
        if it.rejected is not None and temperature == 0:
            assert it.rejected != it.token  # greedy: refused exactly when it is not the argmax
        pos += len(segment)
    assert pos == len(committed)
    assert run.text() == run.decode(committed)
    kinds = {kind for kind, _ in run.pieces()}
    assert "target" in kinds
    html, text = run._repr_html_(), repr(run)
    for kind in kinds:
        assert f"sv-{kind}" in html
        assert token_view.KINDS[kind][1] in text.split("\n", 2)[2]
    assert run.spec_seconds > 0 and run.plain_seconds > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", CHAR_DRAFTS)
def test_the_view_is_the_run_for_every_character_draft(pair, name, temperature):
    target, drafts, tok = pair
    prompt = tok.encode("ROMEO:\nWhat light through yonder")
    run = token_view.watch(target, drafts[name], prompt, 24, decode=tok.decode, k=4,
                           temperature=temperature, seed=3)  # fmt: skip
    _check_run(run, temperature)
    _, stats = decoding.speculative_generate(
        target, drafts[name], prompt, 24, k=4, temperature=temperature,
        generator=torch.Generator().manual_seed(3),
    )  # fmt: skip
    assert [it.accepted for it in run.iterations] == stats.accepted_per_iteration
    if temperature == 0:
        assert run.identical and run.plain_text() == run.text()
    assert "rejected" in {k for k, _ in run.pieces()} or stats.rejections == 0


def test_a_proposer_that_drafts_nothing_shows_only_the_targets_tokens(pair):
    target, drafts, tok = pair
    prompt = tok.encode("abc")
    run = token_view.watch(target, drafts["ngram"], prompt, 12, decode=tok.decode, k=1)
    assert all(len(it.drafted) <= 1 for it in run.iterations)
    _check_run(run, 0.0)


def test_the_explorer_runs_the_learners_prompt_and_refuses_an_empty_one(pair):
    target, drafts, tok = pair
    ex = token_view.Explorer(target, {"draft": drafts["draft"], "ngram": drafts["ngram"]},
                             tok.encode, tok.decode, prompt="JULIET:\nO Romeo")  # fmt: skip
    ex.tokens.value, ex.proposer.value = 16, "ngram"
    res = ex.run()
    assert res.identical and "identical to plain" in ex.status.value
    assert "sv-target" in ex.spec_out.value and res.plain_text() in _unescape(ex.plain_out.value)
    ex.prompt.value = "   "
    with pytest.raises(ValueError, match="prompt is empty"):
        ex.run()
    ex._clicked()  # the button shows the message instead of raising
    assert "prompt is empty" in ex.status.value


def _unescape(s: str) -> str:
    import html

    return html.unescape(s)


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf", reason="needs the [llm] extra")
    from specdec_course import llm

    try:
        model, tok = llm.load(torch.float32)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return model, tok, llm.proposers(model)


@pytest.mark.parametrize("name", ["prompt_lookup", "feature_draft"])
def test_the_view_is_the_run_on_the_real_model(smollm2, name):
    from specdec_course.llm.prompts import PROMPT_SETS

    model, tok, drafts = smollm2
    ids = tok.apply_chat_template([{"role": "user", "content": PROMPT_SETS["grounded"][1]}])
    run = token_view.watch(model, drafts[name], ids, 24, decode=tok.decode, k=4,
                           stop_ids=tok.stop_ids)  # fmt: skip
    _check_run(run, 0.0)
    assert run.identical
