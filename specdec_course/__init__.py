"""specdec_course: the tested companion package of *Speculative Decoding from Scratch*.

One concept per module (see the README): ``theory`` (formulas), ``sampling`` (one position),
``stats`` (chi-square), ``verifier`` (batched rejection sampler), ``kernels`` (Triton),
``data``, ``model``, ``train``, ``decoding``, ``fast`` (the cached steps beside the model),
``drafts`` (every proposer: the draft model, n-grams, the EAGLE family), ``medusa``,
``widgets``, ``bench``, ``cli``. The grader is a package of its own, ``specdec_grader``,
which imports this one (never the reverse). Submodules are imported on demand:
``from specdec_course import theory``.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = {
    "theory",
    "sampling",
    "stats",
    "verifier",
    "block_verifier",
    "kernels",
    "data",
    "model",
    "train",
    "decoding",
    "fast",
    "drafts",
    "medusa",
    "widgets",
    "plots",
    "bench",
    "cli",
    "paths",
    "devices",
}


def __getattr__(name: str):
    # Lazy submodules keep `import specdec_course` cheap (no triton, no matplotlib).
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'specdec_course' has no attribute {name!r}")


def device(name=None):
    """The device a notebook runs on: CUDA when there is a GPU, else the CPU (see
    ``devices.device``; ``name`` forces one). Lessons call it once, in one cell."""
    from .devices import device as _device

    return _device(name)


def notebook_setup(seed: int = 0, threads: int = 1) -> None:
    """Make a notebook's numbers repeatable: fixed seed and fixed CPU thread count.

    Torch on the CPU is bit-reproducible for a fixed seed and thread count; every notebook
    calls this first, and so does the test-suite, so that committed outputs match CI's.
    """
    import random

    import numpy as np
    import torch

    from .devices import set_threads

    set_threads(threads)  # torch's threads and NumPy's BLAS threads
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
