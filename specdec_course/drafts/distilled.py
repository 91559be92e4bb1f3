"""A draft that costs nothing and agrees more: the n-gram table distilled from the target.

The counted n-gram (``ngram.NgramDraft``) estimates ``P(w | h)`` from how often ``w`` followed
``h`` in the training text. But the draft is judged by how well it matches the *target*
(acceptance ``alpha = sum(min(p, q))``), not the text, and the best ``q`` for a context is
close to the target's own ``p`` averaged over the places that context occurs. So: run the
target once over the training split and, for every context of ``order - 1`` characters seen
there, store the mean of the target's next-character distributions at its occurrences

    q(w | h) = mean over training positions t with x[t-L .. t-1] = h of p_target(w | x[<t])

(DistillSpec, Zhou et al. 2023, distils a neural draft towards the target the same way; here
the "training" is one forward pass and an average). A context never seen at full length backs
off to the counted model's rows, so every context has a distribution. The rows go through
``NgramDraft``'s tables unchanged (rounded to exact binary fractions), so drafting, the
reported ``q`` and exactness are the counted draft's: only the numbers in the rows differ.

On the shipped pair at order 5 this raises acceptance at temperature 1 from about 0.78 to about
0.85 on validation text, above the 1-layer draft model's, at the n-gram's cost of a
microsecond per drafted token. The means use training text only; validation is never read.

``DistilledNgramDraft.from_target(target)`` builds it (one forward pass over the training
split: about 20 s on a 2-core CPU); ``save`` / ``load`` keep it as a ``.npz`` file (float16
means, 5.6 MB at order 5); ``load_distilled()`` loads the shipped one (``data/checkpoints/
ngram_distilled.npz``, rebuilt by ``specdec-course train --preset ngram``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from .. import data as D
from ..devices import DeviceLike
from ..model import rebuild_command
from ..paths import checkpoints_dir
from .ngram import DEFAULT_DISCOUNT, DEFAULT_ORDER, NgramDraft, find_sorted

__all__ = ["DistilledNgramDraft", "target_means", "load_distilled", "DISTILLED_FILE"]

DISTILLED_FILE = "ngram_distilled.npz"


@torch.inference_mode()
def target_means(target, ids: torch.Tensor, order: int, *, skip: int = 32, batch: int = 64):
    """Mean target distribution after each context of ``order - 1`` characters in ``ids``.

    ``ids`` (1-D int64, training text) is cut into windows of the target's block size that
    overlap by ``skip`` characters; every position from the ``skip``-th of a window on (so
    each position once, with at least ``skip`` characters of the target's context) adds the
    target's next-character distribution (float64) to the mean of its context. Returns
    ``(codes, means, counts)``: sorted context codes (most recent character least
    significant, as ``NgramDraft``'s), ``means`` float64 ``[contexts, V]``, ``counts`` the
    occurrences averaged. Raises ValueError for an order below 2 or text shorter than a window.
    """
    if not isinstance(order, int) or order < 2:
        raise ValueError(f"order must be an int >= 2 (a context of at least 1 char); got {order!r}")
    L, V = order - 1, target.config.vocab_size
    W = target.config.block_size
    if not L <= skip < W:
        raise ValueError(f"skip must lie in [order - 1, block size); got {skip}")
    ids = torch.as_tensor(ids, dtype=torch.long)
    if ids.dim() != 1 or ids.numel() < W + 1:
        raise ValueError(f"ids must be 1-D and longer than the target's block size ({W})")
    dev = target.lm_head.weight.device
    starts = torch.arange(0, ids.numel() - W + 1, W - skip)
    windows = ids[starts[:, None] + torch.arange(W)]  # [n, W]
    # The context of every counted position (x[t-L .. t-1], most recent least significant),
    # known before any forward pass: each position's row in the sums.
    xn = windows.numpy()
    code = np.zeros((xn.shape[0], W - skip), dtype=np.int64)
    for j in range(L, 0, -1):
        code = code * V + xn[:, skip - j : W - j]
    uniq, inverse, counts = np.unique(code.ravel(), return_inverse=True, return_counts=True)
    where = torch.from_numpy(inverse.reshape(code.shape))
    sums = torch.zeros(uniq.size, V, dtype=torch.float64)
    for i in range(0, windows.shape[0], batch):
        x = windows[i : i + batch]
        p = target(x.to(dev)).double().softmax(-1)[:, skip - 1 : W - 1].cpu()  # predicts skip..
        sums.index_add_(0, where[i : i + batch].reshape(-1), p.reshape(-1, V))
    means = sums.numpy()
    return uniq, means / counts[:, None], counts


class DistilledNgramDraft(NgramDraft):
    """An ``NgramDraft`` whose full-length contexts predict the target's mean distribution.

    ``codes`` (sorted int64 context codes of ``order - 1`` characters) and ``means`` (``[n,
    V]`` non-negative rows, each summing to about 1) replace the counted rows of those
    contexts; every other context (shorter, or unseen) keeps the counted model's row, built
    from ``ids`` / ``text`` / the corpus's training split as ``NgramDraft`` builds it. Use
    ``from_target`` to compute the means, ``load`` / ``load_distilled`` to read them.
    """

    def __init__(
        self,
        codes,
        means,
        order: int = DEFAULT_ORDER,
        discount: float = DEFAULT_DISCOUNT,
        *,
        text: str | None = None,
        ids: torch.Tensor | None = None,
        device: DeviceLike = "cpu",
        meta: dict | None = None,
    ):
        codes = np.asarray(codes, dtype=np.int64)
        means = np.asarray(means, dtype=np.float64)
        V = len(D.VOCAB)
        if codes.ndim != 1 or means.shape != (codes.size, V):
            raise ValueError(
                f"codes must be [n] and means [n, {V}]; got {codes.shape} and {means.shape}"
            )
        bad = codes.size and (codes[0] < 0 or codes[-1] >= V ** (order - 1))
        if bad or np.any(np.diff(codes) <= 0):
            raise ValueError(
                f"codes must be sorted, distinct codes of contexts of {order - 1} characters"
            )
        if not np.isfinite(means).all() or (means < 0).any():
            raise ValueError("means must be finite and non-negative")
        sums = means.sum(axis=1, keepdims=True)
        if codes.size and np.abs(sums - 1.0).max() > 1e-2:
            raise ValueError("every row of means must sum to 1 (a distribution over characters)")
        self._codes, self._means = codes, means / np.where(sums > 0, sums, 1.0)
        del means, sums  # the caller's copy may go before the tables are built
        self.meta = dict(meta or {})
        super().__init__(order, discount, text=text, ids=ids, device=device)

    def _dist(self, contexts: np.ndarray, top: int) -> np.ndarray:
        # Full-length contexts with a mean take it; the counted rows are computed for the
        # others only (a few percent of the seen ones), not for every row and then replaced.
        if top != self.order - 1 or not self._codes.size:
            return super()._dist(contexts, top)
        rows, seen = find_sorted(self._codes, contexts)
        P = np.empty((contexts.size, self.vocab_size))
        P[seen] = self._means[rows[seen]]
        if not seen.all():
            P[~seen] = super()._dist(contexts[~seen], top)
        return P

    @classmethod
    def from_target(
        cls,
        target,
        order: int = DEFAULT_ORDER,
        discount: float = DEFAULT_DISCOUNT,
        *,
        ids: torch.Tensor | None = None,
        device: DeviceLike = "cpu",
    ) -> DistilledNgramDraft:
        """Count ``ids`` (default: the corpus's training split) and distil ``target`` on them."""
        t0 = time.perf_counter()
        if ids is None:
            ids, _ = D.corpus_split()
        codes, means, counts = target_means(target, ids, order)
        meta = {  # what the distillation saw; save adds the settings
            "contexts": int(codes.size),
            "positions": int(counts.sum()),
            "distil_seconds": time.perf_counter() - t0,
        }
        return cls(codes, means, order, discount, ids=ids, device=device, meta=meta)

    def save(self, path: str | Path) -> Path:
        """Write the codes, the means (float16) and ``meta`` to ``path`` (``.npz``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(self.meta, order=self.order, discount=self.discount)
        meta["trained_on"] = self.trained_on
        np.savez_compressed(
            path,
            codes=self._codes,
            means=self._means.astype(np.float16),
            meta=np.array(json.dumps(meta)),
        )
        return path

    @classmethod
    def load(
        cls, path: str | Path, *, ids: torch.Tensor | None = None, device: DeviceLike = "cpu"
    ) -> DistilledNgramDraft:
        """Read a file ``save`` wrote; the counted rows are rebuilt from ``ids`` (default: the
        corpus's training split), which must be the text it was distilled on.

        Raises FileNotFoundError for a missing file and ValueError for an unreadable one
        (both say how to rebuild it) or ``ids`` of another length than the file's text."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"distilled n-gram {path} not found; rebuild it with: {rebuild_command('ngram')}"
            )
        try:
            with np.load(path, allow_pickle=False) as f:
                codes, means = f["codes"], f["means"]  # float16: widened once, in __init__
                meta = json.loads(str(f["meta"]))
            order, discount = int(meta["order"]), float(meta["discount"])
            trained_on = int(meta["trained_on"])
        except Exception as e:  # truncated zip, missing arrays, bad JSON
            raise ValueError(
                f"distilled n-gram {path} could not be read ({type(e).__name__}: {str(e)[:200]}); "
                f"delete it and rebuild it with: {rebuild_command('ngram')}"
            ) from None
        if ids is None:
            ids, _ = D.corpus_split()
        if torch.as_tensor(ids).numel() != trained_on:
            raise ValueError(
                f"{path} was distilled on {trained_on:,} characters but ids has "
                f"{torch.as_tensor(ids).numel():,}: pass the ids it was built from"
            )
        return cls(codes, means, order, discount, ids=ids, device=device, meta=meta)

    def __repr__(self) -> str:
        return (
            f"DistilledNgramDraft(order={self.order}, {self._codes.size:,} distilled contexts, "
            f"{self.contexts:,} contexts, {self.trained_on:,} training characters)"
        )


def load_distilled(path: str | Path | None = None, *, device: DeviceLike = "cpu"):
    """The shipped distilled n-gram (``data/checkpoints/ngram_distilled.npz``), or ``path``."""
    return DistilledNgramDraft.load(path or checkpoints_dir() / DISTILLED_FILE, device=device)
