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

``ModelProposer`` wraps a ``CharGPT`` draft; ``specdec_course.ngram.NgramDraft`` counts
characters instead. ``audit_proposer`` checks empirically that a proposer's drafts follow the
``q`` it reports: one that lies breaks exactness, and this is how to catch it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch

from .._validate import check_ids, check_int, check_real
from ..fast import check_cuda_graphs, draft_step, steps_for
from ..model import CharGPT, check_model
from ..sampling import NoiseBlocks, SamplingOptions

__all__ = [
    "Proposer",
    "ModelProposer",
    "as_proposer",
    "audit_proposer",
    "draft_noise",
    "softmax_rows",
]


def softmax_rows(logits: np.ndarray, out: np.ndarray, ones: np.ndarray) -> np.ndarray:
    """The softmax of each row of ``logits`` (``[k, V]``, NumPy) written into ``out``: a
    NumPy draft's ``q``. ``ones`` is a ``[V]`` vector of ones of ``out``'s dtype (the row
    sums are one dot product: NumPy's axis reductions cost several microseconds at this
    size). ``-inf`` logits (filtered out) give 0. Returns ``out``."""
    np.subtract(logits, logits.max(axis=1, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= (out @ ones)[:, None]
    return out


def draft_noise(sampling, generator, max_new_tokens: int, k: int, V: int, device, host=False):
    """A draft's Gumbel noise, ``k`` rows per proposal, drawn in blocks of 16 proposals as
    the run uses them (``sampling.NoiseBlocks``; NumPy views with ``host``, CPU only);
    ``None`` at temperature 0 or ``k = 0``. There are never more proposals than new tokens
    (an iteration emits at least one)."""
    if sampling.greedy or k < 1:
        return None
    limit = max(max_new_tokens, 1) * k
    return NoiseBlocks(
        V, limit, block=16 * k, generator=generator, device=device, gumbel=True, host=host
    )


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


class ModelProposer:
    """A ``CharGPT`` draft as a proposer: ``k`` cached forward calls per proposal.

    The draft cache holds a prefix ``x[0..m-1]`` of the committed text with ``m`` in
    ``{n-2, n-1}``: a proposal first feeds the one or two missing tokens (the catch-up;
    for a one-layer draft, all but the last are a look-up and a cache write). After a
    commit of ``n`` tokens the cache is cropped to
    ``min(its length, n - 1)``: after full acceptance the draft never fed its own last
    draft, which becomes part of the next catch-up.

    ``p_min`` (optional) is a confidence stop (Hugging Face's ``assistant_confidence_threshold``,
    llama.cpp's ``--draft-p-min``): after drafting token ``j``, stop the proposal if the
    draft's top probability there was below ``p_min`` (``q``'s maximum; at temperature 0 the
    softmax of the raw logits). The low-confidence draft is kept (its step is paid for; the
    target's extra position is nearly free). It depends on the draft's own distributions
    only, so sampling stays exact; it costs one transfer per draft step.

    Steps are ``fast.draft_step(model)``: for a one-layer draft ``fast.folded.FoldedStep`` (one
    token; everything but the attention one look-up of a table, the output projection folded into
    the cached values; logits written in place; on a CPU it runs in NumPy,
    ``fast.numpy_steps.NumpyFolded``), else ``fast.lean_step(model)``. The draft cache is that
    step's (``ModelProposer.cache``; a ``FoldedCache`` for one layer). Sampling is Gumbel-max over
    the processed logits, with one noise row per draft taken from ``draft_noise``'s blocks (``k``
    rows per proposal); ``q`` is the softmax of the same processed logits over all drafted rows
    (with the NumPy step, in NumPy into one buffer: ``q`` is then a view of it, valid until the next
    proposal). ``cuda_graphs=True`` replays each step as a CUDA graph instead (``fast.graphs``,
    without the look-up: the step is recorded whole); ``device`` is the model's.
    """

    def __init__(self, model: CharGPT, *, cuda_graphs: bool = False, p_min: float | None = None):
        self.model = check_model(model, "draft")
        if p_min is not None:
            check_real(p_min, "p_min (a probability, or None)", low=0.0, high=1.0)
        if p_min is not None and cuda_graphs:
            raise ValueError(
                "p_min (the confidence stop) runs eager steps; use it without cuda_graphs"
            )
        self.p_min = p_min
        self.vocab_size = model.config.vocab_size
        self.device = model.lm_head.weight.device
        self.cuda_graphs = cuda_graphs
        if cuda_graphs:
            check_cuda_graphs(self.device)
        self.cache = self.steps = None

    def start(self, ids, n, sampling, generator, max_new_tokens, k) -> None:
        model = self.model
        self.sampling = sampling
        # Identity processing (temperature 1, no filters, or greedy): no op per draft.
        self.processed = sampling.changes_logits
        # The catch-up feeds one or two tokens: graphed steps for T = 1 and 2.
        self.steps = steps_for(model, "draft", 2, True) if self.cuda_graphs else None
        # One-token steps, the model's cheapest (fast.draft_step: a one-layer draft's
        # fast.folded.FoldedStep); a graph records the step whole instead.
        self.lean = draft_step(model) if self.steps is None else None
        self.cache = self.lean.new_cache() if self.steps is None else self.steps.cache
        if n > 1:  # everything but the pending last token, as the target
            if self.lean is None:
                model(ids[None, : n - 1], self.cache)
            else:  # a one-layer draft's prefill is a look-up of its keys and values
                self.lean.feed(ids[: n - 1], self.cache)
        V, w = self.vocab_size, model.lm_head.weight
        self.logits = torch.empty(max(k, 1), V, dtype=w.dtype, device=w.device)
        # On a CPU the Gumbel-max draw runs in NumPy over the same memory (one add and one
        # argmax of 65 floats cost less there than two tensor ops); the same IEEE float32
        # sum and first-index argmax, so the same tokens.
        host = self.steps is None and w.device.type == "cpu"
        host = host and w.dtype in (torch.float32, torch.float64)  # dtypes NumPy has
        self._logits_np = self.logits.numpy() if host else None
        # The draft's NumPy step, where it has one (fast.numpy_steps: a one-layer CPU draft),
        # and the buffer its q is written into (a tensor view per k, made once).
        self._host = getattr(self.lean, "np_step", None) if host else None
        if self._host is not None:
            q = torch.empty(max(k, 1), V, dtype=w.dtype)
            self._q_np, self._q_views = q.numpy(), [q[:j] for j in range(max(k, 1) + 1)]
            self._ones = np.ones(V, self._q_np.dtype)
        self.noise = draft_noise(sampling, generator, max_new_tokens, k, V, w.device, host)
        self.calls = 0
        self._views_of = None

    def _views(self, out: torch.Tensor) -> list:
        # Per draft position j: its logits row, its output slot and the next call's input.
        # The loop passes the same buffer every time, so the views are built once.
        if self._views_of is not out:
            lg = self.logits
            self._view_list = [
                (lg[j : j + 1], out[j : j + 1], out[None, j : j + 1]) for j in range(out.numel())
            ]
            self._views_of = out
            self._out_np = out.numpy() if self._logits_np is not None else None
            if self._out_np is None:
                self._host = None  # the NumPy step writes its drafts through this view
        return self._view_list

    def propose(self, ids, n, k, out):
        if self.steps is not None:
            return self._propose_graphed(ids, n, k, out)
        lean, cache, p_min = self.lean, self.cache, self.p_min
        views = self._views(out)
        noise = None if self.noise is None else self.noise.take(k)
        self.calls += 1
        # The catch-up: committed tokens the cache lacks (one or two), the last of which
        # drafts; for a one-layer draft feeding one is writing its keys and values.
        for m in range(cache.length, n - 1):
            lean.feed(ids[m : m + 1], cache)
        host = self._host
        if host is not None and p_min is None:
            return self._propose_host(host, int(ids[n - 1]), k, noise)
        lean.step(ids[n - 1 : n], cache, views[0][0])
        lg_np, out_np = self._logits_np, self._out_np
        for j in range(k):
            row, slot, _ = views[j]
            if self.processed:
                row.copy_(self.sampling.logits(row))
            if noise is None:
                torch.argmax(row, dim=-1, out=slot)
            elif lg_np is not None:  # NumPy views of the logits, the noise and the slot
                out_np[j] = (lg_np[j] + noise[j]).argmax()
            else:
                torch.argmax(row + noise[j], dim=-1, out=slot)
            if p_min is not None and float(row.softmax(-1).amax()) < p_min:
                k = j + 1  # the confidence stop: this draft is the proposal's last
                break
            if j + 1 < k:
                lean.step(slot, cache, views[j + 1][0])
        return k, (None if noise is None else self.logits[:k].softmax(-1))

    def _propose_host(self, host, tok: int, k: int, noise):
        # propose() with the NumPy step (fast.numpy_steps.NumpyFolded): logits rows, the drafts and
        # the noise are all NumPy views; the same first-index argmax as torch's. q is the
        # softmax of the same processed logits, in NumPy into one buffer, returned as the
        # same tensor view for the same k (the loop then reuses its NumPy view of it).
        cache, lg, out, views = self.cache, self._logits_np, self._out_np, self._view_list
        for j in range(k):
            host.step(tok, cache, lg[j])
            if self.processed:
                row = views[j][0]
                row.copy_(self.sampling.logits(row))
            tok = int(lg[j].argmax() if noise is None else (lg[j] + noise[j]).argmax())
            out[j] = tok
        if noise is None:
            return k, None
        softmax_rows(lg[:k], self._q_np[:k], self._ones)
        return k, self._q_views[k]

    def _propose_graphed(self, ids, n, k, out):
        # propose() with each step a graph replay that returns the logits themselves.
        steps, views = self.steps, self._views(out)
        noise = None if self.noise is None else self.noise.take(k)
        self.calls += 1
        logits = steps(ids[None, steps.cache.length : n])[-1:]
        for j in range(k):
            row, slot, nxt = views[j]
            row.copy_(self.sampling.logits(logits) if self.processed else logits)
            if noise is None:
                torch.argmax(row, dim=-1, out=slot)
            else:
                torch.argmax(row + noise[j], dim=-1, out=slot)
            if j + 1 < k:
                logits = steps(nxt)
        return k, (None if noise is None else self.logits[:k].softmax(-1))

    def commit(self, ids, n) -> None:
        cache = self.cache
        if cache.length > n - 1:
            cache.crop(n - 1)


def as_proposer(draft, *, cuda_graphs: bool = False) -> Proposer:
    """``draft`` as a proposer: a ``CharGPT`` is wrapped in ``ModelProposer`` (its steps
    graphed with ``cuda_graphs=True``); a proposer is returned as it is."""
    if isinstance(draft, CharGPT):
        return ModelProposer(draft, cuda_graphs=cuda_graphs)
    if isinstance(draft, Proposer):
        return draft
    raise ValueError(
        "draft must be a CharGPT or a proposer (an object with vocab_size, start, propose "
        f"and commit; see specdec_course.decoding.proposer); got {type(draft).__name__}"
    )


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
