"""Dynamic draft length: how many tokens to draft next, decided from what has happened so far.

A fixed ``k`` is right on average and wrong most of the time: after a run of easy text the
draft could have gone further, after a hard spot every draft past the first was wasted. Two
places can change ``k`` without touching exactness:

- **Inside the proposer**, from the draft's own distributions: a *confidence stop* ends the
  proposal when the draft's top probability falls below ``p_min``, keeping the unsure draft
  (Hugging Face's ``assistant_confidence_threshold``, 0.4 by default, checks the token just
  drafted and keeps it; llama.cpp's ``--draft-p-min`` checks the top candidate before adding
  it and drops it, ``ConfidenceStop(..., keep=False)``): ``ModelProposer(draft, p_min=0.4)``.
  The drafts and their ``q`` are still what the draft sampled; only how many there are
  depends on them. One rule serves every proposer that
  stops so (``drafts.noise.ConfidenceStop``; the real model's feature draft judges the
  chain's product with it, ``stop_below``).
- **In the loop**, before each proposal: a *k policy* (``speculative_generate(...,
  k_policy=...)``) says how many to ask for, fed only the past iterations' outcomes (how
  many were drafted, how many accepted).

Why exactness survives: the verifier makes the token at every position exact *whatever* the
drafts were, given the text before it. The number of drafts is a function of that text, of
the draft's randomness and of earlier iterations: all fixed before the target is consulted
on the new block. What would break it is a rule that looks at the target's verdict on the
drafts before deciding how many to keep (the tests and lesson 08 show a chi-square failing).

Policies (objects with ``start(k_max)``, ``next_k() -> int`` and ``update(drafted,
accepted)``):

``FixedK``
    ``k_max`` every time: the loop's default, a fixed ``k``.

``HeuristicK``
    Hugging Face's ``num_assistant_tokens_schedule="heuristic"``: +2 after an iteration that
    accepted every draft, -1 (to at least 1) otherwise. The package's one k schedule: prompt
    lookup (``llm.lookup.PromptLookup``, ``grow=True``) learns its length with it too.
``ControllerK``
    the running estimate of alpha (accepted / (accepted + rejections), the maximum-likelihood
    estimate ``SpecStats.acceptance_rate`` uses, with a weak prior) turned into a ``k`` by
    ``theory.optimal_gamma(alpha, c, k_max)``, with ``c`` the measured cost of one more
    draft in target-step units (``bench.dynamic.marginal_cost``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .. import theory
from .._validate import check_int, check_real, is_int

__all__ = ["KPolicy", "FixedK", "HeuristicK", "ControllerK", "check_policy"]


@runtime_checkable
class KPolicy(Protocol):
    """How many drafts to ask for next, from past outcomes only (see the module docstring)."""

    def start(self, k_max: int) -> None: ...

    def next_k(self) -> int: ...

    def update(self, drafted: int, accepted: int) -> None: ...


def check_policy(policy) -> KPolicy:
    """``policy``, checked on every call: a ValueError now unless it has ``start``,
    ``next_k`` and ``update``, and one naming it whenever its ``next_k()`` returns anything
    but an int >= 0 (2.5 or None would otherwise fail deep in the loop)."""
    if not isinstance(policy, KPolicy):
        raise ValueError(
            "k_policy must have start(k_max), next_k() and update(drafted, accepted) (see "
            f"specdec_course.decoding.dynamic); got {type(policy).__name__}"
        )
    return _Checked(policy)


class _Checked:
    """A k policy whose ``next_k()`` answers are checked (one type test per iteration)."""

    __slots__ = ("policy", "start", "update", "_next_k")

    def __init__(self, policy):
        self.policy = policy
        self.start, self.update, self._next_k = policy.start, policy.update, policy.next_k

    def next_k(self) -> int:
        k = self._next_k()
        if type(k) is int and k >= 0:
            return k
        if is_int(k) and k >= 0:
            return int(k)
        raise ValueError(
            f"k_policy {self.policy!r}: next_k() returned {k!r} ({type(k).__name__}); it must "
            "return an int >= 0, the number of drafts to ask for next"
        )


class FixedK:
    """No policy: ``k_max`` drafts every time (``speculative_generate``'s default)."""

    __slots__ = ("k",)

    def start(self, k_max: int) -> None:
        self.k = k_max

    def next_k(self) -> int:
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        pass


class HeuristicK:
    """Hugging Face's heuristic schedule: ``k + 2`` after a fully accepted proposal, else
    ``k - 1``, kept within ``1 .. k_max``.

    ``initial`` is the first ``k`` (Hugging Face's original default, 5; capped at the loop's
    ``k``, which is ``k_max``). The schedule persists over one generation (``start`` resets
    it), as Hugging Face's "heuristic" does within a call. Raises ValueError for a
    non-positive ``initial``, ``increase`` or ``decrease``.
    """

    def __init__(self, initial: int = 5, *, increase: int = 2, decrease: int = 1):
        self.initial = check_int(initial, "initial")
        self.increase = check_int(increase, "increase")
        self.decrease = check_int(decrease, "decrease")
        self.k_max = self.k = initial

    def start(self, k_max: int) -> None:
        self.k_max = k_max
        self.k = min(self.initial, k_max)

    def next_k(self) -> int:
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:  # the loop's last, draft-free iteration says nothing
            return
        if accepted == drafted:
            self.k = min(self.k + self.increase, self.k_max)
        else:
            self.k = max(self.k - self.decrease, 1)

    def __repr__(self) -> str:
        return f"HeuristicK(initial={self.initial}, +{self.increase}/-{self.decrease})"


class ControllerK:
    """``k = optimal_gamma(alpha_hat, c, k_max)``, with ``alpha_hat`` the running estimate.

    ``c``: the cost of one more drafted token in units of a one-token target step, as
    measured on this machine (``bench.dynamic.marginal_cost``: the draft's step plus what
    one more position adds to the target's call). ``alpha_hat`` is (accepted +
    ``prior_weight * prior_alpha``) / (accepted + rejections + ``prior_weight``): the
    acceptance counted as ``SpecStats.acceptance_rate`` counts it (a draft after the first
    rejection is never looked at), pulled towards ``prior_alpha`` until evidence piles up.
    ``memory`` (iterations) makes the counts decay by ``1 - 1/memory`` per iteration, so
    the estimate follows the text; ``None`` keeps every count. The ``k`` for each alpha is
    read from a table built at ``start`` (101 values of alpha), so a step costs a look-up.
    It never returns 0 (speculation off), though ``optimal_gamma`` may: with no drafts the
    estimate could never recover; 1 keeps measuring. Raises ValueError for a negative or
    infinite ``c``, a ``prior_alpha`` outside [0, 1] or a non-positive ``prior_weight``.
    """

    def __init__(
        self,
        c: float,
        *,
        prior_alpha: float = 0.5,
        prior_weight: float = 2.0,
        memory: int | None = None,
    ):
        self.c = check_real(c, "c", low=0.0, hint=" (the cost of a drafted token / a target step)")
        self.prior_alpha = check_real(prior_alpha, "prior_alpha", low=0.0, high=1.0)
        self.prior_weight = check_real(prior_weight, "prior_weight", low=0.0, low_open=True)
        self.memory = None if memory is None else check_int(memory, "memory")
        self.k_max = 1
        self._table = [1] * 101

    def start(self, k_max: int) -> None:
        self.k_max = k_max
        self.accepted = self.looked = 0.0
        self._table = [
            max(1, theory.optimal_gamma(i / 100, self.c, k_max)) if k_max else 0 for i in range(101)
        ]

    @property
    def alpha(self) -> float:
        """The current estimate of alpha."""
        w = self.prior_weight
        return (self.accepted + w * self.prior_alpha) / (self.looked + w)

    def next_k(self) -> int:
        return self._table[round(100 * min(1.0, self.alpha))]

    def update(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        if self.memory is not None:
            keep = 1.0 - 1.0 / self.memory
            self.accepted *= keep
            self.looked *= keep
        self.accepted += accepted
        self.looked += accepted + (accepted < drafted)

    def __repr__(self) -> str:
        return f"ControllerK(c={self.c:.3f}, memory={self.memory})"
