"""What the fast steps derive from a model's weights, kept beside the model, never in it.

A step built from a model (``LeanStep``, ``FoldedStep``, the NumPy steps, CUDA graphs) holds
tensors computed from its weights: transposed copies, tables, folded constants. Building one
costs milliseconds to seconds, so it is built once and reused, in a table beside the model
(a ``WeakKeyDictionary``: dropping the model drops its steps). The table cannot go stale:
each entry is stamped with the weights' version (every parameter's and buffer's storage,
dtype and version counter, which every in-place write bumps: an optimizer step,
``load_state_dict``'s copies, ``model.to``'s new storage), and a look-up that finds another
stamp builds again. ``rebuild(model)`` drops a model's entries explicitly (for a weight
written behind PyTorch's back, e.g. through a NumPy view).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

__all__ = ["built", "rebuild", "weights_version", "model_params", "input_table"]

_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def weights_version(model) -> tuple:
    """The stamp of ``model``'s weights: storage, dtype and version counter of every
    parameter and buffer. A model made under ``torch.inference_mode`` has inference tensors,
    which keep no version counter: their storage stands alone (``rebuild`` after writing them
    in place)."""
    return _stamp((*model.parameters(), *model.buffers()))


def _stamp(tensors) -> tuple:
    # Storage and version counter of each (a new dtype or device is a new storage).
    ptrs = tuple([t.data_ptr() for t in tensors])
    try:
        return ptrs, tuple([t._version for t in tensors])
    except RuntimeError:  # inference tensors keep no version counter
        return ptrs, tuple([-1 if t.is_inference() else t._version for t in tensors])


def built(model, name: str, build: Callable):
    """``build(model)``, made once per version of ``model``'s weights and kept beside it.

    A look-up re-stamps the tensors the entry was made from (a loop looks up once per run,
    not per step); a new storage, dtype or version of any of them builds again. Parameters
    *replaced* by other objects are seen when the model's tensors are gathered anew: after
    ``rebuild(model)``, or when another of its tensors changed."""
    entry = _BUILT.get(model)
    if entry is None or _stamp(entry[0]) != entry[1]:
        tensors = (*model.parameters(), *model.buffers())
        entry = _BUILT[model] = (tensors, _stamp(tensors), {})
    made = entry[2].get(name)
    if made is None:
        with torch.no_grad():  # plain tensors derived from the weights, no autograd graph
            made = entry[2][name] = build(model)
    return made


def rebuild(model) -> None:
    """Forget every step built from ``model``: the next look-up builds it again."""
    _BUILT.pop(model, None)


def model_params(model) -> tuple:
    """The tensors of the cached steps, gathered once: ``(layers, wte, wpe, lnf_w, lnf_b,
    arange, causal)`` with ``layers`` each block's ``Block.step_params()`` (plain references:
    a module attribute look-up costs about a microsecond, a dozen per step)."""

    def gather(m):
        tr = m.transformer
        arange = torch.arange(m.config.block_size, device=tr.wte.weight.device)
        layers = [b.step_params() for b in tr.h]
        return (
            layers,
            tr.wte.weight,
            tr.wpe.weight,
            tr.ln_f.weight,
            tr.ln_f.bias,
            arange,
            (m._causal_bias),
        )

    return built(model, "params", gather)


def input_table(model) -> torch.Tensor:
    """``[block_size * vocab_size, 4 * n_embd]``: for every (position, token), row
    ``position * vocab_size + token``, the first layer's input ``x = wte[token] +
    wpe[position]`` and its query/key/value projection ``c_attn(ln_1(x))``, the work of the
    first layer that depends on nothing else.

    One row look-up then replaces four ops of every cached step (``LeanStep``); a draft
    model, called ``k`` times per iteration, gains most. Rows are grouped by position so that
    a one-token step selects ``view(block_size, vocab_size, -1)[position]`` and then its
    token's row. Built once per weights' version (21 MB for the 1-layer draft). The rows are
    computed in one batch, so they may differ from a step's own arithmetic in the last bit:
    use it for a draft (whose ``q`` is reported as computed), not where two runs must agree
    bit for bit.
    """

    def table(m):
        cfg, b = m.config, m.transformer.h[0]
        wte, wpe = m.transformer.wte.weight, m.transformer.wpe.weight
        x = (wpe[:, None, :] + wte[None, :, :]).reshape(-1, cfg.n_embd)
        return torch.cat([x, b.attn.c_attn(b.ln_1(x))], dim=1).contiguous()

    return built(model, "table", table)
