"""How the speculative loop scores with the target: one call over the pending token and the drafts.

Leviathan et al.'s step 2 is "run the target on the ``k + 1`` prefixes in parallel". With a
KV cache that is one forward over ``k + 1`` new tokens: the last committed token (not yet in
the cache: it is *pending*) followed by the drafts. ``TargetScorer`` holds that input,
written in place (``drafts`` is where the proposer writes), the target's cache and the step
that extends it, chosen once for the run:

- the model's eager step (``fast.lean.LeanStep``, or its NumPy twin with
  ``executor="numpy"``), through ``fast.graphs.EagerSteps``; or the CUDA-graph replay
  (``fast.graphs.StaticSteps``) with ``cuda_graphs=True``;
- ``FeatureScorer`` for a proposer that reads the target's features (EAGLE-style drafts,
  ``proposer``'s ``observe_target``): the same eager step, split at the last hidden state
  so that the features are passed on before the logits are computed from them.

The cache invariant (the module docstring of ``speculative``): with ``n`` committed tokens
the cache holds ``x[0..n-2]``; ``commit(n, token)`` crops it back to ``n - 1`` (a pointer
move: positions past it, the rejected drafts, are overwritten by the next call) and makes
``token`` the next call's pending token.
"""

from __future__ import annotations

import torch

from ..fast import steps_for
from ..model import CharGPT

__all__ = ["TargetScorer", "FeatureScorer", "target_scorer"]


class TargetScorer:
    """The target's calls for one run: ``prefill(out, n)`` once, then ``scorer(kk)`` -> logits
    ``[kk + 1, V]`` of the pending token and the ``kk`` drafts in ``drafts[:kk]`` (a buffer
    the next call overwrites), and ``commit(n, token)`` after each verdict."""

    def __init__(self, target: CharGPT, k: int, cuda_graphs: bool = False, numpy: bool = False):
        self.target = target
        self.step = steps_for(target, "target", k + 1, cuda_graphs, numpy)
        self.cache = self.step.cache
        dev = target.lm_head.weight.device
        self.feed = torch.empty(1, k + 1, dtype=torch.long, device=dev)  # pending, drafts
        self.drafts = self.feed[0, 1:]
        self.feeds = [self.feed[:, : j + 1] for j in range(k + 1)]  # the input for j drafts
        # The pending token is written through a NumPy view on a CPU: a tensor's item
        # assignment costs microseconds.
        self._pending = self.feed.numpy()[0] if dev.type == "cpu" else self.feed[0]

    def prefill(self, out: torch.Tensor, n: int) -> None:
        """The prompt ``out[:n]`` into the cache, all but its last token (the pending one)."""
        if n > 1:
            self._prefill(out[: n - 1])
        self.feed[0, 0] = out[n - 1]

    def _prefill(self, prompt: torch.Tensor) -> None:
        self.target(prompt[None], self.cache)

    def __call__(self, kk: int) -> torch.Tensor:
        return self.step(self.feeds[kk])

    def commit(self, n: int, token: int) -> None:
        """``n`` tokens are committed, the last of them ``token``: roll the cache back."""
        self._pending[0] = token
        self.cache.crop(n - 1)


class FeatureScorer(TargetScorer):
    """A ``TargetScorer`` that passes the target's last hidden states to
    ``proposer.observe_target`` (``feature_layers`` wide) after the prefill and every call,
    before the logits are computed from them: the eager step's own arithmetic, split."""

    def __init__(self, target: CharGPT, k: int, proposer):
        super().__init__(target, k)
        self.observe = proposer.observe_target
        self.layers = getattr(proposer, "feature_layers", 1)  # several blocks' (EAGLE-3 style)
        self.lean = self.step.lean

    def _prefill(self, prompt: torch.Tensor) -> None:
        # The prompt's features too: the proposer need not compute them again.
        self.observe(self.lean.hidden(prompt, self.cache, layers=self.layers), 0)

    def __call__(self, kk: int) -> torch.Tensor:
        start = self.cache.length
        hidden = self.lean.hidden(self.feeds[kk][0], self.cache, layers=self.layers)
        self.observe(hidden, start)
        return self.lean.logits(hidden, self.step.out[: kk + 1])


def target_scorer(
    target: CharGPT, proposer, k: int, cuda_graphs: bool, numpy: bool = False
) -> TargetScorer:
    """The scorer for ``proposer``: a ``FeatureScorer`` when it has ``observe_target``, else
    a ``TargetScorer`` (graphed with ``cuda_graphs``, in NumPy with ``numpy``). Raises
    ValueError for a proposer that observes the target with ``cuda_graphs`` or ``numpy`` (its
    step is the eager tensor one)."""
    if getattr(proposer, "observe_target", None) is None:
        return TargetScorer(target, k, cuda_graphs, numpy)
    if cuda_graphs:
        raise ValueError("a proposer with observe_target runs eager steps; drop cuda_graphs")
    if numpy:
        raise ValueError("a proposer with observe_target reads tensor features: executor='torch'")
    return FeatureScorer(target, k, proposer)
