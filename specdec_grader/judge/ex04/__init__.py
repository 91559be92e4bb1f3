"""Checks of exercise 04: rolling the KV caches back after verification, and one full step.

Students implement, in ``exercises/ex04_rollback.ipynb``:

- ``rollback(lengths, prefix_lens, num_accepted) -> new_lengths``: a batch of ``B`` rows
  (int64 ``[B]`` each); row ``b``'s cache held ``prefix_lens[b]`` committed tokens and then
  the drafts it fed (``lengths[b]`` in all); keep the prefix and the row's accepted drafts
  (``prefix_lens + num_accepted``, a new tensor); a ``ValueError`` unless ``0 <=
  num_accepted[b] <= lengths[b] - prefix_lens[b]`` for every row;
- ``commit_tokens(ids, n, token_ids, num_accepted, target_lengths, draft_lengths) -> (ids,
  n, target_lengths, draft_lengths)``: the bookkeeping after the batched verifier: row ``b``
  appends ``token_ids[b, :a_b + 1]`` to its ``n[b]`` committed ids (``ids [B, L]``, padded),
  and its caches' new lengths are ``n'_b - 1`` (target) and ``min(draft_lengths[b], n'_b -
  1)`` (draft). Lesson 04's one-row commit (one count, one crop per cache) fails both;
- ``speculative_step(target, draft, ids, target_cache, draft_cache, k, verify, process,
  generator=None) -> new_ids``: one iteration of speculative decoding under the processing
  ``process(logits) -> probabilities`` (temperature, top-p): the draft feeds its catch-up
  ``ids[draft_cache.length:]`` and samples ``k`` drafts from the processed ``q``, the target
  scores the pending token and the drafts in one call and ``p`` is processed the same way,
  ``verify(draft_ids, q, p)`` decides, and both caches are rolled back. Lesson 04's loop
  (temperature 1, plain softmax) fails the steps whose processing is not the softmax.

The cache invariant is the package's (see :mod:`specdec_course.decoding`): with ``n``
committed tokens the target cache holds the first ``n - 1`` (the last one is pending), the
draft cache the first ``n - 1`` or, right after a full acceptance, ``n - 2``.

``rollback`` and ``commit_tokens`` are checked on lengths and ids alone. The step's checks use
two small random ``CharGPT`` models (fast and deterministic) and compare the
caches with a fresh run over the committed tokens (:func:`specdec_course.decoding.
caches_consistent`). ``speculative_step`` is called with a ``verify`` that forces the outcome
(a rejection in the middle, at the first draft, at the last, full acceptance) and checks
the ``q`` and ``p`` it receives against the models' processed distributions (the processing
changes from step to step); a last case runs the step at temperature 0 through
:func:`specdec_course.verifier.rejection_sample` and compares the output with
:func:`specdec_course.decoding.generate`'s greedy tokens.
"""

# isort: off
# Imported in this order on purpose: the checks register, and are reported and graded, in
# the order of the exercise.
from ._common import ATOL, DRAFT_CFG, TARGET_CFG, V
from .rollback import check_rollback
from .commit_tokens import check_commit_tokens
from .speculative_step import check_speculative_step

# isort: on

# Not in the sandbox while ex04 is graded (judge.withheld): the one-row crop of lesson
# 04's loop (the rule commit_tokens and rollback work out for a batch). The references drive
# the model and the rule the exercise's step is given.
PUBLIC_IMPLEMENTATIONS = ("specdec_course.decoding.plain.crop_caches",)
ALLOWED = {
    "specdec_course.model.CharGPT": "the models the step drives",
    "specdec_course.model.GPTConfig": "the models' configuration",
    "specdec_course.model.KVCache": "the cache the step keeps",
    "specdec_course.verifier.RejectionResult": "the rule's result type",
    "specdec_course.verifier.rejection_sample": "the rule, which the step is given as verify",
    "specdec_course.sampling.process_logits": "the processing, which the step is given",
    "specdec_course.decoding.generate": "plain decoding, the baseline",
    "specdec_course.decoding.caches_consistent": "compares two caches",
}

__all__ = [
    "ATOL",
    "DRAFT_CFG",
    "TARGET_CFG",
    "V",
    "check_commit_tokens",
    "check_rollback",
    "check_speculative_step",
]
