"""Decoding with KV caches: plain (the baseline) and speculative, with any proposer.

``generate`` is plain decoding, one target call per token: the baseline every speedup is
measured against. ``speculative_generate`` is Leviathan et al. 2023 (arXiv:2211.17192),
Algorithm 1: a proposer drafts ``k`` tokens with the exact distribution of each, the target
scores all of them in one forward pass, and the verifier keeps the accepted prefix plus one
recovered or bonus token; the output is distributed exactly as ``generate``'s (and at
temperature 0 it is the same tokens). ``SpecStats`` counts what a call did.

Modules: ``plain`` (generate, the prompt check), ``speculative`` (the loop, as Algorithm 1)
and what it is given to decide once per run: ``scoring`` (how the target scores the
drafts), ``row_verifier`` (how a row is verified), ``recorder`` (``SpecStats``, timings,
callbacks), ``dynamic`` (how many tokens to draft: ``FixedK``, ``HeuristicK``,
``ControllerK``), ``auto_k`` (``k="auto"``: ``AutoK``, the k with the most expected tokens
per second from what this machine's calls cost, 0 included), ``threads`` (one thread for
timed runs unless told otherwise); ``spec_stats`` (``SpecStats``); ``batched`` (many rows
at once; its drafters in ``batch_drafts``). The drafts themselves (the ``Proposer``
interface, the draft model, n-grams, the EAGLE family) live in ``specdec_course.drafts``;
the cached steps the loops take in ``specdec_course.fast``.
"""

from .auto_k import AutoK
from .dynamic import ControllerK, HeuristicK, KPolicy
from .plain import caches_consistent, check_prompt, crop_caches, generate
from .spec_stats import SpecStats
from .speculative import speculative_generate

__all__ = [
    "SpecStats",
    "check_prompt",
    "generate",
    "speculative_generate",
    "caches_consistent",
    "crop_caches",
    "KPolicy",
    "HeuristicK",
    "ControllerK",
    "AutoK",
]
