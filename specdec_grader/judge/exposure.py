"""What student code may do with the judge's objects that a check hands it.

A check passes the student's function the judge's own models, caches and callbacks (ex03's
random models, ex04's caches and ``verify``). They stay in the judge; the kernel gets
stand-ins, and every use comes back here as a request that :class:`Exposed` serves, or
refuses. The rules keep the judge's objects the judge's, and every count of their use the
judge's (ex04 counts target calls on the judge's side of the wire):

- a model (``nn.Module``) can be called (directly, or through ``forward``,
  ``hidden_states``, ``decode_hidden``), and read: plain attributes (``config``, ``vocab``)
  and a few methods that change nothing and return no tensor of its own (``eval``,
  ``new_cache``, ``num_parameters``). It exports no weights: no parameters, buffers,
  ``state_dict`` or submodules (a notebook could rebuild the model from them and call the
  copy as often as it likes, uncounted); no hooks, no ``load_state_dict``, no ``train``,
  no ``to``;
- a ``KVCache`` can be read (``length``, ``k``, ``v``, ...), cropped, reset, and have its
  ``length`` set to a whole number within its capacity. Its ``k`` and ``v`` reach the kernel
  as copies, and nothing the kernel writes into them comes back: the cache is the judge's,
  changed only by its own methods. Only inside :func:`.context.cache_writes` (ex07's
  compaction, an API that moves a cache's slots) are ``k`` and ``v`` kept in step with the
  kernel's copies, written back both ways;
- a callback (``verify``) can be called;
- nothing else, and no name that starts with an underscore.
"""

from __future__ import annotations

import functools
import itertools
import types
from typing import Any

import torch
from torch import nn

from specdec_course.model import KVCache

__all__ = ["Exposed"]

# What a model's stand-in answers besides its call: nothing that returns a tensor of the
# model's own (a weight, a buffer, a submodule that holds them).
_MODULE_METHODS = {
    "forward",
    "eval",
    "new_cache",
    "num_parameters",
    "hidden_states",
    "decode_hidden",
}
_CACHE_ATTRS = {"length", "k", "v", "crop", "reset", "batch_size", "capacity", "config"}
LIVE = {"k", "v"}  # a cache's tensors, kept in step with the kernel's copies
_PLAIN = (int, float, str, bool, type(None), tuple, list, torch.Size)
# What the judge spends on a kernel's behalf, per check (reset by :meth:`Exposed.clear`): the
# judge's memory and compute are not on offer. Far above what any check's honest use needs.
_MAX_INPUT = 2**20  # elements of tensor input per call
MAX_TOKENS_PER_CALL = 4096  # B * T of one model call (any entry)
MAX_TOKENS_PER_CHECK = 200_000  # B * T of all model calls of one check
MAX_REQUESTS_PER_CHECK = 20_000  # calls, reads and writes of the judge's objects
MAX_CACHE_ROWS = 16  # batch rows of one new_cache(...)
MAX_CACHE_ROWS_PER_CHECK = 64  # rows of every cache made for one check
_IDS = itertools.count(1)  # never reused: a stand-in kept from an earlier check names nothing


def _tokens(t: torch.Tensor) -> int:
    """B * T of a model input: token ids ``[B, T]``, or hidden states ``[B, T, C]``."""
    if t.dim() == 0:
        return 1
    if t.is_floating_point() and t.dim() >= 2:
        return t.numel() // max(1, t.shape[-1])
    return t.numel()


def _materialised(method, *args, **kwargs):
    out = method(*args, **kwargs)
    if isinstance(out, types.GeneratorType):
        return list(out)
    return out


class Exposed:
    """The judge's objects the kernel currently holds stand-ins for, by id."""

    def __init__(self):
        self.objects: dict[int, Any] = {}
        self.ids: dict[int, int] = {}  # id(obj) -> ref id
        self.callable: set[int] = set()  # ref ids the kernel may call
        self.live: set[tuple[int, str]] = set()  # (ref id, "k" | "v") it holds copies of
        self.spent: dict[str, int] = {"requests": 0, "tokens": 0, "cache_rows": 0}
        # Whether the kernel's writes into a cache's k and v come back (set per call, from
        # :func:`.context.cache_writes`); by default the judge's caches are the judge's.
        self.cache_writes = False

    def clear(self) -> None:
        self.objects.clear()
        self.ids.clear()
        self.callable.clear()
        self.live.clear()
        self.spent = {"requests": 0, "tokens": 0, "cache_rows": 0}

    def charge(self, what: str, n: int, limit: int) -> None:
        """Count ``n`` of ``what`` against this check's budget; ``ValueError`` past ``limit``
        (it goes back to the student's code, which then fails its case)."""
        self.spent[what] = self.spent.get(what, 0) + n
        if self.spent[what] > limit:
            raise ValueError(
                f"your code asked the grader for more than {limit} {what.replace('_', ' ')} "
                "in one check; the reference needs a small fraction of that"
            )

    def _new_cache(self, method, batch_size: int = 1, *args, **kwargs):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise TypeError("new_cache(batch_size) takes a whole number")
        if not 1 <= batch_size <= MAX_CACHE_ROWS:
            raise ValueError(f"new_cache(batch_size) takes 1 .. {MAX_CACHE_ROWS} rows here")
        self.charge("cache_rows", batch_size, MAX_CACHE_ROWS_PER_CHECK)
        return method(batch_size, *args, **kwargs)

    def export(self, obj: Any, *, may_call: bool) -> dict:
        """The tag that stands for ``obj`` on the wire (the same id for the same object)."""
        ref = self.ids.get(id(obj))
        if ref is None:
            ref = next(_IDS)
            self.objects[ref] = obj
            self.ids[id(obj)] = ref
        if may_call:
            self.callable.add(ref)
        return {"$ref": [ref, type(obj).__name__]}

    def for_arguments(self, obj: Any) -> dict | None:
        """How a check's argument that is not plain data travels: a model, a cache or a
        callable becomes a stand-in; anything else cannot be passed (``None``)."""
        if isinstance(obj, nn.Module):
            return self.export(obj, may_call=True)
        if isinstance(obj, KVCache):
            return self.export(obj, may_call=False)
        if callable(obj):
            return self.export(obj, may_call=True)
        return None

    def for_results(self, obj: Any) -> dict | None:
        """How an answer to the kernel travels: models and caches as stand-ins, the methods
        handed out as callables; nothing else that is not data."""
        if isinstance(obj, nn.Module):
            return self.export(obj, may_call=True)
        if isinstance(obj, KVCache):
            return self.export(obj, may_call=False)
        if isinstance(obj, functools.partial) and obj.func in (_materialised, self._new_cache):
            return self.export(obj, may_call=True)
        return None

    def resolve(self, tag: dict) -> Any:
        """The object a ``{"$ref": ...}`` from the kernel names; ``KeyError`` if unknown."""
        if "$ref" not in tag:
            raise KeyError("the kernel may only name the judge's objects it was given")
        ref = tag["$ref"]
        ref_id = ref[0] if isinstance(ref, list) and ref else None
        if not isinstance(ref_id, int) or ref_id not in self.objects:
            # Kept from an earlier check, say: the object is gone.
            raise ReferenceError("that object of the grader's is no longer available")
        return self.objects[ref_id]

    # ---- what the kernel asks

    def call(self, ref: int, args: tuple, kwargs: dict) -> Any:
        if ref not in self.callable:
            raise TypeError(f"the grader's {type(self.objects[ref]).__name__} is not callable")
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise TypeError("keyword arguments must have string names")
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if sum(a.numel() for a in tensors) > _MAX_INPUT:
            raise ValueError(f"the grader's models take at most {_MAX_INPUT} input elements")
        tokens = max((_tokens(a) for a in tensors), default=0)
        if tokens > MAX_TOKENS_PER_CALL:
            raise ValueError(
                f"the grader's models take at most {MAX_TOKENS_PER_CALL} tokens (B * T) a call"
            )
        self.charge("tokens", tokens, MAX_TOKENS_PER_CHECK)
        with torch.no_grad():
            return self.objects[ref](*args, **kwargs)

    def getattr(self, ref: int, name: str) -> tuple[Any, bool]:
        """``(value, live)``: the attribute, and whether it is a cache tensor kept in step."""
        obj = self.objects[ref]
        refuse = AttributeError(
            f"{name!r} of the grader's {type(obj).__name__} is not available to your code "
            "while it is graded (it stands in for the real one: call it, read its config)"
        )
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise refuse
        if isinstance(obj, KVCache):
            if name not in _CACHE_ATTRS:
                raise refuse
            value = getattr(obj, name)
            if name in LIVE:
                if not self.cache_writes:
                    return value.detach().clone(), False  # a copy; writes into it stay there
                self.live.add((ref, name))
                return value, True
            if callable(value):
                return functools.partial(_materialised, value), False
            return value, False
        if isinstance(obj, nn.Module):
            if name in obj._modules or name in obj._parameters or name in obj._buffers:
                raise AttributeError(
                    f"{name!r} of the grader's {type(obj).__name__} is not available to your "
                    "code while it is graded: the model exports no weights and no layers "
                    "(call it, read its config)"
                )
            if name == "new_cache" and callable(getattr(obj, name, None)):
                return functools.partial(self._new_cache, getattr(obj, name)), False
            if name in _MODULE_METHODS and callable(getattr(obj, name, None)):
                return functools.partial(_materialised, getattr(obj, name)), False
            if name == "training" or name in vars(obj):
                value = getattr(obj, name)
                if isinstance(value, _PLAIN) or type(value).__name__ == "GPTConfig":
                    return value, False
        raise refuse

    def setattr(self, ref: int, name: str, value: Any) -> None:
        obj = self.objects[ref]
        if isinstance(obj, KVCache) and name == "length":
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"cache.length must be an int; got {type(value).__name__}")
            if not 0 <= value <= obj.capacity:
                raise ValueError(f"cache.length must lie in 0 .. {obj.capacity}; got {value}")
            obj.length = value
            return
        raise AttributeError(
            f"the grader's {type(obj).__name__} cannot be changed by setting {name!r}"
        )

    def write_back(self, items: Any) -> None:
        """Copy the kernel's changes to a cache's ``k`` / ``v`` into the judge's tensors: only
        while :attr:`cache_writes` (else nothing the kernel sends is taken)."""
        if not self.cache_writes:
            return
        for item in items if isinstance(items, list) else ():
            if not (isinstance(item, list) and len(item) == 3):
                continue
            ref, name, value = item
            if (ref, name) not in self.live or not isinstance(value, torch.Tensor):
                continue
            current = getattr(self.objects[ref], name)
            if current.shape == value.shape and current.dtype == value.dtype:
                with torch.no_grad():
                    current.copy_(value)

    def live_values(self) -> list:
        """``[ref, name, tensor]`` for every cache tensor the kernel holds a copy of."""
        return [[ref, name, getattr(self.objects[ref], name)] for ref, name in sorted(self.live)]
