"""The speedups the roofline model (``bench.roofline``) predicts per method: a model.

Each method's acceptance is the one this course measured on its own character-level pair
(``speedup_cpu.json``, ``eagle_cpu.json``); its costs are the roofline model's for a named
target and draft shape on a named GPU. The figures say what Theorem 3.8 predicts *if* a
Llama-sized pair accepted as often as ours, in the regime the theorem assumes; a stored GPU
record (``bench.gpu_speedup_report``) is a measurement and replaces them where one exists.
"""

from __future__ import annotations

from functools import lru_cache

from .. import theory
from .roofline import (
    DEFAULT_CONTEXT,
    GPUSpec,
    ModelledCall,
    ModelShape,
    _gpu,
    _shape,
    eagle_draft_shape,
    format_modelled_ratios,
    medusa_heads_shape,
    modelled_call,
    scaled_draft_shape,
)

__all__ = [
    "measured_acceptance",
    "recurrent_token_fraction",
    "modelled_speedups",
    "format_modelled_speedups",
    "format_roofline_report",
]


def measured_acceptance(temperature: float = 1.0, directory=None) -> dict:
    """The acceptance this course measured on its own pair, per method, at ``temperature``.

    ``{"draft" | "ngram" | "distilled" | "eagle": [(k, alpha), ...], "medusa": [(tree, nodes,
    tokens per target call), ...]}`` from ``speedup_cpu.json`` (``bench.load_speedup_results``)
    and ``eagle_cpu.json`` (``bench.load_eagle_results``) in ``directory`` (default
    data/results/); a method missing from a record is left out. Raises ValueError when
    neither record holds ``temperature``, FileNotFoundError when a record is missing.
    """
    from .eagle_race import load_eagle_results
    from .speedup_record import load_speedup_results

    out: dict = {}
    for res in load_speedup_results(directory)["results"]:
        if res["temperature"] == temperature:
            for name, rows in res["methods"].items():
                out[name] = [(r["k"], r["alpha"]) for r in rows]
            if res.get("medusa"):
                out["medusa"] = [
                    (r["tree"], r["nodes"], r["tokens_per_target_call"]) for r in res["medusa"]
                ]
    for run in load_eagle_results(directory)["runs"]:
        if run["temperature"] == temperature and "eagle" in run["methods"]:
            out["eagle"] = [(r["k"], r["alpha"]) for r in run["methods"]["eagle"]["rows"]]
    if not out:
        raise ValueError(f"no stored speedup or eagle result at temperature {temperature!r}")
    return out


# What each method drafts with, for the model: a shape's call (priced) or nothing (the
# n-gram tables are a host look-up, c = 0 next to a call of milliseconds). The fused draft is
# the draft model's step with a small head beside it, priced as the draft model's; the
# recurrent draft is not a decoder and is priced by its own share of its target's weights.
# A method missing here has no price: modelled_speedups raises rather than guess one.
_DRAFTED_BY = {
    "draft": "draft",
    "fused": "draft",
    "ngram": None,
    "distilled": None,
    "eagle": "eagle",
    "recurrent": "recurrent",
}


def _linear_weights(modules) -> int:
    import torch.nn as nn

    return sum(m.weight.numel() for m in modules if isinstance(m, nn.Linear))


@lru_cache(maxsize=1)
def recurrent_token_fraction() -> float:
    """Per drafted token, the weights the shipped recurrent draft multiplies (its cell's ``A``
    and ``B`` and its output layer) over those one step of the shipped target multiplies (its
    blocks' linear layers and its LM head): what a drafted token costs beside a target step
    where a step costs the bytes of the weights it reads. The once-per-proposal products
    over the feature are left out, so the true cost is higher. Raises FileNotFoundError when
    a checkpoint is missing."""
    from ..drafts.eagle import load_recurrent
    from ..model import load_pretrained

    target = load_pretrained("target")
    cell = load_recurrent(target=target)
    return _linear_weights([cell.A, cell.B, cell.out]) / _linear_weights(target.modules())


def _default_heads() -> int:
    from ..medusa import DEFAULT_HEADS

    return DEFAULT_HEADS


def modelled_speedups(
    acceptance: dict,
    gpu: GPUSpec | str = "h200",
    target: ModelShape | str = "llama-3-8b",
    draft: ModelShape | str = "llama-3.2-1b",
    batch: int = 1,
    context: int = DEFAULT_CONTEXT,
    overhead_s: float = 0.0,
    medusa_heads: int | None = None,
) -> list[dict]:
    """Per method, the speedups the roofline model predicts at the measured acceptance.

    ``acceptance`` is ``measured_acceptance()``'s dict. For a chain draft at each measured
    ``k``: ``c`` = the model's draft call over its one-token target call (the draft shape's,
    also for the fused draft; EAGLE's ``eagle_draft_shape(target)``; the recurrent draft's
    ``scaled_draft_shape`` at ``recurrent_token_fraction()``; 0 for the n-gram tables),
    ``ratio`` = the ``(k + 1)``-token target call over the one-token one, Theorem 3.8's
    ``theory.speedup(alpha, k, c)`` (``thm38``, which takes ratio = 1) and ``priced`` =
    ``expected_tokens(alpha, k) / (k c + ratio)``. For Medusa's trees: ``c`` = the heads'
    call (``medusa_heads_shape``, with ``medusa_heads`` heads, default
    ``medusa.DEFAULT_HEADS``), the tree's ``nodes``-token call priced, and the measured
    tokens per call in place of Theorem 3.8's expectation (``thm38`` = those tokens, a free
    call). ``fits``: the target's call and the draft's weights and KV caches fit in the
    GPU's memory. Returns one dict per method: ``method``, ``rows`` and ``best`` (the row
    with the largest ``priced`` among those that fit, if any do). Raises ValueError as
    ``modelled_call``, and for a method the model has no price for.
    """
    target, gpu = _shape(target), _gpu(gpu)
    drafters = {"draft": _shape(draft), "eagle": eagle_draft_shape(target)}
    if "recurrent" in acceptance:
        drafters["recurrent"] = scaled_draft_shape(
            target, recurrent_token_fraction(), f"recurrent draft of {target.name}"
        )

    def call(shape: ModelShape, tokens: int) -> ModelledCall:
        return modelled_call(shape, gpu, tokens, batch, context, overhead_s)

    one = call(target, 1).time_s
    out = []
    for method, rows in acceptance.items():
        if method == "medusa":
            shape = medusa_heads_shape(target, medusa_heads or _default_heads())
            runs = [(tree, nodes, tok, None) for tree, nodes, tok in rows]
        else:
            if method not in _DRAFTED_BY:
                raise ValueError(
                    f"the roofline model has no price for method {method!r}; known: "
                    f"{', '.join(sorted(_DRAFTED_BY))} and medusa"
                )
            shape = drafters.get(_DRAFTED_BY[method])
            runs = [(k, k + 1, theory.expected_tokens(alpha, k), alpha) for k, alpha in rows]
        c = 0.0 if shape is None else call(shape, 1).time_s / one
        draft_memory = 0 if shape is None else call(shape, 1).resident_bytes
        priced = []
        for k, tokens, tok, alpha in runs:
            verify = call(target, tokens)
            r = verify.time_s / one
            row = {"k": k, "tokens": tok, "c": c, "ratio": r}
            if alpha is None:  # a tree: one call with the heads, the measured tokens per call
                row.update(thm38=tok, priced=tok / (r + c))
            else:
                row.update(alpha=alpha, thm38=theory.speedup(alpha, k, c))
                row["priced"] = tok / (k * c + r)
            fits = not gpu.memory or verify.resident_bytes + draft_memory <= gpu.memory
            priced.append({**row, "fits": fits})
        best = max([r for r in priced if r["fits"]] or priced, key=lambda r: r["priced"])
        out.append({"method": method, "rows": priced, "best": best})
    return out


def format_modelled_speedups(predictions: list[dict], heading: str) -> str:
    """``modelled_speedups``'s result as text: each method's best row, under ``heading``
    (which should say which model, GPU and batch; "model" is added if it is missing)."""
    if "model" not in heading.lower():
        heading = "ROOFLINE MODEL (not a measurement): " + heading
    lines = [
        heading,
        " method    | best k / tree | alpha | tok/call |   c   | call / 1-token call "
        "| Thm 3.8 | priced",
    ]
    for p in predictions:
        b = p["best"]
        alpha = f"{b['alpha']:.3f}" if "alpha" in b else "  -  "
        lines.append(
            f" {p['method']:9s} | {b['k']!s:>13} | {alpha} | {b['tokens']:8.2f} | {b['c']:.3f} | "
            f"{b['ratio']:19.3f} | {b['thm38']:6.2f}x | {b['priced']:5.2f}x"
            + ("" if b["fits"] else "  (does not fit in the GPU's memory)")
        )
    return "\n".join(lines)


def format_roofline_report(
    gpu: GPUSpec | str = "h200",
    target: ModelShape | str = "llama-3-8b",
    draft: ModelShape | str = "llama-3.2-1b",
    batches=(1, 16, 64),
    context: int = DEFAULT_CONTEXT,
    overhead_s: float = 0.0,
    temperature: float = 1.0,
    directory=None,
) -> str:
    """What ``specdec-course bench roofline`` prints: the model's call-cost table
    (``format_modelled_ratios``) and, per batch size, each method's predicted best speedup
    at the acceptance stored in ``directory`` (default data/results/), all headed as a model;
    then a line naming the stored GPU record, where there is one, that measures instead."""
    from .speedup_record import load_gpu_speedup_results

    target, draft = _shape(target), _shape(draft)
    acceptance = measured_acceptance(temperature, directory)
    parts = [format_modelled_ratios(target, gpu, batches, context=context, overhead_s=overhead_s)]
    for B in batches:
        preds = modelled_speedups(acceptance, gpu, target, draft, B, context, overhead_s)
        parts.append(
            format_modelled_speedups(
                preds,
                f"ROOFLINE MODEL (not a measurement): {target.name} with {draft.name} as the "
                f"draft model, B = {B}, alpha measured on this course's pair at temperature "
                f"{temperature:g}",
            )
        )
    record = load_gpu_speedup_results(directory)
    parts.append(
        "No GPU record is stored: these are the model's figures only."
        if record is None
        else f"A GPU record is stored ({record['machine']}, {record['date']}): "
        "bench.gpu_speedup_report() prints what was measured."
    )
    return "\n\n".join(parts)
