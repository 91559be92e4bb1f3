"""Speed paths beside the model: a ``CharGPT``'s cached steps, built from it, never stored in it.

The block's arithmetic is written once, in the model (``CharGPT``'s modules: the full pass,
the cached pass ``decode_hidden`` and the static-cache pass ``run_blocks`` are the same
blocks). On a CPU at batch 1 a step of the course's small models costs what dispatching its
ops costs, not their arithmetic (lesson 04 section 5, the appendix), and the module forward
costs about twice the steps below; so the CPU steps are rearrangements of that arithmetic,
each derived from the model's parameters and tested against its forward:

- ``LeanStep`` (``lean_step(model)``): the batch-1 cached step of every decoding loop, in
  plain decoding and as the speculative loop's target call alike, so no speedup is a speedup
  over a slower baseline. Its block loop, ``lean.lean_blocks``, is the one rearranged copy of
  the block; ``RaggedSteps`` / ``OneRowSteps`` (``batch_steps(model, B)``, the batched
  loops' steps) run the same loop over their ragged cache.
- ``FoldedStep`` (``draft_step(model)``): a one-layer draft's step with its position-wise
  work folded into one table, run in NumPy on a CPU (``numpy_steps.NumpyFolded``): the draft
  model's proposals and the EAGLE-style drafts' catch-up.
- ``lean_step(model, numpy=True)``: the target's chain steps in NumPy (``NumpyStep``, the
  loops' opt-in ``executor="numpy"``, ``bench speedup --target-executor numpy``).
- ``StaticSteps`` (``steps_for(..., cuda_graphs=True)``): CUDA-graph replays on a GPU of the
  model's own blocks with a static cache (``graphs``), as gpt-fast does.

Why not ``torch.compile`` (inductor's CPU backend) of the one forward with a static cache,
as gpt-fast does? Measured on the course's 2-core CPU (busy, 1 thread, medians), the
compiled forward costs 540 us per target decode step and 670 per 5-token verify (``LeanStep``
280 and 490), 145 per draft step (the folded step 35); compiling takes 5 to 50 s per shape
(about 90 s for the speculative loop's six), and ``speculative_generate`` of the pair runs at
0.3 of today's tokens per second. It would serve a GPU or larger models; here it loses.

Each step is built once per version of the model's weights and kept beside the model
(``derived``: a table keyed by the model, stamped with its weights' version counters, so it
cannot go stale; ``rebuild(model)`` forgets explicitly). Other course decoders (the real
LLM's ``llm.llama.Llama``) bring their own ``lean_step()`` and ``draft_step()``, which
``lean_step`` and ``draft_step`` here return. The model's own package imports nothing from
here; the decoding loops and the drafts take their steps from here.
"""

from .derived import input_table, model_params, rebuild
from .folded import FoldedCache, FoldedStep, draft_step
from .graphs import EagerSteps, StaticSteps, check_cuda_graphs, steps_for
from .lean import LeanStep, lean_blocks, lean_step
from .numpy_steps import NumpyFolded, NumpyStep, numpy_ok
from .ragged import OneRowSteps, RaggedSteps, batch_steps

__all__ = [
    "LeanStep",
    "lean_step",
    "lean_blocks",
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
