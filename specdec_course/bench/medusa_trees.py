"""The Medusa trees the speedup benchmark runs (``bench speedup``, ``generate --method medusa``).

For Medusa heads the named ``medusa.TREES``; for Hydra heads, Medusa's greedy tree
construction over the acceptance measured when they were trained, and at temperature > 0
chains of sampled drafts.
"""

from __future__ import annotations

import torch

from ..medusa import TREES, HydraHeads, greedy_tree

__all__ = ["TREE_SIZES", "bench_trees"]


# Node counts (root excluded) of the benchmark's greedy trees for Hydra heads.
TREE_SIZES = (3, 7, 15)


def bench_trees(heads, temperature: float, sizes=TREE_SIZES) -> dict:
    """The trees the speedup benchmark runs for ``heads``: ``{name: (paths, draft)}``.

    Medusa heads: the named ``TREES`` with ranked guesses. Hydra heads: Medusa's greedy
    tree construction (``greedy_tree``) over the acceptance measured when they were trained
    (``heads.meta``: ``acceptance_greedy`` at temperature 0, else ``acceptance_sampled``,
    see ``hydra.hydra_acceptance``), one tree per node count in ``sizes`` (``top<n>``), and at
    temperature > 0 chains of sampled drafts of every depth (``sample<d>``). Raises
    ValueError for Hydra heads without the measured acceptance."""
    if not isinstance(heads, HydraHeads):
        return {name: (paths, "top") for name, paths in TREES.items()}
    key = "acceptance_greedy" if temperature == 0 else "acceptance_sampled"
    acc = getattr(heads, "meta", {}).get(key)
    if acc is None:
        raise ValueError(
            f"these Hydra heads carry no measured acceptance (meta[{key!r}]); load the shipped "
            "ones (medusa.load_heads(kind='hydra')) or set it from hydra.hydra_acceptance"
        )
    out = {f"top{n + 1}": (greedy_tree(torch.tensor(acc), n), "top") for n in sizes}
    if temperature != 0:
        for d in range(1, heads.n_heads + 1):
            out[f"sample{d}"] = ([(0,) * j for j in range(1, d + 1)], "sample")
    return out
