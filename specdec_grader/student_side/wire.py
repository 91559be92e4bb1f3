"""The batch grader's channel format: plain values as JSON, tensors as raw bytes, in frames.

The judge (the trusted grader process) and the kernel (student code, in the sandbox) talk
through two pipes. A frame is ``u32 total length | u32 header length | header | blobs``: the
header is JSON, the blobs hold the bytes of the tensors it names. Values are plain data:

- ``None``, ``bool``, ``int``, ``str``, ``float`` (``nan``/``inf`` tagged), lists, tuples, dicts;
- tensors and numpy arrays as dtype + shape + bytes (dtypes from a short list only), numpy
  scalars, ``torch.Generator`` states, dtypes, ``GPTConfig`` and ``RejectionResult``;
- ``{"$ref": ...}``: an object that stays on the sender's side (the judge's models, caches,
  callbacks), resolved by a hook; anything else arrives as an :class:`Opaque` type name.

Decoding is the trust boundary: nothing is unpickled, nesting is bounded, every tensor's byte
count must match its dtype and shape, and a frame is at most ``MAX_FRAME`` bytes. Any breach
raises :class:`WireError`.
"""

from __future__ import annotations

import json
import math
import os
import select
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

# Errors cross the wire as plain data (kernel.errors); re-exported for the wire's callers.
from .errors import error_info, rebuild_error

__all__ = [
    "MAX_FRAME",
    "Opaque",
    "WireError",
    "decode",
    "encode",
    "error_info",
    "read_frame",
    "rebuild_error",
    "write_frame",
]

MAX_FRAME = 64 * 2**20  # bytes; the largest thing a check sends is well under 2 MB
MAX_DEPTH = 24
MAX_DIMS = 16
_HEAD = struct.Struct(">II")

# dtype name -> (torch dtype, numpy dtype of the same bytes). bfloat16 travels as int16 bits.
_DTYPES: dict[str, tuple[torch.dtype, np.dtype]] = {
    "float64": (torch.float64, np.dtype("<f8")),
    "float32": (torch.float32, np.dtype("<f4")),
    "float16": (torch.float16, np.dtype("<f2")),
    "bfloat16": (torch.bfloat16, np.dtype("<i2")),
    "int64": (torch.int64, np.dtype("<i8")),
    "int32": (torch.int32, np.dtype("<i4")),
    "int16": (torch.int16, np.dtype("<i2")),
    "int8": (torch.int8, np.dtype("i1")),
    "uint8": (torch.uint8, np.dtype("u1")),
    "bool": (torch.bool, np.dtype("?")),
}
_BY_TORCH = {t: name for name, (t, _) in _DTYPES.items()}
_NP_NAMES = {"float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"}


class WireError(Exception):
    """A frame or value that does not follow the format (or is too large)."""


class Opaque:
    """Stands in for a value that cannot cross the channel; says only what type it was."""

    def __init__(self, type_name: str):
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name} object>"


# --------------------------------------------------------------------------- encoding


class _Encoder:
    def __init__(self, ref: Callable[[Any], Any] | None):
        self.ref = ref
        self.blobs: list[bytes] = []
        self.size = 0
        self.memo: dict[int, Any] = {}  # id(tensor) -> its descriptor: aliases stay aliases
        self.keep: list[Any] = []  # keeps memoised objects alive (ids stay unique)
        self.objects: list[Any] = []  # every tensor and generator, in blob order

    def blob(self, data: bytes) -> list[int]:
        off = self.size
        self.size += len(data)
        if self.size > MAX_FRAME:
            raise WireError(f"value too large to send (over {MAX_FRAME // 2**20} MiB)")
        self.blobs.append(data)
        return [off, len(data)]

    def tensor(self, t: torch.Tensor) -> dict:
        if id(t) in self.memo:
            return self.memo[id(t)]
        plain = t.detach()
        if type(plain) is not torch.Tensor:
            plain = plain.as_subclass(torch.Tensor)
        name = _BY_TORCH.get(plain.dtype)
        if name is None or plain.layout != torch.strided or plain.is_quantized:
            return {"$opaque": f"tensor of dtype {plain.dtype}"}
        plain = plain.to("cpu").contiguous()
        if name == "bfloat16":
            plain = plain.view(torch.int16)
        blob = self.blob(plain.numpy().tobytes())
        desc = {"$tensor": [name, list(plain.shape), *blob, len(self.objects)]}
        self.memo[id(t)] = desc
        self.keep.append(t)
        self.objects.append(t)
        return desc

    def __call__(self, x: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise WireError(f"value nested deeper than {MAX_DEPTH} levels")
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return x if abs(x) < 2**63 else {"$opaque": "int larger than 64 bits"}
        if isinstance(x, float):
            return x if math.isfinite(x) else {"$float": repr(x)}
        if isinstance(x, torch.Tensor):
            return self.tensor(x)
        if isinstance(x, np.ndarray):
            name = x.dtype.name
            if name not in _NP_NAMES or x.dtype.hasobject:
                return {"$opaque": f"ndarray of dtype {name}"}
            c = np.ascontiguousarray(x)
            return {"$ndarray": [name, list(c.shape), *self.blob(c.tobytes()), -1]}
        if isinstance(x, np.generic):
            if x.dtype.name not in _NP_NAMES:
                return {"$opaque": f"numpy {x.dtype.name}"}
            v = x.item()
            return {"$npscalar": [x.dtype.name, self(v, depth + 1)]}
        if isinstance(x, torch.Generator):
            if id(x) in self.memo:
                return self.memo[id(x)]
            desc = {"$generator": [*self.blob(x.get_state().numpy().tobytes()), len(self.objects)]}
            self.memo[id(x)] = desc
            self.keep.append(x)
            self.objects.append(x)
            return desc
        if isinstance(x, torch.dtype):
            name = _BY_TORCH.get(x)
            return {"$dtype": name} if name else {"$opaque": str(x)}
        if isinstance(x, torch.Size):
            return {"$tuple": [self(v, depth + 1) for v in x]}
        if _is_config(x):
            return {"$config": {k: self(v, depth + 1) for k, v in vars(x).items()}}
        if _is_rejection(x):
            return {"$rejection": [self(x.token_ids, depth + 1), self(x.num_accepted, depth + 1)]}
        if isinstance(x, (list, tuple)):
            items = [self(v, depth + 1) for v in x]
            return items if type(x) is list else {"$tuple": items}
        if isinstance(x, dict):
            return {"$dict": [[self(k, depth + 1), self(v, depth + 1)] for k, v in x.items()]}
        if self.ref is not None:
            r = self.ref(x)
            if r is not None:
                return r
        return {"$opaque": _type_name(x)}


def _type_name(x: Any) -> str:
    try:
        return str(type(x).__qualname__)[:80]
    except Exception:  # noqa: BLE001 - a type with a broken name
        return "object"


def _is_config(x: Any) -> bool:
    from specdec_course.model import GPTConfig

    return type(x) is GPTConfig


def _is_rejection(x: Any) -> bool:
    from specdec_course.verifier import RejectionResult

    return type(x) is RejectionResult


def encode(x: Any, ref: Callable[[Any], Any] | None = None) -> tuple[Any, list[bytes], list[Any]]:
    """``x`` as ``(json_value, blobs, objects)``.

    ``ref(obj)`` is asked about anything that is not plain data and returns the tag to send
    instead (``{"$ref": [id, type]}``, ``{"$student": name}``) or ``None`` (the object then
    travels as an :class:`Opaque` type name).
    ``objects`` lists every tensor and generator encoded, in order (for write-back). Raises
    :class:`WireError` when ``x`` is too large or too deep.
    """
    enc = _Encoder(ref)
    return enc(x), enc.blobs, enc.objects


# --------------------------------------------------------------------------- decoding


class _Decoder:
    def __init__(self, blob: bytes | memoryview, ref: Callable[[Any], Any] | None):
        self.data = memoryview(blob)
        self.ref = ref
        self.memo: dict[int, Any] = {}  # object index -> the tensor or generator made for it
        self.objects: list[Any] = []

    def bytes_at(self, off: Any, n: Any) -> memoryview:
        if not (isinstance(off, int) and isinstance(n, int) and 0 <= off and 0 <= n):
            raise WireError("bad blob offset")
        if off + n > len(self.data):
            raise WireError("blob past the end of the frame")
        return self.data[off : off + n]

    def indexed(self, idx: Any) -> Any:
        # An object seen before (the same tensor passed twice stays one tensor), or None
        # for the next new one; indices must come in order.
        if not isinstance(idx, int) or isinstance(idx, bool):
            raise WireError("bad object index")
        if idx in self.memo:
            return self.memo[idx]
        if idx != len(self.objects):
            raise WireError("object index out of order")
        return None

    def add(self, obj: Any) -> Any:
        self.memo[len(self.objects)] = obj
        self.objects.append(obj)
        return obj

    def array(self, spec: Any, numpy_out: bool) -> Any:
        if not (isinstance(spec, list) and len(spec) == 5):
            raise WireError("bad tensor descriptor")
        name, shape, off, n, idx = spec
        if not numpy_out:
            seen = self.indexed(idx)
            if seen is not None:
                return seen
        if name not in _DTYPES or (numpy_out and name not in _NP_NAMES):
            raise WireError(f"dtype {name!r} is not allowed")
        if not (
            isinstance(shape, list)
            and len(shape) <= MAX_DIMS
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
        ):
            raise WireError("bad tensor shape")
        _, ndtype = _DTYPES[name]
        if math.prod(shape) * ndtype.itemsize != n:
            raise WireError("tensor bytes do not match its dtype and shape")
        arr = np.frombuffer(self.bytes_at(off, n), dtype=ndtype).reshape(shape).copy()
        if numpy_out:
            return arr
        t = torch.from_numpy(arr)
        if name == "bfloat16":
            t = t.view(torch.bfloat16)
        return self.add(t)

    def __call__(self, x: Any, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            raise WireError("value nested too deeply")
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [self(v, depth + 1) for v in x]
        if not (isinstance(x, dict) and len(x) == 1):
            raise WireError("malformed value")
        ((tag, v),) = x.items()
        if tag == "$tuple" and isinstance(v, list):
            return tuple(self(i, depth + 1) for i in v)
        if tag == "$dict" and isinstance(v, list):
            out = {}
            for kv in v:
                if not (isinstance(kv, list) and len(kv) == 2):
                    raise WireError("malformed dict")
                k = self(kv[0], depth + 1)
                try:
                    out[k] = self(kv[1], depth + 1)
                except TypeError as e:  # an unhashable key
                    raise WireError("unhashable dict key") from e
            return out
        if tag == "$float" and v in ("nan", "inf", "-inf"):
            return float(v)
        if tag == "$tensor":
            return self.array(v, numpy_out=False)
        if tag == "$ndarray":
            return self.array(v, numpy_out=True)
        if tag == "$npscalar" and isinstance(v, list) and len(v) == 2 and v[0] in _NP_NAMES:
            val = self(v[1], depth + 1)
            if not isinstance(val, (bool, int, float)):
                raise WireError("bad numpy scalar")
            return np.dtype(v[0]).type(val)
        if tag == "$generator" and isinstance(v, list) and len(v) == 3:
            seen = self.indexed(v[2])
            if seen is not None:
                return seen
            g = torch.Generator()
            try:
                state = bytearray(self.bytes_at(v[0], v[1]))
                g.set_state(torch.frombuffer(state, dtype=torch.uint8))
            except (RuntimeError, ValueError) as e:
                raise WireError("bad generator state") from e
            return self.add(g)
        if tag == "$dtype" and v in _DTYPES:
            return _DTYPES[v][0]
        if tag == "$config" and isinstance(v, dict):
            from specdec_course.model import GPTConfig

            try:
                return GPTConfig(**{str(k): self(i, depth + 1) for k, i in v.items()})
            except (TypeError, ValueError) as e:
                raise WireError(f"bad GPTConfig: {e}") from e
        if tag == "$rejection" and isinstance(v, list) and len(v) == 2:
            from specdec_course.verifier import RejectionResult

            return RejectionResult(self(v[0], depth + 1), self(v[1], depth + 1))
        if tag == "$opaque" and isinstance(v, str):
            return Opaque(v[:80])
        if tag in ("$ref", "$student") and self.ref is not None:
            return self.ref({tag: v})
        raise WireError(f"unknown or malformed tag {tag!r}")


def decode(
    x: Any, blob: bytes | memoryview = b"", ref: Callable[[Any], Any] | None = None
) -> tuple[Any, list[Any]]:
    """The value that :func:`encode` turned into ``x`` and ``blob``, and its objects.

    ``ref({"$ref": id})`` (or ``{"$student": name}``) turns a reference back into an object;
    without ``ref`` a reference is an error. Returns ``(value, objects)``, ``objects`` being
    every tensor and generator created, in blob order. Raises :class:`WireError`.
    """
    dec = _Decoder(blob, ref)
    return dec(x), dec.objects


# --------------------------------------------------------------------------- frames


def write_frame(
    fd: int, header: dict, blobs: list[bytes] = (), deadline: float | None = None
) -> None:
    """Send one frame on file descriptor ``fd``.

    ``deadline`` (a ``time.monotonic()`` value) bounds the wait for the other side to read
    it: ``TimeoutError`` after it (a kernel that reads a frame's header and stops reading
    must not hold the judge). Raises ``OSError`` on a closed pipe and :class:`WireError` for
    a frame over ``MAX_FRAME``."""
    head = json.dumps(header, allow_nan=False, separators=(",", ":")).encode()
    total = 4 + len(head) + sum(len(b) for b in blobs)
    if total > MAX_FRAME:
        raise WireError(f"frame too large ({total} bytes)")
    data = b"".join([_HEAD.pack(total, len(head)), head, *blobs])
    view = memoryview(data)
    if deadline is None:
        while view:
            n = os.write(fd, view)
            view = view[n:]
        return
    blocking = os.get_blocking(fd)
    os.set_blocking(fd, False)
    try:
        while view:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise TimeoutError("the other side did not read in time")
            try:
                n = os.write(fd, view[: 1 << 16])
            except BlockingIOError:
                continue
            view = view[n:]
    finally:
        os.set_blocking(fd, blocking)


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("no answer in time")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None) -> tuple[dict, memoryview]:
    """Read one frame from ``fd``: ``(header, blobs)``.

    ``deadline`` (a ``time.monotonic()`` value) bounds the wait: ``TimeoutError`` after it.
    Raises ``EOFError`` when the pipe closes and :class:`WireError` for a malformed frame.
    """
    total, head_len = _HEAD.unpack(_read_exact(fd, 8, deadline))
    if total > MAX_FRAME or head_len > total - 4:
        raise WireError("frame header out of range")
    body = _read_exact(fd, total - 4, deadline)
    try:
        header = json.loads(body[:head_len])
    except (ValueError, RecursionError) as e:
        raise WireError(f"frame is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise WireError("frame header is not an object")
    return header, memoryview(body)[head_len:]
