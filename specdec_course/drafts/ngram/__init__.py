"""A draft that costs nothing: a character n-gram model counted from the training text.

An ``order``-gram predicts the next character from the ``order - 1`` before it. Counts come
from the corpus's training split only (never validation), smoothed by interpolated absolute
discounting (Ney, Essen & Kneser 1994): with ``c(h, w)`` the count of character ``w`` after
the context ``h``, ``c(h)`` their sum and ``N1(h)`` the number of distinct ``w`` seen after
``h``,

    P(w | h) = max(c(h, w) - D, 0) / c(h)  +  D * N1(h) / c(h) * P(w | h')

where ``h'`` drops the oldest character of ``h``; the recursion ends at the unigram,
interpolated the same way with the uniform distribution, so every character has mass. A
context never seen in training backs off to its longest seen suffix. Every distribution is
rounded to multiples of 2^-24 that sum to exactly 1 (``stats.round_probs``), so that the
``q`` the draft reports is, to the bit, the distribution it samples from (exact in float32,
exactly summed in any order): sampled speculation stays lossless.

As a proposer (``decoding.speculative_generate(target, NgramDraft(), ...)``) a drafted token
costs a dictionary look-up and a binary search over a precomputed cumulative row: about a
microsecond, against hundreds for a model step. ``NgramDraft()`` with no arguments is the
default: the order and discount chosen by measured acceptance against the shipped target on
validation text (``bench.order_sweep``; lesson 07).
"""

from __future__ import annotations

from .counts import find_sorted
from .ngram_draft import DEFAULT_DISCOUNT, DEFAULT_ORDER, NgramDraft

__all__ = [
    "DEFAULT_ORDER",
    "DEFAULT_DISCOUNT",
    "NgramDraft",
    "find_sorted",
]
