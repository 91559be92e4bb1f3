"""What speculative decoding needs from a draft: the ``Proposer`` interface, and the draft model.

A proposer drafts up to ``k`` tokens after the committed text and reports, for each, the exact
distribution ``q`` it was drawn from, after the same temperature / top-k / top-p processing
as the target's ``p``. That is all the verifier needs to make the output exact
(Leviathan et al. 2023, Appendix A.1): any ``q`` works, a better one is accepted more often.
The proposer is then told how many tokens were committed, so it can roll back what it
drafted past them. ``speculative_generate`` drives any object with these three methods:

``start(ids, n, sampling, generator, max_new_tokens, k)``
    a new generation: ``ids[:n]`` is the prompt, ``sampling`` the ``SamplingOptions``;
    draw any random numbers from ``generator`` (never from the target's).
``propose(ids, n, k, out) -> (kk, q)``
    draft ``kk <= k`` tokens continuing ``ids[:n]`` (the committed tokens) into
    ``out[:kk]`` (int64); ``q`` is float ``[kk, V]`` with row ``j`` the distribution draft
    ``j`` was sampled from, or ``None`` at temperature 0 (greedy drafts, one-hot ``q``).
    ``q`` may depend only on the committed text and the proposer's own randomness.
``commit(ids, n)``
    ``ids[:n]`` are now committed (some drafts accepted, one token of the target's own):
    forget state past them.
``observe_target(hidden, start)`` (optional)
    a proposer that reads the target's features (``eagle.EagleProposer``) defines it; the
    loop then passes the target's last hidden states ``hidden`` ``[T, n_embd]`` for
    positions ``start .. start + T - 1`` after the prefill of the prompt (``start`` 0,
    every prompt position but the last) and after every target call, before the verdict. Of
    those, the positions below ``n - 1`` at the next ``commit(ids, n)`` belong to committed
    text; the rest scored drafts that may have been rejected. Proposers without it cost
    the loop nothing. A proposer with ``feature_layers = m > 1`` gets ``[T, m * n_embd]``
    instead: the outputs of the ``m - 1`` blocks before the last, each LayerNorm-ed
    without weights, then the last hidden state (``eagle.target_features``' layout).

``target`` (optional attribute)
    the target the proposer was built for (``eagle.EagleProposer`` has one):
    ``speculative_generate`` refuses any other target on entry
    (``_validate.check_proposer_fits``, which also compares the characters behind the ids
    where the proposer declares them: a ``tokenizer`` or a ``vocab``).

``drafts.model_draft.ModelProposer`` wraps a ``CharGPT`` draft; ``drafts.ngram.NgramDraft`` counts
characters instead. ``audit_proposer`` checks empirically that a proposer's drafts follow the
``q`` it reports: one that lies breaks exactness, and this is how to catch it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from .._validate import check_ids, check_int, check_proposer_fits
from ..model import CharGPT
from ..sampling import SamplingOptions
from .model_draft import ModelProposer

__all__ = ["Proposer", "as_proposer", "fitted_proposer", "audit_proposer"]


@runtime_checkable
class Proposer(Protocol):
    """A draft that ``speculative_generate`` can drive (see the module docstring)."""

    vocab_size: int

    def start(
        self,
        ids: torch.Tensor,
        n: int,
        sampling: SamplingOptions,
        generator: torch.Generator | None,
        max_new_tokens: int,
        k: int,
    ) -> None: ...

    def propose(
        self, ids: torch.Tensor, n: int, k: int, out: torch.Tensor
    ) -> tuple[int, torch.Tensor | None]: ...

    def commit(self, ids: torch.Tensor, n: int) -> None: ...


def as_proposer(draft, *, cuda_graphs: bool = False) -> Proposer:
    """``draft`` as a proposer: a ``CharGPT`` is wrapped in ``ModelProposer`` (its steps
    graphed with ``cuda_graphs=True``); a proposer is returned as it is."""
    if isinstance(draft, CharGPT):
        return ModelProposer(draft, cuda_graphs=cuda_graphs)
    if isinstance(draft, Proposer):
        return draft
    raise ValueError(
        "draft must be a CharGPT or a proposer (an object with vocab_size, start, propose "
        f"and commit; see specdec_course.drafts.proposer); got {type(draft).__name__}"
    )


def fitted_proposer(draft, target, length: int, *, cuda_graphs: bool = False) -> Proposer:
    """``as_proposer(draft)``, checked to draft for ``target`` over ``length`` positions
    (``_validate.check_proposer_fits``: the vocabulary and its characters, the target it was
    built for, a draft model's context, the device); ValueError otherwise."""
    proposer = as_proposer(draft, cuda_graphs=cuda_graphs)
    check_proposer_fits(proposer, target, length=length)
    return proposer


@torch.inference_mode()
def audit_proposer(
    draft,
    prompt_ids,
    *,
    runs: int = 20_000,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
):
    """Does the proposer draft from the ``q`` it reports? A chi-square test of its first draft.

    Starts the proposer ``runs`` times on ``prompt_ids`` (1-D ids), each with a fresh seed,
    takes its first draft, and tests the drafts' histogram against the first reported ``q``
    (which must be the same in every run: it may depend only on the committed text). Returns
    ``stats.ChiSquareResult`` (``passed`` is False for a proposer that lies), or raises
    ValueError if the reported ``q`` changes from run to run or is not a distribution.
    A correct proposer fails by chance with the result's ``false_failure_rate``.
    """
    from ..stats import chi_square_test, counts

    proposer = as_proposer(draft)
    ids = check_ids(prompt_ids, "prompt_ids", proposer.vocab_size)
    n = ids.numel()
    check_int(runs, "runs")
    check_int(seed, "seed", minimum=0)
    smp = SamplingOptions(temperature, top_k, top_p)
    if smp.greedy:
        raise ValueError("temperature 0 drafts are deterministic; audit at temperature > 0")
    out = torch.empty(1, dtype=torch.long)
    q0, seen = None, []
    for r in range(runs):
        proposer.start(ids, n, smp, torch.Generator().manual_seed(seed + r), 1, 1)
        kk, q = proposer.propose(ids, n, 1, out)
        if kk < 1 or q is None:
            raise ValueError("the proposer drafted nothing at temperature > 0")
        if q0 is None:
            q0 = q[0].double().clone()
        elif not torch.equal(q[0].double(), q0):
            raise ValueError(
                "the proposer reported different q for the same committed text in two runs; "
                "q may depend only on the committed text"
            )
        seen.append(int(out[0]))
    return chi_square_test(counts(torch.tensor(seen), q0.numel()), q0 / q0.sum())
