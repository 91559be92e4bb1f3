"""Moved to ``specdec_course.drafts`` (``drafts.proposer``, ``drafts.model_draft``,
``drafts.noise``). Kept only for ``llm/draft.py``'s import of ``draft_noise``, until that
line reads ``from ..drafts.noise import draft_noise``; then delete this file."""

from ..drafts.noise import draft_noise

__all__ = ["draft_noise"]
