"""The student edition: the tree of modules a submission's kernel can import, each with its
reason, built for the sandbox as a folder of its own.

The sandbox shows neither the course package nor the grader. It shows, at their paths, a
tree that :func:`build_tree` copies from them: the modules :data:`STUDENT_EDITION` lists by
name and no other (a module added to the package stays out until it is listed here with its reason),
with, while an exercise is graded, the package's own versions of what it asks for rewritten
as stubs that raise (:mod:`.withheld`, from each exercise's ``PUBLIC_IMPLEMENTATIONS``).
What is never in it, :data:`LEFT_OUT` says with why: the grader's judge side (references,
exact laws, checks) and command, the course's command line, the Hugging Face export and the
real LLM. Third-party packages known to implement a graded rule are shadowed by an empty
module (:data:`.withheld.HIDDEN_PACKAGES`).

``tests/test_grading_edition.py`` checks that every module of the package is listed or left
out, that the tree imports without what it leaves out, that a real sandbox can import
exactly the listed modules, and that none of their public callables reproduces a checked
quantity on the checks' own inputs (ex01's residual and step, ex02's expected tokens,
ex10's block weights and thresholds).

The README's grading section cites this list.
"""

from __future__ import annotations

import atexit
import compileall
import os
import shutil
import tempfile
import threading
from pathlib import Path

from . import withheld
from .withheld import HIDDEN_PACKAGES

__all__ = [
    "HIDDEN_PACKAGES",
    "LEFT_OUT",
    "STUDENT_EDITION",
    "THIRD_PARTY",
    "build_tree",
    "covers",
    "package_dir",
    "package_dirs",
]


def _listed(groups: dict[str, tuple[str, tuple[str, ...]]]) -> dict[str, str]:
    # package -> (why, its modules by name; "" is the package itself) => module -> why
    return {
        (pkg if not m else f"{pkg}.{m}"): why for pkg, (why, mods) in groups.items() for m in mods
    }


# Every module of the course package a kernel may import, by name, with why a student may
# use it.
STUDENT_EDITION: dict[str, str] = _listed(
    {
        "specdec_course": (
            "notebook_setup and the package's names, which every notebook imports",
            ("",),
        ),
        "specdec_course._validate": ("input checks with clear errors, shared by the models", ("",)),
        "specdec_course.paths": ("where data, checkpoints and records live", ("",)),
        "specdec_course.devices": ("which device and thread count a notebook uses", ("",)),
        "specdec_course.theory": (
            "lesson 02's closed forms for one alpha (ex02 asks for a list of per-position "
            "alphas, which they cannot take)",
            ("",),
        ),
        "specdec_course.sampling": (
            "temperature, top-k, top-p and the lesson's rules; the residual and the step are "
            "withheld while ex01 is graded, the exponential race while ex05 is",
            ("",),
        ),
        "specdec_course.stats": ("the chi-square tools lesson 01 teaches with", ("",)),
        "specdec_course.verifier": (
            "the batched rejection sampler ex04 hands a step as verify; its race is withheld "
            "while ex05 is graded",
            ("",),
        ),
        "specdec_course.block_verifier": (
            "block verification as lesson 09 samples it; the thresholds and block_verify_row "
            "(which computes them inline) are withheld for ex10",
            ("",),
        ),
        "specdec_course.data": ("the corpus and the character tokenizer", ("",)),
        "specdec_course.train": ("the training loop lesson 03 runs", ("",)),
        "specdec_course.plots": (
            "the lessons' figures; the proof picture (which draws the residual) is withheld "
            "while ex01 is graded",
            ("",),
        ),
        "specdec_course.widgets": ("the lessons' explorers; no graded rule", ("",)),
        "specdec_course.model": (
            "CharGPT, its cache and checkpoints: what the exercises drive",
            ("", "cache", "checkpoints", "checks", "config", "gpt"),
        ),
        "specdec_course.decoding": (
            "generation and the speculative loop the lessons build; the pieces ex04, ex07 and "
            "ex08 ask for are withheld while those are graded, k='auto''s rule while ex02 is",
            ("", "auto_k", "batch_drafts", "batched", "dynamic", "plain", "recorder")
            + ("row_verifier", "scoring", "spec_stats", "speculative", "threads"),
        ),
        "specdec_course.drafts": (
            "the draft model's proposer and the drafts lesson 07 builds; ex09's pieces are "
            "withheld for ex09",
            ("", "distilled", "model_draft", "noise", "proposer"),
        ),
        "specdec_course.drafts.ngram": (
            "lesson 07's n-gram counts and draft; ex09's pieces are withheld for ex09",
            ("", "counts", "ngram_draft"),
        ),
        "specdec_course.drafts.eagle": (
            "lesson 09b's feature drafts and how they were trained; no graded rule",
            ("", "eagle_draft", "eagle_numpy", "eagle_training", "fused", "fused_training")
            + ("recurrent", "recurrent_training"),
        ),
        "specdec_course.fast": (
            "the loops' speed paths (lean, folded, NumPy steps) built from a model; no graded rule",
            ("", "derived", "folded", "graphs", "lean", "numpy_steps", "ragged"),
        ),
        "specdec_course.medusa": (
            "lesson 06's heads and trees; ex06's and ex07's pieces are withheld while those "
            "are graded",
            ("", "candidates", "head_training", "heads", "hydra", "medusa_generate", "tree"),
        ),
        "specdec_course.kernels": (
            "the Triton verifier lesson 05 builds; its races are withheld while ex05 is graded",
            ("", "compile", "rejection"),
        ),
        # The grader's student side: a package of its own, beside the course's in the tree.
        "specdec_grader": (
            "inline check() and when_implemented, which print feedback in the notebook, and "
            "ex05's launch helpers: no reference",
            ("", "ex05_notebook", "inline"),
        ),
        "specdec_grader.student_side": (
            "the kernel side of the batch grader (the agent, the wire, the probes): plain "
            "data, no reference",
            ("", "__main__", "agent", "errors", "helpers", "probes", "results", "wire"),
        ),
        "specdec_course.bench": (
            "the measurements the lessons show (speed ratios, rooflines, stored records); no "
            "graded rule",
            ("", "_args", "batch_sizes", "compare", "dynamic_and_block", "eagle_race")
            + ("flashinfer", "forward", "gpu", "hf_race", "medusa_trees", "ngram_alpha")
            + ("records", "roofline", "roofline_methods", "shipped_drafts", "speedup")
            + ("speedup_record", "verifier_sweep"),
        ),
    }
)

# What the tree never holds (a prefix covers the module and everything below it), and why.
LEFT_OUT: dict[str, str] = {
    "specdec_grader.judge": "the judge side: references, exact laws and the checks",
    "specdec_grader.cli": "the specdec-grader command, which runs the judge",
    "specdec_grader.__main__": "python -m specdec_grader: the same command",
    "specdec_course.cli": "the specdec-course command: a notebook calls the package, not it",
    "specdec_course.hf": "the export to transformers (lesson 10), which the sandbox shadows",
    "specdec_course.llm": "lesson 11's real model (the [llm] extra) and its prompt lookup, "
    "which is ex11's answer; ex11's SmolLM2 cell skips without it",
    "specdec_course.bench.llm_calls": "lesson 11's measurements of the real model",
    "specdec_course.bench.llm_race": "lesson 11's race, run with the real model",
    "specdec_course.bench.llm_tables": "lesson 11's stored record, printed labelled",
    "specdec_course.token_view": "lesson 11's live view of a run and its explorer; no exercise "
    "uses them",
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
    """The reason :data:`STUDENT_EDITION` gives for ``module``, or ``None`` when the module is
    not in the student edition (no prefix covers a module: each is listed by name)."""
    return STUDENT_EDITION.get(module)


def package_dir() -> Path:
    """The folder of the course package the judge runs (the tree is shown at its path)."""
    return package_dirs()["specdec_course"]


package_dirs = withheld.package_dirs  # the course's and the grader's, by package name


_lock = threading.Lock()
_trees: dict[tuple[str, tuple[str, ...]], Path] = {}
_root: str | None = None


def build_tree(exercise: str = "", functions: tuple[str, ...] = ()) -> Path:
    """The student edition as a folder holding two packages, ``specdec_course`` and
    ``specdec_grader``: a copy of each :data:`STUDENT_EDITION` module's file at its place
    (and the course's ``py.typed``), those holding one of ``functions`` (dotted paths,
    withheld while ``exercise`` is graded) rewritten by :func:`.withheld.rewrite`, compiled
    once so that kernels start as fast as from the packages. Built once per process and
    (exercise, functions), in a private temporary folder removed at exit, readable by every
    user. Raises ``ValueError`` for a function that is not a top-level function or method of
    a listed module."""
    global _root
    key = (exercise, tuple(sorted(functions)))
    with _lock:
        if key in _trees:
            return _trees[key]
        if _root is None:
            _root = tempfile.mkdtemp(prefix="specdec-edition-")
            atexit.register(shutil.rmtree, _root, True)
        by_module: dict[str, set[str]] = {}
        for path in functions:
            module, name = withheld.split(path)
            if module not in STUDENT_EDITION:
                continue  # not in the tree at all
            by_module.setdefault(module, set()).add(name)
        tree = Path(_root) / f"{exercise or 'plain'}-{len(_trees)}"
        bases = package_dirs()
        for module in sorted(STUDENT_EDITION):
            src = withheld.module_file(module)
            top = module.split(".")[0]
            dest = tree / top / src.relative_to(bases[top])
            dest.parent.mkdir(parents=True, exist_ok=True)
            text = src.read_text(encoding="utf-8")
            if module in by_module:
                text = withheld.rewrite(text, module, by_module[module], exercise)
            dest.write_text(text, encoding="utf-8")
        typed = bases["specdec_course"] / "py.typed"
        if typed.is_file():
            shutil.copyfile(typed, tree / "specdec_course" / "py.typed")
        compileall.compile_dir(str(tree), quiet=2, workers=1)
        for folder, _, files in os.walk(tree):
            os.chmod(folder, 0o755)
            for f in files:
                os.chmod(os.path.join(folder, f), 0o644)
        _trees[key] = tree
        return tree
