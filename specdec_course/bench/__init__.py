"""Benchmarks, reported as ratios measured in one run: ``specdec-course bench ...``.

``bench.verifier_sweep``: the Triton verifier against the PyTorch reference on a CUDA GPU,
against the memory roofline (its byte model is in that module's docstring).
``bench.speedup``: plain against speculative decoding (and Medusa), beside the theory's
predictions; ``bench.forward`` the cost of one cached forward over 1 to 16 new tokens.
``bench.gpu``: both on a GPU in one check (``specdec-course bench gpu``), stored for machines
without one. ``bench.dynamic_and_block``: dynamic draft length and block verification
(``bench beyond``), with ``bench.batch_sizes``' batch-size regime. ``bench.eagle_race``: the
EAGLE-style drafts against the draft model (``bench.shipped_drafts`` loads the shipped
drafts by name); ``bench.ngram_alpha``: an n-gram draft's acceptance on validation text
and the order sweep that chose the default (lesson 07); ``bench.medusa_trees``: the trees
the benchmark runs for Medusa's heads. ``bench.hf_race``: Hugging Face's generate against
the package's loops; ``bench.llm_calls`` and ``bench.llm_race``: the real LLM's call costs
and race. ``bench.roofline``: a roofline *model* of a GPU call (bytes and flops at a named
GPU's peaks) and the speedups it predicts per method (``bench.roofline_methods``), shown
where no GPU record is stored.
"""

from .batch_sizes import *  # noqa: F403
from .batch_sizes import __all__ as _batch_all
from .compare import *  # noqa: F403
from .compare import __all__ as _compare_all
from .dynamic_and_block import *  # noqa: F403
from .dynamic_and_block import __all__ as _beyond_all
from .eagle_race import *  # noqa: F403
from .eagle_race import __all__ as _eagle_all
from .forward import *  # noqa: F403
from .forward import __all__ as _forward_all
from .gpu import *  # noqa: F403
from .gpu import __all__ as _gpu_all
from .medusa_trees import *  # noqa: F403
from .medusa_trees import __all__ as _medusa_trees_all
from .ngram_alpha import *  # noqa: F403
from .ngram_alpha import __all__ as _ngram_alpha_all
from .roofline import *  # noqa: F403
from .roofline import __all__ as _roofline_all
from .roofline_methods import *  # noqa: F403
from .roofline_methods import __all__ as _roofline_methods_all
from .shipped_drafts import *  # noqa: F403
from .shipped_drafts import __all__ as _drafts_all
from .speedup import *  # noqa: F403
from .speedup import __all__ as _speedup_all
from .speedup_record import *  # noqa: F403
from .speedup_record import __all__ as _speedup_record_all
from .verifier_sweep import *  # noqa: F403
from .verifier_sweep import __all__ as _verifier_all

__all__ = [
    *_verifier_all,
    *_forward_all,
    *_speedup_all,
    *_speedup_record_all,
    *_compare_all,
    *_drafts_all,
    *_ngram_alpha_all,
    *_medusa_trees_all,
    *_gpu_all,
    *_batch_all,
    *_beyond_all,
    *_eagle_all,
    *_roofline_all,
    *_roofline_methods_all,
]
