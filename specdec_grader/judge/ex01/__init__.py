"""Checks of exercise 01: the residual distribution and one speculative sampling step.

Students implement, in ``exercises/ex01_residual.ipynb``:

- ``residual_distribution(p, q)``: ``norm(max(p - q, 0))`` row by row over the last axis of
  ``[..., V]`` tensors (one position, or a batch of rows ``[B, V]``), and a row of ``p`` where
  that row of ``p`` equals ``q``. Lesson 01's cell works on one position and normalises by
  one sum: on a batch it mixes the rows, which the batch cases catch;
- ``speculative_sample(p, q, generator=None) -> (token, accepted)``: draft from ``q``, accept
  with probability ``min(1, p/q)``, otherwise resample from the residual;
- ``chi_square_p_value(counts, probs)``: Pearson's goodness-of-fit p-value over the outcomes
  with probability > 0 (df = their number - 1).

The sampling check runs four chi-square tests (16,000 calls in all) on the law of
(token, accepted); a correct sampler fails one of them by chance with probability about
5e-6 (each result reports its rate), while the naive "resample from p" rule misses the
threshold by more than six standard deviations. The other two checks are exact.

References: :func:`specdec_course.sampling.residual_distribution`,
:func:`specdec_course.theory.acceptance_rate`, :func:`specdec_course.stats.chi_square_test`,
and scipy's ``chisquare`` for the p-value.
"""

from __future__ import annotations

# isort: off
# Imported in this order on purpose: the checks register, and are reported and graded, in
# the order of the exercise.
from ._common import P5, Q5, _t
from .residual import _reference_residual, _residual_cases, check_residual_distribution
from .step import _SAMPLE_CASES, _joint_law, check_speculative_sample
from .p_value import _p_value_cases, _reference_p_value, check_chi_square_p_value

# isort: on
from .._support import RULE_IMPLEMENTATIONS

# Not in the sandbox while ex01 is graded (judge.withheld): the package's residual,
# its accept test and its speculative step, in every module that has them (lesson 01's proof
# picture draws the residual; Medusa's chain walk and the batched loop's NumPy rule take the
# step). (The p-value is scipy's to use.)
PUBLIC_IMPLEMENTATIONS = (
    "specdec_course.sampling._residual",
    "specdec_course.sampling.residual_distribution",
    "specdec_course.sampling.speculative_sample",
    "specdec_course.sampling.accepts",
    "specdec_course.plots.proof_picture",
    "specdec_course.medusa.candidates.sampled_chain_walk",
    "specdec_course.decoding.batched._token_verify",
    *RULE_IMPLEMENTATIONS,
)
# What the references use of the package that answers nothing the exercise asks for.
ALLOWED = {
    "specdec_course.sampling.speculative_output_distribution": "the law of a whole step, "
    "from the withheld residual (it raises in the sandbox)",
    "specdec_course.theory.acceptance_rate": "alpha, a number the lesson gives; the residual "
    "and the step are what is asked",
    "specdec_course.stats.chi_square_test": "the statistics tool the checks use",
    "specdec_course.stats.counts": "a histogram",
}

__all__ = [
    "ALLOWED",
    "P5",
    "PUBLIC_IMPLEMENTATIONS",
    "Q5",
    "_SAMPLE_CASES",
    "_joint_law",
    "_p_value_cases",
    "_reference_p_value",
    "_reference_residual",
    "_residual_cases",
    "_t",
    "check_chi_square_p_value",
    "check_residual_distribution",
    "check_speculative_sample",
]
