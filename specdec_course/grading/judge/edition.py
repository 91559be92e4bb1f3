"""The student edition: what a submission's kernel can import, each entry with its reason.

The sandbox shows the course package read-only with the judge side left out
(``specdec_course.grading.judge`` is never mounted) and, while an exercise is graded, the
package's own versions of what it asks for rewritten as stubs that raise
(:mod:`.withheld`, from each exercise's ``PUBLIC_IMPLEMENTATIONS``). Third-party packages
known to implement a graded rule are shadowed by an empty module (:data:`.withheld.
HIDDEN_PACKAGES`). What is left is listed here, by module prefix, with why a student may
use it; ``tests/test_grading_edition.py`` enumerates every module and public callable
importable in a real sandbox, fails on a module without an entry, and shows that none of
them reproduces a checked quantity on the checks' own inputs (ex01's residual and step,
ex02's expected tokens, ex10's block weights and thresholds).

The README's grading section cites this list.
"""

from __future__ import annotations

from .withheld import HIDDEN_PACKAGES

__all__ = ["HIDDEN_PACKAGES", "STUDENT_EDITION", "THIRD_PARTY", "covers"]

# Module prefix of the course package -> why it is in the sandbox. A prefix covers the module
# and everything below it; the most specific entry wins.
STUDENT_EDITION: dict[str, str] = {
    "specdec_course": "notebook_setup and the package's names, which every notebook imports",
    "specdec_course._validate": "input checks with clear errors, shared by the models",
    "specdec_course.paths": "where data, checkpoints and records live",
    "specdec_course.devices": "which device and thread count a notebook uses",
    "specdec_course.theory": "lesson 02's closed forms for one alpha (ex02 asks for a list of "
    "per-position alphas, which they cannot take)",
    "specdec_course.sampling": "temperature, top-k, top-p and the lesson's rules; the residual "
    "and the step are withheld while ex01 is graded, the exponential race while ex05 is",
    "specdec_course.stats": "the chi-square tools lesson 01 teaches with",
    "specdec_course.verifier": "the batched rejection sampler ex04 hands a step as verify; its "
    "race is withheld while ex05 is graded",
    "specdec_course.block_verifier": "block verification as lesson 09 samples it; the "
    "thresholds and block_verify_row (which computes them inline) are withheld for ex10",
    "specdec_course.data": "the corpus and the character tokenizer",
    "specdec_course.model": "CharGPT, its cache and checkpoints: what the exercises drive",
    "specdec_course.train": "the training loop lesson 03 runs",
    "specdec_course.decoding": "generation and the speculative loop the lessons build; the "
    "pieces ex04, ex07 and ex08 ask for are withheld while those are graded",
    "specdec_course.drafts": "every draft the lessons build (the draft model's proposer, "
    "lesson 07's n-gram and distilled tables, lesson 09b's feature drafts); ex09's pieces are "
    "withheld for ex09",
    "specdec_course.fast": "the loops' speed paths (lean, folded, NumPy steps) built from a "
    "model; no graded rule",
    "specdec_course.medusa": "lesson 06's heads and trees; ex06's and ex07's pieces are "
    "withheld while those are graded",
    "specdec_course.kernels": "the Triton verifier lesson 05 builds; its races are withheld "
    "while ex05 is graded",
    "specdec_course.grading": "inline check() and when_implemented, which print feedback in "
    "the notebook: no reference (the judge side is not mounted)",
    "specdec_course.grading.student_side": "the kernel side of the batch grader (the agent, the "
    "wire, the probes): plain data, no reference",
    "specdec_course.bench": "the measurements the lessons show (speed ratios, rooflines); no "
    "graded rule",
    "specdec_course.cli": "the specdec-course command; no graded rule",
    "specdec_course.plots": "the lessons' figures; the proof picture (which draws the "
    "residual) is withheld while ex01 is graded",
    "specdec_course.widgets": "the lessons' explorers; no graded rule",
    "specdec_course.hf": "export to transformers for lesson 10: it cannot run in the sandbox, "
    "where transformers is shadowed",
    "specdec_course.llm": "lesson 11's real model (extra [llm]); no graded rule",
}

# Third-party packages a notebook uses, and why none of them answers a check.
THIRD_PARTY: dict[str, str] = {
    "torch": "tensors and nn: the exercises' language",
    "numpy": "arrays",
    "scipy": "statistics: ex01's chi-square p-value is scipy's to use, on purpose (the check "
    "asks which outcomes count and with how many degrees of freedom)",
    "triton": "ex05's kernel language",
    "matplotlib": "figures",
    "ipywidgets": "explorers",
    "IPython": "the notebook's shell",
    "tqdm": "progress bars",
}


def covers(module: str) -> str | None:
    """The reason the most specific :data:`STUDENT_EDITION` entry gives for ``module``, or
    ``None`` when no entry covers it (``specdec_course.grading.judge`` never is)."""
    if module == "specdec_course.grading.judge" or module.startswith(
        "specdec_course.grading.judge."
    ):
        return None
    best = None
    for prefix in STUDENT_EDITION:
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best)
        ):
            best = prefix
    return None if best is None else STUDENT_EDITION[best]
