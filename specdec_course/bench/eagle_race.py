"""The EAGLE-style drafts against the 1-layer draft model on the CPU (``bench eagle``; lesson 09b).

The feature-level draft (``eagle.EagleDraft``, ``"eagle"``), the fused one (the draft
model with a head that reads the target's feature, ``eagle.fused``, ``"fused"``) and the
recurrent one (a cell started from the target's feature, ``eagle.recurrent``,
``"recurrent"``) run beside the draft model (``"draft"``). All four run through
``measure_speedup`` (round-robin with plain decoding, the same prompts and seeds, one
thread) at temperature 1 and 0, for ``k = 1 .. 16`` (the recurrent draft's tokens cost
about half the draft model's, so its best k lies past the draft model's). For each draft
and temperature the record keeps every ``k``'s acceptance and measured speedup, and the best
``k``. The machine's load average is recorded before and after: the ratios are taken within
seconds of each other, so a loaded machine slows every method alike, but not exactly.

``save_eagle_results`` writes ``data/results/eagle_cpu.json``; ``load_eagle_results``
reads it back.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ._args import check_run
from .records import load_record, save_record
from .shipped_drafts import load_drafts
from .speedup import measure_speedup, validation_prompts
from .speedup_record import best_row

__all__ = ["EAGLE_KS", "measure_eagle", "save_eagle_results", "load_eagle_results"]

EAGLE_KS = tuple(range(1, 17))
RESULTS_FILE = "eagle_cpu.json"
COMMAND = "specdec-course bench eagle"


def measure_eagle(
    *, temperatures=(1.0, 0.0), ks=EAGLE_KS, repeats: int = 5, max_new_tokens: int = 200
) -> dict:
    """The shipped target with the shipped draft model, the shipped EAGLE draft, the
    shipped fused draft (the draft model with ``fused.pt``'s head) and the shipped
    recurrent draft.

    Returns ``{"load_before", "load_after", "threads", "runs": [{"temperature", "methods":
    {name: {"rows": [{"k", "alpha", "c", "measured_speedup", "tokens_per_target_call"}],
    "best_k", "best_speedup", "alpha_at_best"}}}]}`` (load: the 1-minute load average; ``c``:
    a drafted token's cost in plain decoding's tokens, as in ``measure_speedup``)."""
    check_run(temperatures=temperatures, ks=ks, repeats=repeats, max_new_tokens=max_new_tokens)
    from ..data import CharTokenizer
    from ..model import load_pretrained

    target = load_pretrained("target")
    drafts = load_drafts(target, ("draft", "eagle", "fused", "recurrent"))
    prompts = validation_prompts(CharTokenizer(target.vocab))
    record = {"load_before": os.getloadavg()[0], "threads": torch.get_num_threads(), "runs": []}
    for t in temperatures:
        res = measure_speedup(
            target,
            drafts,
            prompts,
            ks=ks,
            temperature=t,
            repeats=repeats,
            max_new_tokens=max_new_tokens,
        )
        methods = {}
        for name in drafts:
            best = best_row(res, name)
            methods[name] = {
                "rows": [
                    {
                        key: r[key]
                        for key in ("k", "alpha", "c", "measured_speedup", "tokens_per_target_call")
                    }
                    for r in res["methods"][name]
                ],
                "best_k": best["k"],
                "best_speedup": best["measured_speedup"],
                "alpha_at_best": best["alpha"],
            }
        record["runs"].append({"temperature": t, "repeats": repeats, "methods": methods})
    record["load_after"] = os.getloadavg()[0]
    record["max_new_tokens"] = max_new_tokens
    record["prompts"] = len(prompts)
    return record


def save_eagle_results(record: dict, out: str | Path | None = None) -> Path:
    """Write ``record`` with the command, machine and date as ``eagle_cpu.json`` in ``out``
    (default ``data/results/``). Returns the path."""
    return save_record(RESULTS_FILE, COMMAND, record, out)


def load_eagle_results(directory: str | Path | None = None) -> dict:
    """The stored ``bench eagle`` record (``data/results/eagle_cpu.json``).

    Raises FileNotFoundError (with the command that makes it) when it is missing."""
    return load_record(RESULTS_FILE, COMMAND, directory)
