"""Sampling at one position: the speculative accept/resample rule and logit processing.

The rule follows Leviathan et al. 2023 (arXiv:2211.17192), Algorithm 1 and Appendix A.1:
a token ``x`` drafted from ``q`` is accepted with probability ``min(1, p(x) / q(x))``; on
rejection a replacement is drawn from the residual ``norm(max(0, p - q))``. The output is then
distributed exactly as ``p``, whatever ``q`` is.

Random numbers are consumed in a fixed order so that a seeded ``torch.Generator`` reproduces a
run: the draft token (when sampled), then one float64 uniform, then the replacement.
"""

from __future__ import annotations

import math
import numbers
from typing import Literal

import numpy as np
import torch

from ._validate import ProbLike, check_optional_int, check_pair, check_real

__all__ = [
    "accepts",
    "residual_race",
    "residual_distribution",
    "speculative_sample",
    "speculative_output_distribution",
    "exponential_race",
    "exp_noise",
    "NoiseBlocks",
    "uniform_open_closed",
    "process_logits",
    "apply_temperature",
    "top_k_filter",
    "top_p_filter",
    "MIN_TEMPERATURE",
    "check_processing",
    "SamplingOptions",
]


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    r = (p - q).clamp_min(0)
    total = r.sum(dim=-1, keepdim=True)
    # p == q leaves no residual mass; a rejection then has probability 0, so any choice is
    # exact. We return p itself: it is what the output distribution must be, and a sampler
    # that falls back to it can never emit a token the target gives probability 0.
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p)


def accepts(u, q_x, p_x):
    """The accept test of Algorithm 1: is draft ``x`` kept, given ``u``, ``q(x)`` and ``p(x)``?

    ``u <= min(1, p(x) / q(x))`` written as ``p(x) > 0 and u * q(x) <= p(x)``: no division,
    no 0/0 where ``q(x) = 0``, and a token the target gives probability 0 is never kept
    (with ``u`` in (0, 1], ``uniform_open_closed``). The one rule of every Python path (this
    module's ``speculative_sample``, the verifiers, the decoding loops, Medusa's walk); the
    Triton kernel (``kernels.rejection``) writes it again, and tests pin it to these paths.

    Elementwise, on what the caller holds, without converting it: Python floats (a bool),
    tensors or NumPy arrays (a bool array; with float64 ``u`` the product and the comparison
    are float64, the float32 operands promoted exactly). ``q_x = 1.0`` is a one-hot draft.
    """
    return (p_x > 0) & (u * q_x <= p_x)


def residual_race(w, e, p):
    """The residual draw: the exponential race ``argmax(w / e)`` over the last axis.

    ``w`` the unnormalised residual ``max(p - q, 0)`` (or ``p`` itself for a bonus token;
    scores ``<= 0`` never win once one is positive, so a caller may skip the clamp), ``e``
    Exp(1) draws (float32, as ``w``), ``p`` the target's row. A row with no residual mass
    (every score ``<= 0``: ``p == q`` up to rounding) races over ``p`` instead, which is what
    ``residual_distribution`` defines the residual to be then; so every index drawn lies
    where ``p > 0``. The one race of every Python verifier (the Triton kernel writes it
    again; tests pin its tokens to ``verifier.rejection_sample``, which calls this).

    Tensors or NumPy arrays, one row ``[V]`` (returns an int) or a batch ``[B, V]``
    (returns the indices ``[B]``, keepdim-free). Ties go to the first index, as the kernel's.
    """
    scores = w / e
    if isinstance(scores, torch.Tensor):
        empty = scores.amax(dim=-1, keepdim=True) <= 0
        if bool(empty.any()):
            scores = torch.where(empty, p / e, scores)
        j = scores.argmax(dim=-1)
        return int(j) if j.dim() == 0 else j
    j = scores.argmax(-1)
    if scores.ndim == 1:
        return int(j) if scores.item(j) > 0.0 else int((p / e).argmax())
    empty = scores[np.arange(len(j)), j] <= 0
    if empty.any():
        j[empty] = (p[empty] / e[empty]).argmax(-1)
    return j


def residual_distribution(p: ProbLike, q: ProbLike) -> torch.Tensor:
    """The distribution a rejected position is resampled from: ``norm(max(p - q, 0))``.

    ``p`` (target) and ``q`` (draft) are 1-D probability vectors of the same length (tensor,
    numpy array or list). Returns a tensor of ``p``'s dtype (float64 for lists) that sums to 1.
    When ``p == q`` there is no residual mass (rejection never happens) and the function
    returns ``p``. Raises ``ValueError`` for bad shapes, NaN, negative or unnormalised input.
    """
    p, q = check_pair(p, q)
    return _residual(p, q)


def speculative_output_distribution(
    p: ProbLike,
    q: ProbLike,
    *,
    draft: Literal["sample", "greedy"] = "sample",
    resample: Literal["residual", "target"] = "residual",
) -> torch.Tensor:
    """Exact distribution of the token that :func:`speculative_sample` returns.

    accepted mass ``min(p, q_eff)`` plus rejected mass ``(1 - sum(min(p, q_eff)))`` times the
    resampling distribution, where ``q_eff`` is ``q`` or, for a greedy draft, one-hot at
    ``argmax(q)``. With ``resample="residual"`` this equals ``p`` (up to rounding).
    """
    p, q = check_pair(p, q)
    q_eff = _effective_draft(q, draft)
    accepted = torch.minimum(p, q_eff)
    beta = accepted.sum()
    if resample == "residual":
        resample_dist = _residual(p, q_eff)
    elif resample == "target":
        resample_dist = p
    else:
        raise ValueError(f"resample must be 'residual' or 'target', not {resample!r}")
    return accepted + (1 - beta) * resample_dist


def _effective_draft(q: torch.Tensor, draft: str) -> torch.Tensor:
    if draft == "sample":
        return q
    if draft == "greedy":
        return torch.nn.functional.one_hot(q.argmax(), q.shape[-1]).to(q.dtype)
    raise ValueError(f"draft must be 'sample' or 'greedy', not {draft!r}")


def uniform_open_closed(shape, *, generator: torch.Generator | None = None, device=None):
    """Float64 uniforms in (0, 1].

    float64, because float32 draws hit exactly 0.0 often enough to matter at scale, and
    ``u <= p(x) / q(x)`` with ``u == 0`` would accept a token the target gives probability 0.
    ``1 - U[0, 1)`` moves the closed end to 1, where it does no harm. The draws are made on
    ``generator``'s device (``device`` when there is none) and returned on ``device``.
    """
    where = _where(generator, device)
    u = 1.0 - torch.rand(shape, dtype=torch.float64, generator=generator, device=where)
    return _deliver(u, device)


def exp_noise(shape, *, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """Float32 Exp(1) draws for :func:`exponential_race`, clamped away from 0 (no 0/0).

    Like :func:`uniform_open_closed`, drawn on ``generator``'s device and returned on
    ``device``."""
    e = torch.empty(shape, dtype=torch.float32, device=_where(generator, device))
    e.exponential_(generator=generator).clamp_min_(torch.finfo(torch.float32).tiny)
    return _deliver(e, device)


class NoiseBlocks:
    """Exp(1) noise rows ``[V]`` (Gumbel rows with ``gumbel=True``), drawn in blocks as used.

    A decoding loop may need up to ``limit`` rows (one per possible draft, or per possible
    iteration) but uses far fewer: an iteration that accepts drafts uses one row for several
    tokens. Drawing all ``limit`` rows up front spends most of a speculative run's random-
    number time on rows never read (Exp(1) draws cost about 20 ns each on a CPU, and ``[200,
    8, 65]`` of them cost more than the whole run's verification). ``take(n)`` returns the
    next ``n`` rows ``[n, V]``, each row handed out once; a new block of ``block`` rows (at
    least ``n``, at most what ``limit`` leaves) is drawn from ``generator`` when the current
    one runs out, so the rows are independent draws whatever order they are taken in.
    ``host=True`` returns NumPy views instead (CPU only; the batch-1 verifier reads them).
    Raises ValueError when more than ``limit`` rows are taken.
    """

    def __init__(
        self,
        width: int,
        limit: int,
        *,
        block: int,
        generator: torch.Generator | None = None,
        device=None,
        gumbel: bool = False,
        host: bool = False,
    ):
        self.width, self.limit, self.block = width, limit, max(1, block)
        self.generator, self.device, self.gumbel, self.host = generator, device, gumbel, host
        self.drawn = 0
        self.buf = self._rows = None
        self.pos = 0

    def take(self, n: int):
        pos = self.pos
        if self.buf is None or pos + n > self.buf.shape[0]:
            self._refill(n)
            pos = 0
        self.pos = pos + n
        return self._rows[pos : pos + n]

    def row(self):
        """The next row ``[V]``: ``take(1)[0]``, without the slice."""
        pos = self.pos
        if self.buf is None or pos >= self.buf.shape[0]:
            self._refill(1)
            pos = 0
        self.pos = pos + 1
        return self._rows[pos]

    def _refill(self, n: int) -> None:
        rows = min(max(self.block, n), self.limit - self.drawn)
        if rows < n:
            raise ValueError(f"asked for more than the {self.limit} noise rows allowed")
        e = exp_noise((rows, self.width), generator=self.generator, device=self.device)
        self.buf = e.log_().neg_() if self.gumbel else e
        self._rows = self.buf.numpy() if self.host else self.buf
        self.drawn += rows


def _where(generator: torch.Generator | None, device) -> torch.device | None:
    # Random numbers are drawn where their generator lives: a seeded CPU generator then
    # gives the same numbers whatever device the models run on.
    return device if generator is None else generator.device


def _deliver(t: torch.Tensor, device) -> torch.Tensor:
    return t if device is None or t.device == torch.device(device) else t.to(device)


def exponential_race(
    weights: ProbLike,
    *,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
) -> int:
    """Sample an index with probability proportional to ``weights``, without normalising.

    With ``E_i`` independent Exp(1) draws, ``E_i / w_i`` is Exp(rate ``w_i``), the first of
    the "arrival times" is index ``i`` with probability ``w_i / sum(w)``, and so
    ``argmax(w / E)`` is a sample from ``norm(w)``. vLLM samples its recovered tokens this way:
    one pass over the vocabulary, no sum, no division by it. ``weights`` must be 1-D, finite,
    non-negative and not all zero; ``noise`` (optional) are the Exp(1) draws to use.
    """
    from ._validate import as_tensor

    w = as_tensor(weights, "weights")
    if w.dim() != 1 or w.numel() == 0:
        raise ValueError(f"weights must be a non-empty 1-D vector; got shape {tuple(w.shape)}")
    if not torch.isfinite(w).all() or (w < 0).any():
        raise ValueError("weights must be finite and >= 0")
    if not (w > 0).any():
        raise ValueError("weights are all zero; there is nothing to sample")
    if noise is None:
        noise = exp_noise(w.shape, generator=generator, device=w.device)
    elif noise.shape != w.shape or not (noise > 0).all():
        raise ValueError(f"noise must be positive Exp(1) draws of shape {tuple(w.shape)}")
    return int((w / noise.to(w.dtype)).argmax().item())


def speculative_sample(
    p: ProbLike,
    q: ProbLike,
    *,
    generator: torch.Generator | None = None,
    draft: Literal["sample", "greedy"] = "sample",
    resample: Literal["residual", "target"] = "residual",
) -> tuple[int, bool]:
    """Draft one token from ``q``, verify it against ``p``; return ``(token, accepted)``.

    ``draft="sample"`` draws ``x ~ q``; ``draft="greedy"`` proposes ``argmax(q)`` and verifies
    it as a one-hot ``q`` (accept with probability ``p(x)``). On rejection the token is redrawn
    from the residual (``resample="residual"``, exact) or from ``p`` (``resample="target"``,
    the tempting but biased rule, kept for teaching). Raises ``ValueError`` on bad input.
    """
    p, q = check_pair(p, q)
    q_eff = _effective_draft(q, draft)
    if resample not in ("residual", "target"):
        raise ValueError(f"resample must be 'residual' or 'target', not {resample!r}")
    if draft == "sample":
        x = int(torch.multinomial(q, 1, generator=generator))
    else:
        x = int(q.argmax())
    u = float(uniform_open_closed((), generator=generator))
    if accepts(u, float(q_eff[x]), float(p[x])):
        return x, True
    dist = _residual(p, q_eff) if resample == "residual" else p
    return int(torch.multinomial(dist, 1, generator=generator)), False


# ----------------------------------------------------------------------------- logits -> probs


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide logits by ``temperature`` (> 0). Temperature 0 is handled by ``process_logits``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 here; got {temperature}")
    return logits if temperature == 1.0 else logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Set every logit below the k-th largest (along the last axis) to -inf."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches ``top_p``.

    A token is dropped when the tokens ranked above it already hold at least ``top_p`` of the
    mass; the most likely token is always kept.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_before >= top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


# The smallest temperature that is not 0 (greedy). Logits are float32 (at most about 3.4e38)
# and divided by the temperature: below about 1e-36 a logit of 10 overflows to inf, and the
# softmax of inf - inf is NaN. 1e-6 leaves room for any logit a model here produces, and
# nothing below it samples differently from greedy decoding in practice.
MIN_TEMPERATURE = 1e-6


def check_processing(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """ValueError unless the options are a temperature of 0 (greedy) or a finite number
    >= ``MIN_TEMPERATURE``, top_k an int >= 1 (not a float: ``2.0`` and ``inf`` are refused)
    and top_p a number in (0, 1]; top_k and top_p may be None (no filter)."""
    t = temperature
    if (
        isinstance(t, bool)
        or not isinstance(t, numbers.Real)
        or not math.isfinite(t)
        or not (t == 0 or t >= MIN_TEMPERATURE)
    ):
        raise ValueError(
            f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE:g} "
            f"(smaller ones overflow the logits once divided by it); got {temperature!r}"
        )
    check_optional_int(top_k, "top_k (characters kept; None keeps all)")
    if top_p is not None:
        check_real(top_p, "top_p (None keeps all)", low=0.0, high=1.0, low_open=True)


def process_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Logits ``[..., V]`` -> the probabilities actually sampled from, in float32.

    Order as in vLLM: temperature, then top-k, then top-p, then softmax. ``temperature == 0``
    gives a one-hot vector at the argmax (greedy decoding; top-k/top-p do not change it).
    Both the draft's ``q`` and the target's ``p`` must go through the same processing.
    """
    check_processing(temperature, top_k, top_p)
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, int(top_k))
    if top_p is not None:
        logits = top_p_filter(logits, float(top_p))
    return logits.softmax(dim=-1)


class SamplingOptions:
    """Temperature / top-k / top-p, checked once, then applied with as few ops as possible.

    ``logits(x)`` returns the processed logits (filtered entries at -inf) whose softmax is
    the distribution sampled from; ``probs(x)`` that softmax. Sampling uses the Gumbel-max
    trick: ``argmax(logits + G)`` with ``G = -log(E)``, ``E ~ Exp(1)``, is an exact sample
    of ``softmax(logits)`` (the exponential race of lesson 01 in log space). The noise is
    drawn in bulk, once per call of ``generate`` / ``speculative_generate``, so a sampled
    token costs one addition and one argmax: no normalisation, no per-token random call.
    At temperature 0 the distribution is one-hot at the argmax and no noise is used.
    """

    def __init__(
        self, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
    ):
        check_processing(temperature, top_k, top_p)
        self.greedy = temperature == 0
        self.plain = top_k is None and top_p is None
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        # Greedy decoding only takes an argmax: the logits pass through unscaled.
        self.inv_t = 1.0 / temperature if temperature else 1.0
        # False when ``logits`` returns its input unchanged (temperature 1 or greedy, no
        # filters): a draft can then skip the call at every step.
        self.changes_logits = not ((self.plain or self.greedy) and self.inv_t == 1.0)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.plain or self.greedy:
            return x if self.inv_t == 1.0 else x * self.inv_t
        x = apply_temperature(x.float(), self.temperature)
        if self.top_k is not None:
            x = top_k_filter(x, int(self.top_k))
        if self.top_p is not None:
            x = top_p_filter(x, float(self.top_p))
        return x

    def probs(self, x: torch.Tensor) -> torch.Tensor:
        if self.greedy:
            return torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).float()
        return self.logits(x).softmax(-1)
