"""The draft model as a proposer: ``ModelProposer`` wraps a ``CharGPT`` (or another course
decoder) and drafts with its cheapest cached step (``fast.draft_step``), as
``drafts.proposer`` describes."""

from __future__ import annotations

import torch

from .._validate import check_real
from ..fast import check_cuda_graphs, draft_step, steps_for
from ..model import CharGPT, check_model
from .noise import ConfidenceStop, DraftSampler

__all__ = ["ModelProposer"]


class ModelProposer:
    """A ``CharGPT`` draft as a proposer: ``k`` cached forward calls per proposal.

    The draft cache holds a prefix ``x[0..m-1]`` of the committed text with ``m`` in
    ``{n-2, n-1}``: a proposal first feeds the one or two missing tokens (the catch-up;
    for a one-layer draft, all but the last are a look-up and a cache write). After a
    commit of ``n`` tokens the cache is cropped to
    ``min(its length, n - 1)``: after full acceptance the draft never fed its own last
    draft, which becomes part of the next catch-up.

    ``p_min`` (optional) is a confidence stop, Hugging Face's ``assistant_confidence_threshold``
    (llama.cpp's ``--draft-p-min`` drops the unsure candidate instead of keeping it): after
    drafting token ``j``, stop the proposal if the
    draft's top probability there was below ``p_min`` (``q``'s maximum; at temperature 0 the
    softmax of the raw logits). The low-confidence draft is kept (its step is paid for; the
    target's extra position is nearly free). It depends on the draft's own distributions
    only, so sampling stays exact; it costs one transfer per draft step (``noise.ConfidenceStop``,
    the rule ``llm.draft``'s ``stop_below`` shares).

    Steps are ``fast.draft_step(model)``: for a one-layer draft ``fast.folded.FoldedStep`` (one
    token; everything but the attention one look-up of a table, the output projection folded into
    the cached values; logits written in place; on a CPU it runs in NumPy,
    ``fast.numpy_steps.NumpyFolded``), else ``fast.lean_step(model)``. The draft cache is that
    step's (``ModelProposer.cache``; a ``FoldedCache`` for one layer). Each token and its ``q``
    come from ``noise.DraftSampler``: Gumbel-max over the processed logits, one noise row per
    draft (``k`` rows per proposal), ``q`` the softmax of the same processed logits over all
    drafted rows (with the NumPy step, in NumPy into one buffer: ``q`` is then a view of it,
    valid until the next proposal). ``cuda_graphs=True`` replays each step as a CUDA graph
    instead (``fast.graphs``, without the look-up: the step is recorded whole); ``device`` is
    the model's.
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
        w = model.lm_head.weight
        # On a CPU the Gumbel-max draw runs in NumPy over the same memory (one add and one
        # argmax of 65 floats cost less there than two tensor ops); the same IEEE float32
        # sum and first-index argmax, so the same tokens.
        host = self.steps is None and w.device.type == "cpu"
        host = host and w.dtype in (torch.float32, torch.float64)  # dtypes NumPy has
        V = self.vocab_size
        self.sampler = DraftSampler(sampling, generator, max_new_tokens, k, V, like=w, host=host)
        self.logits = self.sampler.logits
        # The draft's NumPy step, where it has one (fast.numpy_steps: a one-layer CPU draft).
        self._host = getattr(self.lean, "np_step", None) if host else None
        self.stop = None if self.p_min is None else ConfidenceStop(self.p_min)
        self.calls = 0
        self._views_of = None

    def _views(self, out: torch.Tensor) -> list:
        # Per draft position j: its output slot and the next call's input. The loop passes
        # the same buffer every time, so the views are built once.
        if self._views_of is not out:
            self._view_list = [(out[j : j + 1], out[None, j : j + 1]) for j in range(out.numel())]
            self._views_of = out
            host = self.sampler.logits_np is not None
            self._out_np = out.numpy() if host else None
            if self._out_np is None:
                self._host = None  # the NumPy step writes its drafts through this view
        return self._view_list

    def propose(self, ids, n, k, out):
        if self.steps is not None:
            return self._propose_graphed(ids, n, k, out)
        lean, cache, stop, smp = self.lean, self.cache, self.stop, self.sampler
        views = self._views(out)
        smp.begin(k)
        self.calls += 1
        # The catch-up: committed tokens the cache lacks (one or two), the last of which
        # drafts; for a one-layer draft feeding one is writing its keys and values.
        for m in range(cache.length, n - 1):
            lean.feed(ids[m : m + 1], cache)
        host = self._host
        if host is not None and stop is None:
            return self._propose_host(host, int(ids[n - 1]), k)
        lean.step(ids[n - 1 : n], cache, smp.row(0))
        out_np = self._out_np
        if stop is not None:
            stop.start()
        for j in range(k):
            slot = views[j][0]
            if out_np is not None:  # NumPy views of the logits, the noise and the slot
                out_np[j] = smp.draw_host(j)
            else:
                smp.draw(j, slot)
            if stop is not None:
                cut = stop.cut(j, float(smp.row(j).softmax(-1).amax()))
                if cut is not None:
                    k = cut  # the confidence stop: this draft is the proposal's last
                    break
            if j + 1 < k:
                lean.step(slot, cache, smp.row(j + 1))
        return k, smp.q(k)

    def _propose_host(self, host, tok: int, k: int):
        # propose() with the NumPy step (fast.numpy_steps.NumpyFolded): logits rows, the drafts and
        # the noise are all NumPy views; the same first-index argmax as torch's. q is the
        # softmax of the same processed logits, in NumPy into one buffer, returned as the
        # same tensor view for the same k (the loop then reuses its NumPy view of it).
        smp, cache, out = self.sampler, self.cache, self._out_np
        lg = smp.logits_np
        for j in range(k):
            host.step(tok, cache, lg[j])
            tok = out[j] = smp.draw_host(j)
        return k, smp.q_host(k)

    def _propose_graphed(self, ids, n, k, out):
        # propose() with each step a graph replay that returns the logits themselves.
        steps, views, smp = self.steps, self._views(out), self.sampler
        smp.begin(k)
        self.calls += 1
        logits = steps(ids[None, steps.cache.length : n])[-1:]
        for j in range(k):
            slot, nxt = views[j]
            smp.row(j).copy_(logits)
            smp.draw(j, slot)
            if j + 1 < k:
                logits = steps(nxt)
        return k, smp.q(k)

    def commit(self, ids, n) -> None:
        cache = self.cache
        if cache.length > n - 1:
            cache.crop(n - 1)
