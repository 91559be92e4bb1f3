"""Speed paths beside the model: a ``CharGPT``'s cached steps, built from it, never stored in it.

On a CPU at batch 1 a step of the course's small models costs what dispatching its ops costs,
not their arithmetic (lesson 04 section 5, the appendix). These steps compute what
``CharGPT.forward(idx, cache)`` computes, with fewer ops:

- ``LeanStep`` (``lean_step(model)``): the batch-1 cached step of every decoding loop, in
  plain decoding and as the speculative loop's target call alike, so no speedup is a speedup
  over a slower baseline; ``lean_step(model, numpy=True)`` runs it in NumPy
  (``numpy_steps.NumpyStep``: ``bench speedup --target-executor numpy``'s record, the loops'
  ``executor="numpy"``).
- ``FoldedStep`` (``draft_step(model)``): a one-layer draft's step with its position-wise
  work folded into one table, run in NumPy on a CPU (``numpy_steps.NumpyFolded``): the
  draft model's proposals and the EAGLE-style drafts' catch-up.
- ``RaggedSteps`` / ``OneRowSteps`` (``batch_steps(model, B)``): the batched loops' steps.
- ``StaticSteps`` (``steps_for(..., cuda_graphs=True)``): CUDA-graph replays on a GPU.

Each is built once per version of the model's weights and kept beside the model
(``derived``: a table keyed by the model, stamped with its weights' version counters, so it
cannot go stale; ``rebuild(model)`` forgets explicitly). Other course decoders (the real
LLM's ``llm.llama.Llama``) bring their own ``lean_step()`` and ``draft_step()``, which
``lean_step`` and ``draft_step`` here return. The model's own package imports nothing from
here; the decoding loops and the drafts take their steps from here.
"""

from .derived import input_table, model_params, rebuild
from .folded import FoldedCache, FoldedStep, draft_step
from .graphs import EagerSteps, StaticSteps, check_cuda_graphs, steps_for
from .lean import LeanStep, lean_step
from .numpy_steps import NumpyFolded, NumpyStep, numpy_ok
from .ragged import OneRowSteps, RaggedSteps, batch_steps

__all__ = [
    "LeanStep",
    "lean_step",
    "FoldedStep",
    "FoldedCache",
    "draft_step",
    "NumpyStep",
    "NumpyFolded",
    "numpy_ok",
    "RaggedSteps",
    "OneRowSteps",
    "batch_steps",
    "EagerSteps",
    "StaticSteps",
    "steps_for",
    "check_cuda_graphs",
    "input_table",
    "model_params",
    "rebuild",
]
