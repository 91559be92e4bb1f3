"""The shipped chain drafts by name, as the benches and ``generate`` load them."""

from __future__ import annotations

__all__ = ["CHAIN_DRAFTS", "load_drafts"]

# Drafts that propose a chain of k tokens to speculative_generate (Medusa's trees are apart).
CHAIN_DRAFTS = ("draft", "ngram", "distilled", "eagle", "fused", "recurrent")


def load_drafts(target, names) -> dict:
    """``{name: draft}`` for the shipped drafts ``names`` (a subset of ``CHAIN_DRAFTS``) of the
    shipped ``target``: the draft model (``"draft"``), the counted and the distilled n-gram
    tables, and the EAGLE-style proposers (feature-level, fused and recurrent, the fused one
    over the same draft model). Raises ValueError for another name."""
    from ..model import load_pretrained

    unknown = [n for n in names if n not in CHAIN_DRAFTS]
    if unknown:
        raise ValueError(f"unknown drafts {unknown}; the shipped ones are {list(CHAIN_DRAFTS)}")
    drafts, model = {}, None
    if "draft" in names or "fused" in names:
        model = load_pretrained("draft")
    for name in names:
        if name == "draft":
            drafts[name] = model
        elif name == "ngram":
            from ..drafts.ngram import NgramDraft

            drafts[name] = NgramDraft()
        elif name == "distilled":
            from ..drafts.distilled import load_distilled

            drafts[name] = load_distilled()
        elif name == "eagle":
            from ..drafts.eagle import EagleProposer, load_eagle

            drafts[name] = EagleProposer(load_eagle(target=target), target)
        elif name == "recurrent":
            from ..drafts.eagle import RecurrentProposer, load_recurrent

            drafts[name] = RecurrentProposer(load_recurrent(target=target), target)
        else:
            from ..drafts.eagle import FusedProposer, load_fused

            drafts[name] = FusedProposer(load_fused(draft=model, target=target), model, target)
    return drafts
