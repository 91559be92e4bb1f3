"""Which float32 product serves each call size, measured on the running machine (``llm.packed``).

:func:`calibrate` runs once per machine, at ``llm.load``. It checks bit for bit, on every
product shape of a block and on the tied head, whether each of ``llm.packed.KERNELS`` gives a
row the same result whatever the number of rows beside it (calls of 1 to 16 rows and of 64),
then times the kernels that can be chosen on the products of two of SmolLM2's blocks (their
own weights, plain and packed: 57 MB touched in turn, more than a CPU's caches hold, so each
call reads its weights from memory as a decode step does) for every call size T = 1 .. 16,
interleaved (one call of each kernel and size per round, the median of 3 rounds kept). The
rule (``llm.packed``'s docstring says why): where a kernel is row-invariant, the cheapest such
kernel (summed over T) serves every call size; where none is, each size takes its cheapest.
On the course's 2-core AMD EPYC it took 0.5 s of CPU time (one thread; 1.7 s of wall clock
with the machine's load at 7). The record is cached in a JSON file, one entry per machine key
(the CPU's name and a hash of its instruction-set flags, torch's version, the thread count, the
dtype), under ``$SPECDEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/specdec-course``, else
``~/.cache/specdec-course``; a later load on the same machine reads it (0.3 ms).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import torch

from ..devices import cpu_info, native_cpu_kernels
from . import packed

__all__ = ["CACHE_ENV", "cache_file", "calibrate", "current", "machine_key", "measure"]

CACHE_ENV = "SPECDEC_CACHE_DIR"
SIZES = tuple(range(1, 17))
TIMED_LAYERS = 2  # 2 blocks: 28 MB of float32, packed and plain: 57 MB alternately
REPEATS = 3
_CHECK_ROWS = 64  # the longest call checked for row invariance
_current: dict = {}


def _cpu() -> tuple[str, str]:
    """The CPU's name and a short hash of its flags (:func:`..devices.cpu_info`)."""
    name, flags = cpu_info()
    return name, hashlib.sha1(flags.encode()).hexdigest()[:8]


def machine_key(dtype: torch.dtype = torch.float32) -> str:
    """What the cached choice depends on: the CPU, torch's version, the threads, the dtype."""
    name, flags = _cpu()
    threads = torch.get_num_threads()
    return f"{name} (flags {flags}) | torch {torch.__version__} | {threads} threads | {dtype}"


def cache_file() -> Path:
    """The JSON file of measured choices (``$SPECDEC_CACHE_DIR`` overrides the directory)."""
    d = os.environ.get(CACHE_ENV)
    if not d:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(xdg, "specdec-course")
    return Path(d) / "kernels.json"


def _read_all() -> dict:
    try:
        data = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _valid(rec) -> bool:
    # A record made when the candidate kernels were others (a package update added one) is
    # measured again: its choice was made among fewer kernels than the package has now.
    return (
        isinstance(rec, dict)
        and isinstance(rec.get("table"), list)
        and len(rec["table"]) == len(SIZES)
        and all(k in packed.KERNELS for k in rec["table"])
        and sorted(rec.get("invariant", {})) == sorted(packed.KERNELS)
    )


def _write(key: str, rec: dict) -> None:
    """Add ``rec`` under ``key`` to the cache file (written whole, then renamed); a cache that
    cannot be written is skipped: the next load measures again."""
    path = cache_file()
    data = _read_all()
    data[key] = rec
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass


def _products(model, layers) -> list:
    """``(weight, packed weight)`` of every product of the blocks ``layers``."""
    out = []
    for i in layers:
        block = model.layers[i]
        for lin in (
            block.attention.wqkv,
            block.attention.wo,
            block.feed_forward.w13,
            block.feed_forward.w2,
        ):
            out.append((lin.weight, lin.packed))
    return out


def _inputs(products, rows: int) -> dict:
    g = torch.Generator().manual_seed(0)
    widths = sorted({w.shape[1] for w, _ in products})
    return {k: torch.randn(1, rows, k, generator=g) for k in widths}


def _row_invariant(kernel: str, products, xs, memo: dict) -> bool:
    """True when ``kernel`` gives every row the same bits whatever the call's size: for each
    product, calls of T = 1 .. 16 rows and of 64 rows agree on the rows they share, and a
    one-row call of rows 1, 5 and 15 gives those rows of the 16-row call. ``memo`` keeps the
    calls that ``packed``, ``packed2`` and ``packed4`` share (those not padded)."""

    def call(j, lo, hi):
        w, p = products[j]
        if hi - lo < packed.MIN_ROWS[kernel]:
            return packed.product(kernel, xs[w.shape[1]][:, lo:hi], w, p)
        k = "packed" if kernel.startswith("packed") else kernel
        if (k, j, lo, hi) not in memo:
            memo[k, j, lo, hi] = packed.product(k, xs[w.shape[1]][:, lo:hi], w, p)
        return memo[k, j, lo, hi]

    for j in range(len(products)):
        full = call(j, 0, 16)
        if not torch.equal(call(j, 0, _CHECK_ROWS)[:, :16], full):
            return False
        for T in SIZES[:-1]:
            if not torch.equal(call(j, 0, T), full[:, :T]):
                return False
        for r in (1, 5, 15):
            if not torch.equal(call(j, r, r + 1), full[:, r : r + 1]):
                return False
    return True


def _choose(seconds: dict, invariant: dict) -> tuple[list, str]:
    exact = [k for k in packed.KERNELS if invariant[k]]
    if exact:
        best = min(exact, key=lambda k: sum(seconds[k]))
        return [best] * len(SIZES), "one row-invariant kernel for every size"
    table = [min(packed.KERNELS, key=lambda k: seconds[k][i]) for i in range(len(SIZES))]
    return table, "no kernel is row-invariant here: the cheapest for each size"


def _time(model, bases, repeats: int, clock) -> dict:
    """``{kernel: [median seconds per T]}`` of the products of the last ``TIMED_LAYERS`` blocks
    for each of ``bases`` (``"aten"``, ``"packed"``), interleaved; the padded kernels cost
    the packed call of as many rows as they send."""
    n = len(model.layers)
    timed = _products(model, range(n - TIMED_LAYERS, n))
    xs = _inputs(timed, max(SIZES))
    runs = {k: [[] for _ in SIZES] for k in bases}
    for kernel in runs:  # a call of each kernel first, to warm the allocator and caches
        for w, p in timed:
            packed.product(kernel, xs[w.shape[1]], w, p)
    for _ in range(repeats):
        for i, T in enumerate(SIZES):
            for kernel, cells in runs.items():
                t0 = clock()
                for w, p in timed:
                    packed.product(kernel, xs[w.shape[1]][:, :T], w, p)
                cells[i].append(clock() - t0)
    seconds = {k: [statistics.median(c) for c in runs[k]] for k in runs}
    if "packed" in seconds:
        for k in packed.KERNELS[2:]:
            least = packed.MIN_ROWS[k]
            seconds[k] = [seconds["packed"][max(T, least) - 1] for T in SIZES]
    return seconds


@torch.inference_mode()
def measure(model, *, repeats: int = REPEATS, clock=None) -> dict:
    """Check and time the kernels on ``model``'s own weights (a float32 ``Llama`` after
    ``packed.pack``) and choose one per call size. Only the kernels that can be chosen are
    timed: the row-invariant ones where there are any, else all. Returns the record
    :func:`calibrate` caches: ``{"table": [kernel for T = 1 .. 16], "rule", "invariant":
    {kernel: bool}, "seconds": {kernel timed: [median seconds of the timed products per T]},
    "sizes", "layers", "repeats", "clock", "measured_s", "cpu_s"}``. ``clock``: the CPU time
    of this thread on one thread (time the scheduler gives to other work on a busy machine is
    left out), else the wall clock."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats}")
    start, cpu = time.perf_counter(), time.process_time()
    if clock is None:
        clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    with native_cpu_kernels():  # as the decoding loops run
        checked = _products(model, [0])
        head = model.head_product
        checked.append((head.weight, head.packed))
        xs = _inputs(checked, _CHECK_ROWS)
        memo: dict = {}
        invariant = {k: _row_invariant(k, checked, xs, memo) for k in packed.KERNELS}
        del memo, xs
        candidates = [k for k in packed.KERNELS if invariant[k]] or packed.KERNELS
        bases = sorted({"aten" if k == "aten" else "packed" for k in candidates})
        seconds = _time(model, bases, repeats, clock)
    table, rule = _choose(seconds, {k: invariant[k] and k in seconds for k in packed.KERNELS})
    return dict(
        table=table,
        rule=rule,
        invariant=invariant,
        seconds=seconds,
        sizes=list(SIZES),
        layers=TIMED_LAYERS,
        repeats=repeats,
        clock="thread CPU time" if clock is time.thread_time else "wall clock",
        measured_s=time.perf_counter() - start,
        cpu_s=time.process_time() - cpu,
    )


def calibrate(model, *, refresh: bool = False) -> dict:
    """Install the kernel choice for ``model`` (a float32 ``Llama`` after ``packed.pack``):
    read from the cache file where this machine key has one (unless ``refresh``), else
    measured (:func:`measure`) and cached. Returns the record, with ``"key"``, ``"cached"``
    (read from the file) and ``"seconds_here"`` (what this call took)."""
    t0 = time.perf_counter()
    key = machine_key(model.compute_dtype)
    rec = None if refresh else _read_all().get(key)
    cached = _valid(rec)
    if not cached:
        rec = measure(model)
        rec["date"] = time.strftime("%Y-%m-%d")
        _write(key, rec)
    packed.set_table(rec["table"], torch.get_num_threads())
    _current.clear()
    _current.update(rec, key=key, cached=cached, seconds_here=time.perf_counter() - t0)
    return dict(_current)


def current() -> dict:
    """The record of the choice in use (:func:`calibrate`'s return), ``{}`` before any."""
    return dict(_current)
