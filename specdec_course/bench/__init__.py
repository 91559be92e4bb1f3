"""Benchmarks, reported as ratios measured in one run: ``specdec-course bench verifier|speedup``.

``bench.verifier``: the Triton verifier against the PyTorch reference on a CUDA GPU, against
the memory roofline (its byte model is in that module's docstring). ``bench.speedup``: plain
against speculative decoding (and Medusa) on the CPU, beside the theory's predictions.
"""

from .compare import *  # noqa: F403
from .compare import __all__ as _compare_all
from .speedup import *  # noqa: F403
from .speedup import __all__ as _speedup_all
from .verifier import *  # noqa: F403
from .verifier import __all__ as _verifier_all

__all__ = [*_verifier_all, *_speedup_all, *_compare_all]
