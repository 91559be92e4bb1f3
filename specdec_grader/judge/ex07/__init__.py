"""Checks of exercise 07: the lossless tree walk and the compaction of the accepted path.

Students implement, in ``exercises/ex07_tree_walk.ipynb``, lesson 06's verification step when
sampling (SpecInfer, Miao et al. 2024, with one-hot drafts):

- ``tree_walk(probs, tokens, children, generator=None) -> (path, token)``: ``probs [T, V]``
  float64 is the target's next-token distribution at every node of a tree (row 0: the root),
  ``tokens [T]`` int64 each node's token, ``children[i]`` the nodes under node ``i`` in the
  order to try them. From the root, each child ``c`` is tried in turn and accepted with
  probability ``p(token c)`` under what is left of the node's distribution (renormalised);
  a rejected child's token is removed before the next sibling; the walk moves to an
  accepted child, and where no child is accepted it samples the token from what is left.
  Returns the accepted nodes from depth 1 down and that token;
- ``compact_cache(cache, start, path)``: the tree pass wrote node ``i``'s keys and values
  at slot ``start + i`` of a ``KVCache``; move the accepted nodes ``path`` to slots
  ``start + 1, start + 2, ...`` (all layers, keys and values) and set the length to
  ``start + 1 + len(path)``.

The walk is graded by one check: chi-square tests of the (last accepted node, token) pairs
of thousands of walks against their exact law, which the judge computes by enumerating the rule
(:func:`exact_law`); :func:`specdec_course.stats.chi_square_test` rejects when
``chi2 > df + 10 sqrt(2 df)``, and the seven statistical cases of the visible run together
fail a correct walk with probability below 1e-6 (each result reports its rate). The
temperature-0 case is exact, against the package's greedy walk. Compaction is compared with
:func:`specdec_course.medusa.compact_cache` exactly, and on a real tree pass the compacted
cache must equal a fresh run over the accepted text. ``tests/test_grading_ex07.py`` holds
the mutation tests: resampling from ``p`` instead of what is left, forgetting to remove a
rejected child, compacting the wrong positions.
"""

# isort: off
# Imported in this order on purpose: the checks register, and are reported and graded, in
# the order of the exercise.
from specdec_course.stats import chi_square_test

from .walk import CHAIN, DEEP, V, check_tree_walk, exact_law, make_tree_case
from .compaction import check_compact_cache

# isort: on

# Not in the sandbox while ex07 is graded (judge.withheld): the package's tree walks
# (greedy and sampled, and the chain walk they share), the exact law of the sampled walk at one
# node (lesson 06 checks the rule with it) and its cache compaction.
PUBLIC_IMPLEMENTATIONS = (
    "specdec_course.medusa.medusa_generate._greedy_walk",
    "specdec_course.medusa.medusa_generate._sampled_walk",
    "specdec_course.medusa.candidates.sampled_chain_walk",
    "specdec_course.medusa.tree.compact_cache",
    "specdec_course.medusa.tree._move_slots",
    "specdec_course.medusa.medusa_generate.node_law",
)
ALLOWED = {
    "specdec_course.medusa.build_tree": "builds a tree's buffers (the cases' trees); the walk "
    "and the compaction are what is asked",
    "specdec_course.medusa.tree_forward": "the model's pass over a tree, which fills the cache",
    "specdec_course.decoding.caches_consistent": "compares two caches",
    "specdec_course.model.GPTConfig": "the model's configuration",
    "specdec_course.model.KVCache": "the cache the exercise compacts",
    "specdec_course.stats.chi_square_test": "the statistics tool the checks use",
    "specdec_course.stats.counts": "a histogram",
    "specdec_course.stats.round_probs": "rounding for the printed law",
}

__all__ = [
    "CHAIN",
    "DEEP",
    "V",
    "check_compact_cache",
    "check_tree_walk",
    "chi_square_test",
    "exact_law",
    "make_tree_case",
]
