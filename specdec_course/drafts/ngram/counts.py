"""The counts of one context length: sorted context codes and a CSR row of children
(``_Level``), and the sorted-key look-up the n-gram tables use (``find_sorted``)."""

from __future__ import annotations

import numpy as np

__all__ = ["find_sorted"]


def find_sorted(keys: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row of each of ``codes`` in the sorted, non-empty ``keys``, and whether it is there
    (where it is not, the row is a neighbour's: read it only where found)."""
    rows = np.minimum(np.searchsorted(keys, codes), keys.size - 1)
    return rows, keys[rows] == codes


class _Level:
    """Counts of one context length ``L``: sorted context codes and a CSR row of children."""

    def __init__(self, ids: np.ndarray, L: int, V: int):
        n = ids.size
        code = np.zeros(n - L, dtype=np.int64)  # context of position i (predicting ids[i])
        for j in range(1, L + 1):  # most recent character least significant
            code += ids[L - j : n - j] * V ** (j - 1)
        full = code * V + ids[L:]
        keys, counts = np.unique(full, return_counts=True)
        ctx, start = np.unique(keys // V, return_index=True)
        self.L, self.V = L, V
        self.ctx = ctx  # sorted context codes
        self.indptr = np.append(start, keys.size)
        self.child = (keys % V).astype(np.int64)
        self.count = counts.astype(np.float64)
        self.total = np.add.reduceat(self.count, start)  # c(h)
        self.distinct = np.diff(self.indptr).astype(np.float64)  # N1(h)

    def find(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row of each context code, and whether it was seen."""
        return find_sorted(self.ctx, codes)

    def dense_counts(self, rows: np.ndarray) -> np.ndarray:
        """``c(h, w)`` for the given rows as a dense ``[len(rows), V]`` array."""
        starts, ends = self.indptr[rows], self.indptr[rows + 1]
        lens = ends - starts
        which = np.repeat(np.arange(rows.size), lens)
        flat = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())
        out = np.zeros((rows.size, self.V))
        out[which, self.child[flat]] = self.count[flat]
        return out
