"""Checks of exercise 03: cached attention on a batch of ragged rows, and α.

Students implement, in ``exercises/ex03_char_lm.ipynb``:

- ``cached_attention(q, k, v, K, V, lengths)``: ``q, k, v`` ``[B, nh, T_new, hs]`` for the new
  tokens, ``K, V`` ``[B, nh, block_size, hs]`` preallocated buffers, ``lengths`` int64 ``[B]``:
  row ``b`` has its first ``lengths[b]`` positions filled (rows differ: after a rollback each
  kept its own accepted drafts) and stale values beyond. Write row ``b``'s ``k, v`` at
  ``lengths[b] .. lengths[b] + T_new - 1`` (in place), let its new token ``i`` attend to its
  positions ``0 .. lengths[b] + i`` only, and return ``(y, lengths + T_new)``;
- ``measure_alpha(target, draft, x, lengths, temperature)``: the mean over the *text*
  positions of the padded windows ``x`` ``[N, T]`` (row ``n`` holds ``lengths[n]`` tokens, then
  padding) of ``sum(min(p, q))``, ``p`` and ``q`` the two models' next-token distributions at
  ``temperature`` (0: one-hot argmax, so α is the argmax agreement); every text position
  counts once, so a longer row weighs more.

Lesson 03 writes cached attention for one shared length and measures α over full windows;
the ragged batch (one length per row, stale keys past the shorter rows; windows padded to
one length) is this exercise's variation (the rollback that leaves rows ragged is exercise
04's, graded there once), which the lesson's cells fail. The reference is the
package: one :class:`specdec_course.model.KVCache` per row, driven by the model's own
attention layer, and :func:`specdec_course.train.next_token_probs`. Everything is exact
arithmetic on random inputs (no sampling): logits compared to 1e-4, α and buffers to 1e-5.
"""

# isort: off
# Imported in this order on purpose: the checks register, and are reported and graded, in
# the order of the exercise.
from ._common import ATOL, CFG, LOGIT_ATOL
from .attention import SCHEDULES, check_cached_attention
from .alpha import check_measure_alpha

# isort: on

PUBLIC_IMPLEMENTATIONS: tuple[str, ...] = ()
ALLOWED = {
    "specdec_course.model.CharGPT": "the model whose attention the exercise re-derives",
    "specdec_course.model.GPTConfig": "the model's configuration",
    "specdec_course.model.load_pretrained": "the lesson's trained model",
    "specdec_course.train.next_token_probs": "the model's probabilities, for measure_alpha",
    "specdec_course.data.CharTokenizer": "data",
    "specdec_course.data.corpus_split": "data",
    "specdec_course.data.eval_windows": "data",
}

__all__ = [
    "ATOL",
    "CFG",
    "LOGIT_ATOL",
    "SCHEDULES",
    "check_cached_attention",
    "check_measure_alpha",
]
