"""Every draft in one place: what speculative decoding needs from one, and each kind there is.

``proposer``: the ``Proposer`` interface (``start``, ``propose``, ``commit``, the exact ``q``
of every draft), ``as_proposer`` and ``audit_proposer``; ``model_draft``: the draft model
(``ModelProposer``, a ``CharGPT`` drafting with its cheapest cached step); ``noise``: how
every sampling draft draws a token and reports its ``q`` (``DraftSampler``), and the one
confidence stop (``ConfidenceStop``); ``ngram``: counted character
n-grams (``NgramDraft``); ``distilled``: an n-gram table of the target's own means;
``eagle``: the drafts that read the target's features (EAGLE, the fused head, the
recurrent draft). Medusa's heads stay in ``specdec_course.medusa`` (they are a decoding
method of their own, with tree verification); the real LLM's drafts in ``llm``.
"""

from .model_draft import ModelProposer
from .ngram import NgramDraft
from .proposer import Proposer, as_proposer, audit_proposer

__all__ = ["Proposer", "ModelProposer", "as_proposer", "audit_proposer", "NgramDraft"]
