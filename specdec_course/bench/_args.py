"""The checks every benchmark makes on entry, before it times anything.

A benchmark runs for minutes; a bad argument found in its tenth minute (a float ``k``, a
prompt of floats, a draft built for another target) wastes all of them. Each ``measure_*``
function calls :func:`check_run` first, with the arguments it takes.
"""

from __future__ import annotations

from .._validate import check_ids, check_int, check_proposer_fits
from ..sampling import check_processing

__all__ = ["check_run"]


def check_run(
    *,
    target=None,
    drafts=None,
    prompts=None,
    ks=None,
    repeats=None,
    max_new_tokens=None,
    seed=None,
    temperature=None,
    temperatures=None,
    prompt_dim: int = 1,
) -> None:
    """ValueError, naming the argument, unless each one given is what a benchmark takes:
    ``ks`` a non-empty collection of ints >= 1, ``repeats`` and ``max_new_tokens`` ints
    >= 1, ``seed`` an int >= 0, ``temperature`` (or each of ``temperatures``) a valid
    sampling temperature, ``prompts`` integer ids of ``target``'s vocabulary (a list of
    1-D prompts, or with ``prompt_dim=2`` one ``[B, T]`` batch), ``drafts`` a dict of
    drafts (``CharGPT`` or proposers) that fit ``target``."""
    if ks is not None:
        ks = list(ks) if not isinstance(ks, (str, bytes)) and hasattr(ks, "__iter__") else ks
        if not isinstance(ks, list) or not ks:
            raise ValueError(f"ks must be a non-empty list of ints >= 1; got {ks!r}")
        for i, k in enumerate(ks):
            check_int(k, f"ks[{i}]")
    if repeats is not None:
        check_int(repeats, "repeats")
    if max_new_tokens is not None:
        check_int(max_new_tokens, "max_new_tokens")
    if seed is not None:
        check_int(seed, "seed", minimum=0)
    for t in [temperature] if temperatures is None else list(temperatures):
        if t is not None:
            check_processing(t, None, None)
    if prompts is not None and target is not None:
        V = target.config.vocab_size
        if prompt_dim == 2:
            check_ids(prompts, "prompts", V, dim=2)
        else:
            if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__"):
                raise ValueError(f"prompts must be a list of 1-D prompts; got {prompts!r}")
            if len(prompts) == 0:
                raise ValueError("prompts is empty; give at least one prompt")
            for i, p in enumerate(prompts):
                if len(check_ids(p, f"prompts[{i}]", V)) == 0:
                    raise ValueError(f"prompts[{i}] is empty; give at least one token")
    if drafts is not None and target is not None:
        from ..drafts import as_proposer

        if not isinstance(drafts, dict) or not drafts:
            raise ValueError(f"drafts must be a non-empty dict name -> draft; got {drafts!r}")
        for name, draft in drafts.items():
            check_proposer_fits(as_proposer(draft), target, f"drafts[{name!r}]")
