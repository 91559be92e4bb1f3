"""The shipped pair in Hugging Face transformers (specdec_course.hf; the extra ``[hf]``).

Exported logits equal CharGPT's (full windows, and step by step through HF's KV cache), the
round trip keeps every weight bit for bit, HF's greedy ``generate`` (plain, assisted by the
exported draft, prompt lookup) gives ``decoding.generate``'s tokens, and HF's assisted
sampling at temperature 1 follows the exact two-character law by the chi-square of
tests/test_decoding.py (threshold df + 10 sqrt(2 df); 1,000 runs of HF's generate merge to
about 100 bins, a false-failure rate below 1e-12, asserted from the result). Skipped with a
reason when transformers is not installed.
"""

import pytest
import torch

pytest.importorskip(
    "transformers", reason="needs the [hf] extra: pip install -e '.[hf]' (transformers)"
)

from specdec_course import decoding, hf, stats  # noqa: E402
from specdec_course.data import CharTokenizer, corpus_split  # noqa: E402
from specdec_course.model import load_pretrained  # noqa: E402
from specdec_course.sampling import process_logits  # noqa: E402


@pytest.fixture(scope="module")
def pair():
    return load_pretrained("target"), load_pretrained("draft")


@pytest.fixture(scope="module")
def hf_pair(pair):
    return hf.to_hf(pair[0]), hf.to_hf(pair[1])


@pytest.fixture(scope="module")
def val(pair):
    return corpus_split(CharTokenizer(pair[0].vocab))[1]


def _cache_kw(hf_model, cache):
    # transformers 5.x names the cache argument ``cache`` (``past_key_values`` before).
    return {"cache": cache, "use_cache": True}


def _out_cache(out):
    return out.cache


def test_logits_match_over_full_windows(pair, hf_pair, val):
    for model, exported in zip(pair, hf_pair):
        T = model.config.block_size
        x = torch.stack([val[i : i + T] for i in (0, 7000, 40000)])
        with torch.inference_mode():
            ours, theirs = model(x), exported(x).logits
        torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


def test_logits_match_step_by_step_through_hf_cache(pair, hf_pair, val):
    """HF's cache fed one token at a time (and a 5-token block, as a verifying call) against
    CharGPT's own cached steps and its full forward. A one-token step sums in another order
    than a full pass, so the two sides differ by float32 rounding (a few 1e-5 on logits of
    magnitude ~10): the tolerance is 1e-4, where a wrong position or cache entry is off by 0.1
    or more."""
    target, exported = pair[0], hf_pair[0]
    x = val[1000 : 1000 + 96][None]
    with torch.inference_mode():
        full = target(x)[0]
        ours_cache = target.new_cache()
        ours = [target(x[:, :32], ours_cache)[0]]
        out = exported(x[:, :32], use_cache=True)
        steps = [out.logits[0]]
        cache = _out_cache(out)
        for i in range(32, 96):  # one token at a time, HF's cache growing
            out = exported(x[:, i : i + 1], **_cache_kw(exported, cache))
            cache = _out_cache(out)
            steps.append(out.logits[0])
            ours.append(target(x[:, i : i + 1], ours_cache)[0])
        block = exported(x[:, 32:37], **_cache_kw(exported, _out_cache(exported(x[:, :32]))))
    steps, ours = torch.cat(steps), torch.cat(ours)
    torch.testing.assert_close(steps, ours, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(steps, full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(block.logits[0], full[32:37], rtol=1e-4, atol=1e-4)
    assert (steps[1:] - full[:-1]).abs().max() > 0.1  # one position off would show


def test_round_trip_keeps_every_weight_bit_for_bit(pair):
    for model in pair:
        back = hf.from_hf(hf.to_hf(model))
        assert back.config == model.config and back.vocab == model.vocab
        a, b = model.state_dict(), back.state_dict()
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
        assert back.lm_head.weight is back.transformer.wte.weight  # still tied


def test_save_and_load_a_local_folder(pair, tmp_path, val):
    paths = hf.export_pair(tmp_path)
    loaded, tok = hf.from_pretrained(paths["target"])
    text = "ROMEO:\nWhat light through yonder window breaks?"
    ids = tok(text)["input_ids"]
    assert ids == CharTokenizer(pair[0].vocab).encode(text).tolist()
    assert tok.decode(ids) == text
    back = hf.from_hf(loaded)
    for key, v in pair[0].state_dict().items():
        assert torch.equal(back.state_dict()[key], v), key
    with pytest.raises(FileNotFoundError, match="specdec-course export --format hf"):
        hf.from_pretrained(tmp_path / "missing")


def test_from_hf_refuses_a_gpt2_it_cannot_express(hf_pair):
    import transformers

    cfg = transformers.GPT2Config(
        vocab_size=65, n_positions=32, n_embd=16, n_layer=1, n_head=2, eos_token_id=None
    )  # GPT-2's default activation: the tanh approximation
    with pytest.raises(ValueError, match="gelu_new"):
        hf.from_hf(transformers.GPT2LMHeadModel(cfg))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        hf.from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="not both"):
        hf.hf_generate(hf_pair[0], torch.tensor([0]), 4, assistant=hf_pair[1], prompt_lookup=3)


@pytest.mark.parametrize(
    "how",
    [
        {},
        {"mode": "fixed", "k": 4},
        {"mode": "heuristic", "k": 5},
        {"mode": "default"},
        {"prompt_lookup": 7},
    ],
    ids=["plain", "assisted-fixed", "assisted-heuristic", "assisted-default", "prompt-lookup"],
)
def test_greedy_hf_generate_gives_the_package_tokens(pair, hf_pair, val, how):
    target = pair[0]
    opts = dict(how)
    if "mode" in opts:
        opts["assistant"] = hf_pair[1]
    for start in (0, 20000):
        prompt = val[start : start + 32]
        ref = decoding.generate(target, prompt, 120, temperature=0)
        got = hf.hf_generate(hf_pair[0], prompt, 120, temperature=0, **opts)
        assert torch.equal(got, ref), f"first difference at {int((got != ref).nonzero()[0])}"


def _joint_exact(model, prompt):
    """p(x1) * p(x2 | x1) after ``prompt`` at temperature 1, from forward passes, [V * V]."""
    V = model.config.vocab_size
    with torch.inference_mode():
        p1 = process_logits(model(prompt[None])[0, -1]).double()
        seqs = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], dim=1)
        p2 = process_logits(model(seqs)[:, -1]).double()
    joint = p1[:, None] * p2
    return (joint / joint.sum()).flatten()


def test_hf_assisted_sampling_follows_the_exact_two_character_law(pair, hf_pair):
    """1,000 runs of HF's assisted generate (one drafted token, then the bonus or the
    residual's token, then a plain step after a rejection) at temperature 1, against
    p(x1) p(x2 | x1) of the CharGPT target; the same counts fail against the draft's law,
    so the test can tell the two apart at this sample size."""
    target, draft = pair
    H, D = hf_pair
    V = target.config.vocab_size
    prompt = torch.tensor([0])  # a newline: each run is three or four forwards
    counts = torch.zeros(V * V, dtype=torch.long)
    torch.manual_seed(5)  # HF samples from torch's global generator
    for _ in range(1000):
        out = hf.hf_generate(H, prompt, 2, temperature=1.0, assistant=D, mode="fixed", k=1)
        counts[out[1] * V + out[2]] += 1
    res = stats.chi_square_test(counts, _joint_exact(target, prompt))
    assert res.false_failure_rate < 1e-12
    assert res.passed, str(res)
    wrong = stats.chi_square_test(counts, _joint_exact(draft, prompt))
    assert not wrong.passed, str(wrong)


def test_export_command_writes_both_folders(pair, tmp_path, capsys):
    from specdec_course.cli import main

    assert main(["export", "--format", "hf", str(tmp_path / "pair")]) == 0
    said = capsys.readouterr()
    assert "wrote draft" in said.out and "shards" not in said.err + said.out  # no progress bars
    draft, _ = hf.from_pretrained(tmp_path / "pair" / "draft")
    assert draft.config.n_layer == pair[1].config.n_layer
    assert draft.generation_config.eos_token_id is None and draft.config.pad_token_id is None


def test_race_runs_every_method_and_greedy_tokens_agree(pair, hf_pair, val):
    from specdec_course.bench import hf_race as bench_hf
    from specdec_course.drafts.distilled import load_distilled
    from specdec_course.drafts.ngram import NgramDraft

    ks = bench_hf.race_ks(0.0)
    methods = bench_hf.build_race(*pair, NgramDraft(), load_distilled(), *hf_pair, ks)
    assert list(methods) == [*bench_hf.HF_METHODS, *bench_hf.PACKAGE_METHODS]
    race = bench_hf.measure_hf_race(
        methods, [val[:32]], temperature=0, repeats=1, max_new_tokens=12
    )
    assert all(race["identical"].values()), race["identical"]
    rows = {r["method"]: r for r in race["rows"]}
    assert rows["hf plain"]["speedup_hf_plain"] == 1.0 and rows["plain"]["speedup_own_plain"] == 1.0
    assert "HF" in bench_hf.format_hf_table(race)
