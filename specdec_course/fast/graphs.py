"""CUDA graphs for the decoding loops: a model's cached steps captured once, replayed per call.

At batch 1 a small model's step on a GPU costs what launching its few dozen kernels costs
on the CPU side: the GPU waits for Python. A CUDA graph records the kernels of one step once
and replays them with a single launch (gpt-fast does this with ``torch.compile(mode=
"reduce-overhead")``; here ``torch.cuda.CUDAGraph`` is used directly, which compiles
nothing). A graph replays the same kernels on the same memory, so every shape in it is
fixed: the step cannot slice the cache at ``cache.length`` as ``CharGPT.decode_hidden``
does. The static step instead

- writes the new keys and values into the preallocated ``KVCache`` buffers at positions held
  in a device tensor (``index_copy_``), and
- attends over the whole buffer, with a mask that lets the query at position ``t`` see
  the keys at positions ``<= t``.

Positions past the cache's length hold stale keys from rejected drafts; the mask hides
them, so rollback stays a pointer move (``cache.crop``), as gpt-fast's static cache does.
The static step runs the model's own blocks (``CharGPT.run_blocks``) with the slots in a
tensor; attention runs over masked padding, so its logits equal ``decode_hidden``'s up to
rounding (tests bound the difference); a graph replays its own step exactly (tests on a GPU
pin that bit for bit).

``StaticSteps(model, max_tokens)`` holds one static cache and a step for each ``T = 1 ..
max_tokens`` new tokens; ``steps(ids)`` runs the step for ``ids [1, T]`` and returns logits
``[T, V]``. ``capture=True`` (CUDA only) records each step as a graph; ``capture=False``
runs the same static step eagerly, on any device (tests use it on the CPU).
``steps_for(model, role, max_tokens, cuda_graphs, numpy)`` is what the loops call: the eager
``EagerSteps`` (``fast.lean.LeanStep``, or its NumPy twin) when graphs are off, else a
``StaticSteps`` per role kept beside the model (``fast.derived``: target or draft, a model
used as both gets two caches), so that captures are paid once per version of the weights.
"""

from __future__ import annotations

import weakref

import torch

from ..devices import model_device
from ..model import CharGPT, KVCache
from .derived import built
from .lean import lean_step

__all__ = ["EagerSteps", "StaticSteps", "steps_for", "check_cuda_graphs"]


class EagerSteps:
    """The plain cached step: ``lean_step(model, numpy=numpy)`` (``fast.lean``) on a fresh
    cache, logits written into a buffer of ``max_tokens`` rows."""

    def __init__(self, model: CharGPT, max_tokens: int = 1, *, numpy: bool = False):
        self.lean = lean_step(model, numpy=numpy)
        self.cache = model.new_cache(1)
        w = model.lm_head.weight
        self.out = torch.empty(max_tokens, model.config.vocab_size, dtype=w.dtype, device=w.device)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[T, V]`` of ``ids [1, T]`` (the new tokens), extending ``self.cache``; the
        next call overwrites them (use or copy them first)."""
        T = ids.shape[1]
        if T > self.out.shape[0]:  # more tokens than planned for: a larger buffer
            self.out = self.out.new_empty(T, self.out.shape[1])
        out = self.out[:T]
        self.lean.step(ids[0], self.cache, out)
        return out


def _static_step(model, arange, idx: torch.Tensor, start: torch.Tensor, cache: KVCache):
    """The model's cached forward over ``idx [1, T]`` at positions ``start + 0 .. T-1``
    (``start`` a 0-d int64 device tensor, ``arange`` ``0 .. block_size - 1``): logits
    ``[T, V]``. The blocks are the model's own (``CharGPT.run_blocks``) with a static cache:
    the new keys and values go to slots held in a tensor and attention reads the whole
    buffer under a mask, so every shape is fixed and the step can be captured."""
    tr = model.transformer
    T = idx.shape[1]
    pos = start + arange[:T]  # [T]
    mask = arange[None, :] <= pos[:, None]  # [T, block]: a query sees keys up to itself
    x = tr.wte(idx) + tr.wpe(pos)
    x = model.run_blocks(x, cache.k, cache.v, pos, arange.shape[0], mask)
    return model.lm_head(tr.ln_f(x))[0]


class StaticSteps:
    """Static-shape cached steps for ``T = 1 .. max_tokens`` new tokens over one ``KVCache``.

    ``steps(ids [1, T])`` writes positions ``cache.length ..`` and returns logits ``[T, V]``
    in a buffer that the next call with the same ``T`` overwrites (use or copy it first).
    ``cache`` behaves as any ``KVCache``: prefill it with ``model(prompt, steps.cache)``,
    roll it back with ``crop``. ``capture=True`` records each step as a CUDA graph (the
    model must be on a CUDA device); ``capture=False`` runs the same steps eagerly. Raises
    ValueError for a model on another device than CUDA when capturing.
    """

    def __init__(self, model: CharGPT, max_tokens: int, *, capture: bool = True):
        dev = model_device(model)
        if capture:
            check_cuda_graphs(dev)
        # A weak reference: kept beside the model (fast.derived), a step must not keep it alive.
        self.model, self.config = weakref.ref(model), model.config
        self.arange = torch.arange(model.config.block_size, device=dev)
        self.capture, self.device = capture, dev
        self.cache = model.new_cache(1)
        self.start = torch.zeros((), dtype=torch.long, device=dev)
        self.inputs: dict[int, torch.Tensor] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.ensure(max_tokens)

    def ensure(self, max_tokens: int) -> None:
        """Have a step for every ``T <= max_tokens`` (captures the missing ones)."""
        for T in range(1, max_tokens + 1):
            if T not in self.inputs:
                self.inputs[T] = torch.zeros(1, T, dtype=torch.long, device=self.device)
                if self.capture:
                    self._capture(T)

    def _capture(self, T: int) -> None:
        # As torch.cuda.graphs documents: warm up on a side stream (cuBLAS and the
        # allocator set themselves up outside the capture), then record one call. The
        # warm-up writes the cache at positions 0 .. T-1, which any use overwrites.
        args, idx, cache = (self.model(), self.arange), self.inputs[T], self.cache
        self.start.zero_()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                _static_step(*args, idx, self.start, cache)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[T] = _static_step(*args, idx, self.start, cache)
        self.graphs[T] = graph

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        cache = self.cache
        self.start.fill_(cache.length)  # a kernel with the length as argument: no sync
        if not self.capture:
            out = _static_step(self.model(), self.arange, ids, self.start, cache)
        else:
            self.inputs[T].copy_(ids)
            self.graphs[T].replay()
            out = self.outputs[T]
        cache.length += T
        return out


def check_cuda_graphs(dev: torch.device) -> None:
    """ValueError unless CUDA graphs can run on ``dev`` (a CUDA device)."""
    if torch.device(dev).type != "cuda":
        raise ValueError(
            f"cuda_graphs=True needs the models on a CUDA GPU; they are on {dev}. CUDA graphs "
            "replay GPU kernels: on a CPU leave cuda_graphs off (the default)"
        )


def steps_for(model: CharGPT, role: str, max_tokens: int, cuda_graphs: bool, numpy=False):
    """The cached steps a decoding loop calls for ``model`` in ``role`` ("target", "draft").

    Graphs off: a fresh ``EagerSteps`` for up to ``max_tokens`` new tokens (``numpy=True``:
    its NumPy step). Graphs on: the model's ``StaticSteps`` for that role, captured on first
    use (up to ``max_tokens`` new tokens per step) and kept beside the model for as long as
    its weights are unchanged (``fast.derived``); its cache is emptied here.
    """
    if not cuda_graphs:
        return EagerSteps(model, max_tokens, numpy=numpy)
    if numpy:
        raise ValueError("executor='numpy' runs eager NumPy steps; drop cuda_graphs")
    dev = model_device(model)
    check_cuda_graphs(dev)
    # Capture where graphs exist; elsewhere (only a test gets past the check above) the same
    # static steps run eagerly, which is how the CPU tests cover this path.
    capture = dev.type == "cuda"
    steps = built(model, f"graphs:{role}", lambda m: StaticSteps(m, max_tokens, capture=capture))
    steps.ensure(max_tokens)
    steps.cache.reset()
    return steps
