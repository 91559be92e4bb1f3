"""Decoding with KV caches: plain (the baseline) and speculative, with any proposer.

``generate`` is plain decoding, one target call per token: the baseline every speedup is
measured against. ``speculative_generate`` is Leviathan et al. 2023 (arXiv:2211.17192),
Algorithm 1: a proposer drafts ``k`` tokens with the exact distribution of each, the target
scores all of them in one forward pass, and the verifier keeps the accepted prefix plus one
recovered or bonus token; the output is distributed exactly as ``generate``'s (and at
temperature 0 it is the same tokens). ``SpecStats`` counts what a call did.

Modules: ``plain`` (generate, the prompt check), ``proposer`` (the interface, the draft
model, ``audit_proposer``), ``speculative`` (the loop, as Algorithm 1) and what it is
given to decide once per run: ``scoring`` (how the target scores the drafts),
``row_verifier`` (how a row is verified), ``recorder`` (``SpecStats``, timings, callbacks),
``dynamic`` (how many tokens to draft: ``FixedK``, ``HeuristicK``, ``ControllerK``);
``stats`` (``SpecStats``); ``batched`` (many rows at once; its drafters in
``batch_drafts``).
"""

from .dynamic import ControllerK, HeuristicK, KPolicy
from .plain import caches_consistent, check_prompt, generate
from .proposer import ModelProposer, Proposer, as_proposer, audit_proposer
from .speculative import speculative_generate
from .stats import SpecStats

__all__ = [
    "SpecStats",
    "check_prompt",
    "generate",
    "speculative_generate",
    "caches_consistent",
    "Proposer",
    "ModelProposer",
    "as_proposer",
    "audit_proposer",
    "KPolicy",
    "HeuristicK",
    "ControllerK",
]
