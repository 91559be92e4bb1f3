"""Checks of exercise 11: prompt lookup, a draft that copies from the text with an exact q.

Students implement, in ``exercises/ex11_prompt_lookup.ipynb``, lesson 11's prompt lookup
(Saxena 2023; vLLM's n-gram draft) as two functions of the committed text:

- ``lookup_copy(context, k, min_n, max_n) -> list[int]``: the copy rule of
  ``specdec_course.llm.lookup.lookup``. For ``n`` from ``min(max_n, len(context) - 1)`` down
  to ``min_n``, the last ``n`` tokens are looked for earlier in the context, at a place with
  at least one token after it (it may overlap the last ``n`` tokens); the first ``n`` with
  such a place wins, and of its places the *earliest*. The drafts are the up to ``k`` tokens
  that follow it, as many as the context holds; none where no ``n`` matches;
- ``lookup_propose(context, k, vocab_size, min_n, max_n) -> (drafts [kk], q [kk, V])``: the
  same drafts and the distribution each was drawn from: one-hot, a 1 at ``drafts[j]``.

``lookup_copy`` is compared exactly with :func:`reference_copy` on named contexts (no match,
several matches, a longer match against a shorter earlier one, a match near the end or
overlapping the last n-gram, the ``min_n`` and ``max_n`` bounds) and 60 random ones; a wrong
answer is named by the slip it matches. ``lookup_propose`` is graded by an **audit** (the
drafts are the rule's, every row one-hot at its draft), by **greedy identity** (through
``decoding.speculative_generate`` on a small random target: plain greedy decoding's text, in
the reference proposer's number of target calls) and by a **chi-square test** at temperature
1 (1,200 runs of three new tokens against the target's exact joint law; its false-failure
rate, below 1e-6, is stated). The loop asks the student's function once per distinct
(context, k) and keeps the answer: the drafts are a function of the committed text.

The course's own rule lives in ``specdec_course.llm``, which the grader may not import (the
import-linter contract "Grading imports no ... real LLM"), so :func:`reference_copy` states
it once more; ``tests/test_grading_ex11.py`` pins it to ``llm.lookup.lookup``.
"""

# isort: off
# Imported in this order on purpose: the checks register, and are reported and graded, in
# the order of the exercise.
from .copy_rule import NAMED, check_lookup_copy, copy_variant, reference_copy, reference_propose
from .propose import LoopProposer, audit_rows, check_lookup_propose, exact_law

# isort: on

# Not in the sandbox while ex11 is graded: the real LLM's subpackage is in none
# (edition.LEFT_OUT); listed so that the copy scan flags a notebook that forwards to them.
PUBLIC_IMPLEMENTATIONS = (
    "specdec_course.llm.lookup.lookup",
    "specdec_course.llm.lookup.PromptLookup.propose",
)
ALLOWED = {
    "specdec_course.decoding.speculative_generate": "the loop the student's proposer is run "
    "through (lesson 04); it drafts nothing itself",
    "specdec_course.decoding.generate": "plain greedy decoding, which greedy identity compares "
    "with",
    "specdec_course.model.GPTConfig": "the shape of the small random target the loop runs",
    "specdec_course.stats.chi_square_test": "the statistics tool the checks use",
    "specdec_course.stats.counts": "a histogram",
}

__all__ = [
    "NAMED",
    "LoopProposer",
    "audit_rows",
    "check_lookup_copy",
    "check_lookup_propose",
    "copy_variant",
    "exact_law",
    "reference_copy",
    "reference_propose",
]
