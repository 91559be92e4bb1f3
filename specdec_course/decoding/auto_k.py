"""``k="auto"``: draft as many tokens as pay on this machine, now, including none.

Leviathan et al.'s speedup (Theorem 3.8, ``theory.speedup``) is expected tokens per
iteration over the cost of an iteration. ``AutoK`` evaluates that ratio from live figures,
in seconds, for every ``k`` from 0 (a plain decoding step: one target call over one token,
no proposal) to ``k_max``, and drafts the ``k`` with the most expected tokens per second:

    rate(k) = E[tokens | k] / (draft(k) + target(k))

- ``E[tokens | k] = 1 + sum_{j<=k} alpha_1 ... alpha_j`` (``expected_tokens_by_depth``), the
  per-depth form of ``theory.expected_tokens``: ``alpha_d`` is the rate at which a proposal
  that reached depth ``d`` (every earlier draft accepted) has its ``d``-th draft accepted,
  counted online from the accepted counts. A draft the proposer did not make (prompt lookup
  without a match, a confidence stop) counts as not accepted, so the rate is what asking for
  ``k`` yields, whatever the proposer does.
- ``target(k)``: the seconds of the target's call and what follows it (verification,
  commit): a plain step where the proposer drafts nothing, else a call over ``1 + E[drafted
  | drafted > 0]`` tokens, with ``E[drafted]`` from the same chain for "the proposer drafted
  depth ``d``"; ``draft(k)``: the seconds of a proposal asked for ``k`` tokens.
- The seconds come from the wall clock around the calls the loop makes anyway
  (``CallCosts``): the median of each size's last calls, read along a line through the
  sizes timed (a call's cost grows about affinely in its tokens) or along a measured cost
  curve passed as ``costs`` (its shape, scaled to what this run times). A plain step and a
  call that verifies drafts are timed apart: verifying has a fixed cost of its own.

Four rules keep it from costing time: it changes ``k`` only when the new ``k`` is expected to
be ``hysteresis`` (10%) faster than the current one, so noise does not make it flap (except
that it stops drafting as soon as plain steps are expected to be faster at all); after
choosing ``k = 0`` it probes ``probe_k`` drafts once every ``probe_every`` plain steps (the
interval doubling, up to 64, while probes do not pay), so a prompt that becomes copyable is
noticed for a few percent of a step; its estimates forget (``memory``) so they follow the
text and the machine's load; and it evaluates the rule at most once per ``rethink_seconds``
(and after each probe), so on a model whose step takes microseconds the rule itself does
not. The run's first call (warming up) and a proposal right after plain steps (a draft
model catching up on them) are not timed as costs.

The output stays exactly the target's law: ``k`` is a function of earlier iterations only,
fixed before the target sees the new drafts (``decoding.dynamic``'s argument). At
temperature > 0 the same seed can give different text from run to run, since ``k`` follows
the clock; at temperature 0 the text is the target's greedy text whatever ``k`` is.
"""

from __future__ import annotations

import bisect
import weakref
from collections import deque

from .._validate import check_int, check_real

__all__ = ["AutoK", "CallCosts", "expected_tokens_by_depth", "remembered"]

K_MAX = 8  # the most drafts k="auto" asks for


def expected_tokens_by_depth(alphas) -> float:
    """Expected tokens of one iteration that drafts ``len(alphas)`` tokens, ``alphas[d - 1]``
    the acceptance rate at depth ``d`` given every earlier draft was accepted:
    ``1 + sum_j prod_{d <= j} alphas[d - 1]``. With every ``alpha_d = alpha`` it is
    ``theory.expected_tokens(alpha, len(alphas))``, ``(1 - alpha**(k + 1)) / (1 - alpha)``."""
    total = reach = 1.0
    for a in alphas:
        reach *= a
        total += reach
    return total


def _median(values) -> float:
    ordered = sorted(values)
    m = len(ordered) // 2
    return ordered[m] if len(ordered) % 2 else 0.5 * (ordered[m - 1] + ordered[m])


class CallCosts:
    """Seconds per call, as an affine function of the call's size, fitted to what was timed.

    ``observe(size, seconds)`` adds one call to its size's last ``window`` (8); a size's
    cost is the median of those (a busy machine deschedules a call now and then for tens of
    times its cost: a median ignores that, a mean would follow it; the ratio of two sizes'
    costs, which is what decides, is the same either way). A size's first call is clipped
    at ``clip`` times what the others (or ``guess``) predict. A size's calls are counted
    with a decay of ``1/memory`` per call of any size, and a size not timed
    for a long while is forgotten. ``cost(size)`` reads the Theil-Sen line ``a + b * size``
    through the medians, each capped at a smaller size's scaled by their ratio (the median
    slope between two sizes, ``b >= 0``; with one size timed, ``b`` is
    ``prior_slope`` times its cost over its size: 1 makes the cost proportional to the
    size, as for a draft model's proposal, one step per token). With ``curve``
    (``{size: seconds}``, a cost curve measured before, here or elsewhere) the costs follow
    the curve's shape, scaled by the median ratio of what is timed to it (where the curve
    has no size, the line through it)."""

    def __init__(self, *, window=8, clip=2.0, memory=32, prior_slope=0.1, curve=None):
        self.window, self.clip, self.prior_slope = window, clip, prior_slope
        self.keep = 1.0 - 1.0 / memory
        self.curve = dict(curve or {})
        self.mean: dict[int, float] = {}  # the median of each size's window
        self.count: dict[int, float] = {}
        self.recent: dict[int, deque] = {}
        self._line = None

    def observe(self, size: int, seconds: float, guess: float | None = None) -> None:
        count, recent = self.count, self.recent
        for s in list(count):
            count[s] *= self.keep
            if count[s] < 0.05 and s != size:  # not timed for ~3 memories: forgotten
                del count[s], recent[s], self.mean[s]
        window = recent.get(size)
        if window is None:
            guess = self.cost(size) if self.mean else guess
            if guess is not None:
                seconds = min(seconds, self.clip * guess)
            window = recent[size] = deque(maxlen=self.window)
            count[size] = 0.0
        window.append(seconds)
        count[size] += 1.0
        self.mean[size] = _median(window)
        self._line = None

    def line(self) -> tuple | None:
        """``(a, b, scale)``: ``cost(size) = a + b * size`` where ``scale`` is None, else
        ``scale`` times the curve at ``size`` (None while nothing is timed or given)."""
        if self._line is None and (self.mean or self.curve):
            self._line = self._fit()
        return self._line

    def _fit(self) -> tuple:
        # Theil-Sen: the median of the slopes between every two sizes timed, and the median
        # intercept under it; one size's stale or unlucky median cannot tilt it (a
        # least-squares line through three or more sizes would follow it).
        pts = sorted(self.mean.items())
        # A call over more tokens costs at most proportionally more than one over fewer:
        # each median is capped by every smaller size's, scaled by the sizes' ratio.
        for i in range(1, len(pts)):
            s, c = pts[i]
            pts[i] = (s, min([c] + [c0 * s / s0 for s0, c0 in pts[:i]]))
        if self.curve:
            ratios = [c / self.curve[s] for s, c in pts if self.curve.get(s, 0) > 0]
            if ratios or not pts:
                return 0.0, 0.0, (_median(ratios) if ratios else 1.0)
        if len(pts) == 1:
            s, c = pts[0]
            b = self.prior_slope * c / s
            return c - b * s, b, None
        b = max(
            0.0,
            _median(
                [(c1 - c0) / (s1 - s0) for i, (s0, c0) in enumerate(pts) for s1, c1 in pts[i + 1 :]]
            ),
        )
        return _median([c - b * s for s, c in pts]), b, None

    def cost(self, size: float) -> float | None:
        """Estimated seconds of a call of ``size`` (fractional sizes too); None while
        nothing is timed or given."""
        line = self.line()
        if line is None:
            return None
        a, b, scale = line
        if scale is None:
            return max(0.0, a + b * size)
        sizes = sorted(self.curve)  # the curve's line between (or beyond) its nearest sizes
        if len(sizes) == 1:
            return scale * self.curve[sizes[0]]
        j = min(max(bisect.bisect(sizes, size), 1), len(sizes) - 1)
        s0, s1 = sizes[j - 1], sizes[j]
        c0, c1 = self.curve[s0], self.curve[s1]
        return scale * max(0.0, c0 + (c1 - c0) * (size - s0) / (s1 - s0))

    def table(self, top: int) -> list[float] | None:
        """``[cost(0), ..., cost(top)]``, or None while nothing is timed or given."""
        if self.line() is None:
            return None
        return [self.cost(size) for size in range(top + 1)]


class AutoK:
    """The ``k`` policy of ``speculative_generate(..., k="auto")`` (module docstring).

    A ``decoding.dynamic`` policy (``start``, ``next_k``, ``update``) that is also metered:
    the loop's recorder calls ``observe(asked, drafted, accepted, draft_seconds,
    target_seconds)`` after every iteration with the wall-clock seconds of the proposal and
    of the target's call with its verification, read from ``clock`` (None: the device's
    wall clock, ``devices.clock``; a test passes its own, or calls ``observe`` itself).

    - ``rates()``: the expected tokens per second of ``k = 0 .. k_max`` from the current
      estimates; ``choose()``: the ``k`` to draft next (the best rate, taken only if it beats
      the current ``k``'s by ``hysteresis``, the current ``k`` dropped for 0 as soon as
      plain steps are expected to be faster; a probe while at 0); ``alphas``: the per-depth
      acceptance estimates.
    - ``costs``: an optional measured cost curve of the target, ``{tokens per call:
      seconds}`` (e.g. a bench's), read for its shape until this run measures each size.
    - ``prior_alpha`` (0.5), with the weight of ``prior_weight`` (1) iterations, is the
      first depth's acceptance before evidence; a deeper depth's prior is the estimate of
      the depth above it. ``draft_prior`` (0.05): a drafted token's cost, in one-token
      target calls, until a proposal is timed. ``memory`` (32): observations of a depth
      or size after which old ones weigh ``1/e``.
    - ``probe_k`` (1) drafts once every ``probe_every`` (8) plain steps after it has chosen
      0, the interval doubling after each probe that leaves it at 0, up to ``probe_max``.
    - ``rethink_seconds`` (0.002): while drafting, the rule is evaluated again once this
      much time has been timed since it last was (every iteration on the real model).

    Estimates persist across ``start`` (the costs are the machine's); the acceptance is
    kept as a prior of at most ``carry_weight`` (4) observations per depth, since the next
    text may be another kind; each generation starts at the best ``k`` they give, without
    hysteresis. Raises ValueError for out-of-range options.
    """

    def __init__(
        self,
        *,
        costs=None,
        clock=None,
        hysteresis: float = 0.1,
        probe_every: int = 8,
        probe_max: int = 64,
        probe_k: int = 1,
        prior_alpha: float = 0.5,
        prior_weight: float = 1.0,
        draft_prior: float = 0.05,
        memory: int = 32,
        carry_weight: float = 4.0,
        rethink_seconds: float = 0.002,
    ):
        self.hysteresis = check_real(hysteresis, "hysteresis", low=0.0)
        self.probe_every = check_int(probe_every, "probe_every")
        self.probe_max = check_int(probe_max, "probe_max", minimum=self.probe_every)
        self.probe_k = check_int(probe_k, "probe_k")
        self.prior_alpha = check_real(prior_alpha, "prior_alpha", low=0.0, high=1.0)
        self.prior_weight = check_real(prior_weight, "prior_weight", low=0.0, low_open=True)
        self.draft_prior = check_real(draft_prior, "draft_prior", low=0.0)
        self.memory = check_int(memory, "memory")
        self.carry_weight = check_real(carry_weight, "carry_weight", low=0.0)
        self.rethink_seconds = check_real(rethink_seconds, "rethink_seconds", low=0.0)
        if costs is not None:
            costs = {
                check_int(n, "costs' sizes"): check_real(c, "costs' seconds", low=0.0)
                for n, c in dict(costs).items()
            }
        self.clock = clock
        # A plain step (one token, no drafts to verify) and a call that verifies drafts
        # (n >= 2 tokens) are timed apart: the second carries a fixed cost of its own
        # (verification, commit), which a line through both would read as a cost per token.
        self.step = CallCosts(curve=costs, memory=self.memory)
        self.call = CallCosts(curve=costs, memory=self.memory)
        self.draft = CallCosts(prior_slope=0.5, memory=self.memory)
        self.prior_slope = 0.1  # a token's share of a plain step while one call size is timed
        self.keep = 1.0 - 1.0 / self.memory  # the acceptance counts' decay per observation
        # Per depth d (index d - 1): decayed counts of proposals that reached it, of those
        # whose d-th draft was accepted, of those that asked for it and of those that drafted it.
        self.reached: list[float] = []
        self.hits: list[float] = []
        self.asked: list[float] = []
        self.made: list[float] = []
        self.k_max = 0
        self.choice = 0  # the k chosen (0: plain steps)
        self.k = 0  # the k asked for next: the choice, or a probe

    # --------------------------------------------------------------- the policy protocol

    def start(self, k_max: int) -> None:
        """A new generation of at most ``k_max`` drafts per iteration."""
        grow = k_max - len(self.reached)
        for counts in (self.reached, self.hits, self.asked, self.made):
            counts.extend([0.0] * max(0, grow))
        for total, part in ((self.reached, self.hits), (self.asked, self.made)):
            for d, t in enumerate(total):
                if t > self.carry_weight:  # carry at most carry_weight observations
                    part[d] *= self.carry_weight / t
                    total[d] = self.carry_weight
        self.k_max = k_max
        self.plain_steps, self.interval = 0, self.probe_every
        self.warm, self.since, self.decided, self.last_asked = False, 0.0, False, 0
        # A generation starts at the best k from what is known, without hysteresis (plain
        # steps first while no cost is): the hysteresis guards a choice against noise within
        # a run; across runs it would keep the last run's choice, and a run that ended at
        # plain steps (a text the draft could not follow, a burst of load) would start the
        # next at plain steps, to leave them only through rare probes.
        rates = self.rates()
        self.choice = max(range(len(rates)), key=rates.__getitem__) if rates else 0
        self.decided = bool(rates)
        self.k = self._next(False)

    def next_k(self) -> int:
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        pass  # everything is learnt in observe, which also hears how many were asked for

    # ---------------------------------------------------------------- what it measures

    def observe(self, asked, drafted, accepted, draft_seconds, target_seconds) -> None:
        """One iteration: ``asked`` drafts asked for, ``drafted`` made, ``accepted`` kept;
        the proposal took ``draft_seconds`` and the target's call over ``drafted + 1``
        tokens with its verification ``target_seconds``. Then ``choose`` the next ``k``."""
        # The run's first call pays for warming up, and a proposal right after plain steps
        # for catching up on them (a draft model feeds the tokens it missed): neither is a
        # cost per iteration.
        if self.warm:
            one = self.step.cost(1)  # a first time is clipped against it, if known
            if asked and self.last_asked:  # a drafted token costs at most about a step
                self.draft.observe(asked, draft_seconds, one and 0.5 * one * asked)
            if drafted:
                self.call.observe(drafted + 1, target_seconds, one and one * (1 + drafted))
            else:  # a plain step: what the loop did before the call is part of it
                self.step.observe(1, target_seconds + (0.0 if asked else draft_seconds))
        self.warm, self.last_asked = True, asked
        keep = self.keep
        reached, hits, asked_d, made = self.reached, self.hits, self.asked, self.made
        for d in range(min(asked, accepted + 1)):  # depths reached: every earlier one accepted
            reached[d] = reached[d] * keep + 1.0
            hits[d] = hits[d] * keep + (d < accepted)
        for d in range(min(asked, drafted + 1)):  # depths the proposer was asked to go on to
            asked_d[d] = asked_d[d] * keep + 1.0
            made[d] = made[d] * keep + (d < drafted)
        # The rule is evaluated once per rethink_seconds of iterations while drafting, and
        # after every probe; plain steps at a choice of 0 change only the one-token cost, so
        # the choice waits for the next probe. This keeps a step's overhead to microseconds.
        self.since += draft_seconds + target_seconds
        decide = self.since >= self.rethink_seconds if self.choice else asked > 0
        if decide or not self.decided:
            self.since = 0.0
        self.k = self._next(decide or not self.decided)

    # ---------------------------------------------------------------------- the rule

    @property
    def alphas(self) -> list[float]:
        """Per-depth acceptance estimates, depth 1 first (a missing draft counts as a
        rejection), each shrunk towards the depth above it."""
        return self._chain(self.reached, self.hits, self.prior_alpha)

    def _chain(self, total, part, prior) -> list[float]:
        w, out = self.prior_weight, []
        for d in range(self.k_max):
            prior = (part[d] + w * prior) / (total[d] + w)
            out.append(prior)
        return out

    def rates(self) -> list[float]:
        """Expected tokens per second for ``k = 0 .. k_max``: expected tokens per iteration
        over the expected seconds of one (``[]`` while no plain step is timed)."""
        one = self.step.cost(1)
        if one is None:
            return []
        draft = self.draft.table(self.k_max) if self.draft.mean else None
        call = self.call.cost
        if self.step.curve and not self.call.mean:  # the curve, scaled by the plain step
            call = self.step.cost
        elif self.call.line() is None:  # no call with drafts timed yet: the prior line
            call = lambda n: one * (1.0 + self.prior_slope * (n - 1))  # noqa: E731
        drawn = self._chain(self.asked, self.made, 1.0)
        rates, tokens, drafted, reach, go = [1.0 / one], 1.0, 0.0, 1.0, 1.0
        for k, (a, p) in enumerate(zip(self.alphas, drawn), start=1):
            reach *= a  # P(the first k drafts all accepted)
            tokens += reach
            go *= p  # P(the proposer drafts a k-th token)
            drafted += go  # expected drafts in the target's call
            # With probability 1 - P(a first draft) the iteration is a plain step; else a
            # call over 1 + E[drafts | some] tokens (affine: the mean size's cost).
            some = drawn[0]
            seconds = (1.0 - some) * one + (some * call(1.0 + drafted / some) if some else 0.0)
            seconds += self.draft_prior * one * k if draft is None else draft[k]
            rates.append(tokens / seconds)
        return rates

    def choose(self) -> int:
        """The ``k`` to draft next: the best rate's, if it beats the current choice's by the
        hysteresis (then it is the choice); at a choice of 0, a probe of ``probe_k`` every
        ``interval`` plain steps."""
        return self._next(True)

    def _next(self, decide: bool) -> int:
        if decide:
            rates = self.rates()
            if rates:
                self.decided = True
                cur = min(self.choice, self.k_max)
                if rates[cur] < rates[0]:  # never keep drafting where plain steps are faster
                    cur = 0
                best = max(range(len(rates)), key=rates.__getitem__)
                if rates[best] > (1.0 + self.hysteresis) * rates[cur]:
                    cur = best
                self.choice = cur
        if self.choice:
            self.plain_steps, self.interval = 0, self.probe_every
            return self.choice
        self.plain_steps += 1
        if self.plain_steps > self.interval:  # a probe: what drafting would give now
            self.plain_steps = 0
            self.interval = min(2 * self.interval, self.probe_max)
            return min(self.probe_k, self.k_max)
        return 0

    def __repr__(self) -> str:
        return f"AutoK(choice={self.choice}, k_max={self.k_max}, hysteresis={self.hysteresis})"


_REMEMBERED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def remembered(draft, target) -> AutoK:
    """The ``AutoK`` that ``k="auto"`` uses for ``draft`` (the object passed to the loop)
    with ``target``: the same one call after call, so what one generation measured (call
    costs, acceptance) starts the next; a fresh one for a draft that cannot be remembered."""
    try:
        ref, auto = _REMEMBERED.get(draft, (None, None))
    except TypeError:  # not weakly referable: nothing to remember it by
        return AutoK()
    if auto is None or ref() is not target:
        auto = AutoK()
        try:
            _REMEMBERED[draft] = (weakref.ref(target), auto)
        except TypeError:
            pass
    return auto
