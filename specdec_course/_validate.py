"""Boundary checks shared by the public functions.

Public functions call these once, on entry, and raise one clear ``ValueError`` that names the
argument and what is wrong with it. Internals trust their callers.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence

import numpy as np
import torch

# Probabilities that come out of a float32 softmax sum to 1 within about 1e-6 per thousand
# entries; 1e-4 accepts those and still catches logits, counts or a forgotten normalisation.
SUM_TOLERANCE = 1e-4

ProbLike = torch.Tensor | np.ndarray | Sequence[float]


def as_tensor(x: ProbLike, name: str) -> torch.Tensor:
    """Turn a tensor, numpy array or list into a floating torch tensor (lists -> float64)."""
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, np.ndarray):
        t = torch.from_numpy(np.asarray(x))
    elif isinstance(x, (list, tuple)):
        try:
            t = torch.tensor(x, dtype=torch.float64)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name} must be a list of numbers; got {x!r} ({e})") from None
    else:
        raise ValueError(
            f"{name} must be a torch.Tensor, numpy array or list of floats, not {type(x).__name__}"
        )
    if not t.is_floating_point():
        t = t.to(torch.float64)
    return t


def check_distribution(x: ProbLike, name: str, *, dim: int | None = 1) -> torch.Tensor:
    """Return ``x`` as a floating tensor after checking it is a probability vector.

    ``dim=1`` asks for one distribution of shape ``[V]``; ``dim=None`` accepts any shape whose
    last axis is the vocabulary. Raises ``ValueError`` for a wrong shape, NaN or infinite
    entries, negative entries, or rows that do not sum to 1 within ``SUM_TOLERANCE``.
    """
    t = as_tensor(x, name)
    if dim is not None and t.dim() != dim:
        raise ValueError(
            f"{name} must be a {dim}-D probability vector of shape [V]; got shape {tuple(t.shape)}"
        )
    if t.numel() == 0 or t.shape[-1] == 0:
        raise ValueError(f"{name} is empty; it needs at least one entry")
    # Two reductions cover every check: min is NaN when any entry is NaN, the sum is not
    # finite when any entry is infinite. This runs on every call, so it is kept cheap.
    lo = t.min().item()
    sums = t.sum(dim=-1, dtype=torch.float64)
    if t.dim() == 1:
        total = sums.item()
        worst_sum, finite = total, math.isfinite(total)
    else:
        dev = (sums - 1).abs()
        worst_sum = sums.flatten()[dev.flatten().argmax()].item()
        finite = bool(torch.isfinite(sums).all())
    if math.isnan(lo) or not finite:
        raise ValueError(f"{name} contains NaN or infinite entries; pass finite probabilities")
    if lo < 0:
        raise ValueError(
            f"{name} has negative entries (min {lo:.4g}); "
            "probabilities must be >= 0 (did you pass logits? apply softmax first)"
        )
    if abs(worst_sum - 1) > SUM_TOLERANCE:
        raise ValueError(
            f"{name} must sum to 1 along its last axis; a row sums to {worst_sum:.6g} "
            "(normalise it, e.g. p / p.sum())"
        )
    return t


def _kind(value) -> str:
    # What a value is, for an error message: "a float", "a bool", "NaN", "infinite", ...
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "infinite"
        return "a float"
    return type(value).__name__


def is_int(value) -> bool:
    """True for a whole number type (``int``, NumPy integers), False for bools and floats
    (``2.0`` included: where an int is due, a float is a mistake somewhere upstream)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_int(value, name: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """``value`` as an ``int`` if it is one (a Python or NumPy integer, not a bool) in
    ``[minimum, maximum]``; else a ValueError naming ``name`` and the value.

    A float (``2.0`` too), a bool, infinity or NaN is refused, never rounded: ``int(inf)``
    would raise OverflowError and ``int(2.7)`` silently truncate.
    """
    if is_int(value) and value >= minimum and (maximum is None or value <= maximum):
        return int(value)
    if maximum is not None:
        what = f"an int in [{minimum}, {maximum}]"
    else:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    got = f"{value!r}" if is_int(value) else f"{value!r} ({_kind(value)})"
    raise ValueError(f"{name} must be {what}; got {got}")


def check_optional_int(value, name: str, *, minimum: int = 1) -> int | None:
    """``None``, or :func:`check_int`'s answer."""
    return None if value is None else check_int(value, name, minimum=minimum)


def check_real(
    value,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    hint: str = "",
) -> float:
    """``value`` as a float if it is a finite real number (not a bool) within the bounds
    (``low < value`` with ``low_open``, else ``low <= value``; the same for ``high``); else a
    ValueError naming ``name``, the value and the range (``hint`` is appended)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    ok = ok and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if ok:
        return float(value)
    if low is not None and high is not None:
        what = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        what = f"a finite number {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        what = f"a finite number {'<' if high_open else '<='} {high:g}"
    else:
        what = "a finite number"
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    kind = "" if real else f" ({_kind(value)})"
    raise ValueError(f"{name} must be {what}; got {value!r}{kind}{hint}")


# ----------------------------------------------------------------------------- token ids

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _nested_ids(x, name: str, V: int, path: str) -> tuple[list[int], tuple[int, ...]]:
    # A (nested) sequence of ids as a flat list and its shape; every leaf is checked here,
    # so that a float is refused rather than truncated and a huge int named, not overflowed.
    flat: list[int] = []
    inner: tuple[int, ...] | None = None
    for i, v in enumerate(x):
        here = f"{path}[{i}]"
        if isinstance(v, (torch.Tensor, np.ndarray)):
            t = _tensor_ids(v, here, V)
            sub, s = t.flatten().tolist(), tuple(t.shape)
        elif isinstance(v, (list, tuple, range)):
            sub, s = _nested_ids(v, name, V, here)
        elif is_int(v):
            if not 0 <= v < V:
                raise ValueError(
                    f"{here} = {v} is outside the vocabulary [0, {V}); encode text with "
                    "the model's CharTokenizer"
                )
            sub, s = [int(v)], ()
        else:
            raise ValueError(
                f"{name} must hold integer token ids; {here} is {v!r} ({_kind(v)}): encode "
                "text with CharTokenizer.encode"
            )
        if inner is None:
            inner = s
        elif s != inner:
            raise ValueError(f"{name} is ragged: {here} has another shape than {path}[0]")
        flat += sub
    return flat, (len(flat) if inner is None else len(x), *(inner or ()))


def _tensor_ids(t, name: str, V: int) -> torch.Tensor:
    if isinstance(t, np.ndarray):
        if t.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integer token ids; got a NumPy array of {t.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(t).astype(np.int64, copy=False))
    if t.dtype not in _INT_DTYPES:
        raise ValueError(f"{name} must hold integer token ids (int64); got a tensor of {t.dtype}")
    if t.numel():
        lo, hi = (int(v) for v in torch.aminmax(t.long()))
        if lo < 0 or hi >= V:
            raise ValueError(
                f"{name} holds ids from {lo} to {hi}, outside the vocabulary [0, {V}); encode "
                "text with the model's CharTokenizer"
            )
    return t


def check_ids(x, name: str, vocab_size: int, *, dim: int = 1) -> torch.Tensor:
    """Token ids in any container as an int64 tensor of ``dim`` axes, each id in
    ``[0, vocab_size)``.

    ``x`` may be a tensor or NumPy array of an integer dtype, or a (nested) list, tuple or
    range of ints; ``dim=1`` also takes a ``[1, T]`` batch of one. A float anywhere (a float
    tensor, or ``1.5`` in a list), a bool, text, an id outside the vocabulary or a ragged
    nesting is a ValueError naming ``name``: nothing is rounded or truncated. Emptiness is
    the caller's to judge. The result is on ``x``'s device (CPU for lists).
    """
    if isinstance(x, str):
        raise ValueError(
            f"{name} must be token ids, not text ({x[:20]!r}); encode it with CharTokenizer.encode"
        )
    if isinstance(x, Iterator):  # a generator of ids: read once
        x = list(x)
    if isinstance(x, (torch.Tensor, np.ndarray)):
        t = _tensor_ids(x, name, vocab_size)
    elif isinstance(x, (list, tuple, range)):
        flat, shape = _nested_ids(x, name, vocab_size, name)
        t = torch.tensor(flat, dtype=torch.long).view(shape)
    else:
        raise ValueError(
            f"{name} must be token ids (a tensor or list of ints); got {type(x).__name__}"
        )
    if dim == 1 and t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != dim:
        want = "1-D [T]" if dim == 1 else f"{dim}-D" + (" [B, T]" if dim == 2 else "")
        raise ValueError(f"{name} must be {want} token ids; got shape {tuple(t.shape)}")
    return t.to(torch.long)


def check_token_batch(idx) -> tuple[int, int]:
    """``(B, T)`` of a model's input: an int64 tensor ``[B, T]`` with ``T >= 1``, else a
    ValueError saying what it got (``model.CharGPT`` and ``llm.Llama`` both check this)."""
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype != torch.long:
        got = (
            f"{tuple(idx.shape)} {idx.dtype}"
            if isinstance(idx, torch.Tensor)
            else type(idx).__name__
        )
        raise ValueError(f"idx must be an int64 tensor of shape [B, T]; got {got}")
    B, T = idx.shape
    if T < 1:
        raise ValueError("idx must hold at least one token (T >= 1)")
    return B, T


def check_same_shape(a: torch.Tensor, b: torch.Tensor, na: str, nb: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{na} and {nb} must have the same shape; got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def check_pair(p: ProbLike, q: ProbLike) -> tuple[torch.Tensor, torch.Tensor]:
    """``p`` and ``q`` as checked probability vectors of one shape, ``q`` in ``p``'s dtype."""
    p = check_distribution(p, "p")
    q = check_distribution(q, "q")
    check_same_shape(p, q, "p", "q")
    if p.dtype != q.dtype:
        q = q.to(p.dtype)
    return p, q


# ------------------------------------------------------------------- generators, proposers


def check_generator(generator, name: str = "generator"):
    """``generator`` if it is ``None`` or a ``torch.Generator``; else ValueError (a seed is
    not a generator: pass ``torch.Generator().manual_seed(seed)``)."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    raise ValueError(
        f"{name} must be a torch.Generator or None (e.g. torch.Generator().manual_seed(0)); "
        f"got {generator!r} ({type(generator).__name__})"
    )


def symbols_of(obj) -> str | None:
    """The characters a model or proposer maps its ids to, where it declares them: a str
    ``vocab`` (a loaded ``CharGPT``), ``tokenizer.vocab`` (``NgramDraft``) or ``model.vocab``
    (``ModelProposer``); None when it declares none (a model built in a cell)."""
    for holder in (obj, getattr(obj, "tokenizer", None), getattr(obj, "model", None)):
        vocab = getattr(holder, "vocab", None)
        if isinstance(vocab, str):
            return vocab
    return None


def _shape_of(model) -> str:
    cfg = getattr(model, "config", None)
    if cfg is None:
        return type(model).__name__
    return (
        f"{type(model).__name__} with {getattr(cfg, 'n_layer', '?')} layers, "
        f"n_embd={getattr(cfg, 'n_embd', '?')}"
    )


def _same(a: torch.device, b: torch.device) -> bool:
    # "cuda" and "cuda:0" name one device when the current device is 0; tensors always
    # report an index, so compare with the index filled in.
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    cur = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return (a.index if a.index is not None else cur) == (b.index if b.index is not None else cur)


def check_same_device(what: str, a: torch.device, other: str, b: torch.device) -> None:
    """ValueError unless ``a`` and ``b`` are one device; the message names both sides."""
    if not _same(torch.device(a), torch.device(b)):
        raise ValueError(
            f"{what} and {other} are on different devices ({a} and {b}); put them on one "
            "device (model.to(device), tensor.to(device))"
        )


def check_proposer_fits(proposer, target, name: str = "draft", *, length: int | None = None):
    """ValueError unless ``proposer`` can draft for ``target`` (and ``length`` positions).

    Checks that the vocabulary sizes match, that the characters behind the ids match where
    both declare them (:func:`symbols_of`: a draft whose ids mean other characters keeps the
    output exact but proposes nonsense, so it is refused rather than run slowly), and, where
    the proposer declares the target it was built for (a ``target`` attribute, as
    ``eagle.EagleProposer`` has), that it is this very target (one built for another would
    read features of another shape or meaning and fail, or mislead, mid-generation); that a
    draft model holds ``length`` positions in its context, and that the proposer is on the
    target's device.
    """
    V = target.config.vocab_size
    Vd = getattr(proposer, "vocab_size", None)
    if Vd is None:  # a model rather than a proposer
        Vd = getattr(getattr(proposer, "config", None), "vocab_size", None)
    if Vd != V:
        raise ValueError(
            f"target and {name} must share a vocabulary; got sizes {V} and {Vd!r}: build the "
            f"{name} with the target's CharTokenizer"
        )
    ts, ds = symbols_of(target), symbols_of(proposer)
    if ts is not None and ds is not None and ts != ds:
        i = next(j for j, (a, b) in enumerate(zip(ts, ds)) if a != b)
        raise ValueError(
            f"the {name}'s ids mean other characters than the target's (id {i} is {ds[i]!r} "
            f"for the {name}, {ts[i]!r} for the target); build the {name} with the target's "
            "vocabulary (CharTokenizer(target.vocab))"
        )
    built_for = getattr(proposer, "target", None)
    if built_for is not None and built_for is not target:
        raise ValueError(
            f"the {name} ({type(proposer).__name__}) was built for another target "
            f"({_shape_of(built_for)}) than the one passed ({_shape_of(target)}); build it "
            f"for this one, e.g. EagleProposer(eagle.load_eagle(target=target), target)"
        )
    # A draft model must hold the whole sequence in its own context, on the target's device.
    block = getattr(getattr(getattr(proposer, "model", None), "config", None), "block_size", None)
    if length is not None and block is not None and length > block:
        raise ValueError(
            f"prompt + max_new_tokens = {length} exceeds the context of {block} positions the "
            f"{name} model was trained on; shorten the prompt or generate fewer tokens"
        )
    dev = target.lm_head.weight.device
    check_same_device(f"the {name}", getattr(proposer, "device", dev), "the target", dev)
