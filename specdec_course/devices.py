"""Where tensors live: picking a device, one clear error when two disagree, honest clocks.

Every function of the package follows the device of the tensors or models it is given;
``device`` is for the places where a caller cannot pass tensors (loading a checkpoint,
counting an n-gram, a benchmark). Random numbers are drawn on their generator's device and
then moved (``sampling.exp_noise``), so a seeded CPU generator gives the same numbers
whether the models run on the CPU or on a GPU.

On a GPU, work is queued and runs later: a wall clock read right after a call measures the
queueing, not the work. ``clock(device)`` waits for the queue first.

On a CPU at batch 1 the models' ops are tiny, and oneDNN (which PyTorch's CPU build routes
float32 matrix products and GELU through) spends more setting each one up than computing
it: ``native_cpu_kernels`` turns it off around the decoding loops, for plain and
speculative decoding alike (a one-token step of the 4-layer target costs about a fifth less).

The NumPy steps (``executor="numpy"``, the EAGLE-family drafts' CPU paths) call NumPy's
BLAS, which keeps its own thread pool, one thread per core by default, whatever
``torch.set_num_threads`` says. On a busy machine its second thread waits for a core: the
EAGLE draft's matrix products cost 2-3x more (c 0.64-1.09 against 0.23-0.47 with two busy
loops beside it; `bench speedup --method eagle --quick --temperature 0`). ``set_threads``
sets both pools.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from ._validate import check_same_device  # noqa: F401  (the check lives with the others)

__all__ = [
    "cpu_info",
    "cpu_name",
    "machine_label",
    "device",
    "set_threads",
    "check_same_device",
    "model_device",
    "synchronize",
    "clock",
    "native_cpu_kernels",
    "with_native_cpu_kernels",
]

DeviceLike = torch.device | str | None


def device(name: DeviceLike = None) -> torch.device:
    """The device to run on: ``"cuda"`` when one is available and ``name`` is None or
    ``"auto"``, else ``"cpu"``; an explicit ``name`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``,
    a ``torch.device``) is checked and returned.

    Raises ValueError for a name torch does not know, or for ``"cuda"`` on a machine
    without a CUDA GPU (say ``"cpu"``, or leave it out to pick what is there).
    """
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"device must be 'cpu', 'cuda', 'cuda:N' or None (pick one); got {name!r}"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {name!r} asks for a CUDA GPU, but this machine has none that torch "
                "can use; use device='cpu', or leave device out to pick what is there"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)"
            )
    return dev


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (the package's models keep all on one)."""
    return next(model.parameters()).device


def synchronize(dev: DeviceLike) -> None:
    """Wait until the work queued on ``dev`` has run (nothing to wait for on a CPU)."""
    if dev is not None and torch.device(dev).type == "cuda":
        torch.cuda.synchronize(dev)


def clock(dev: DeviceLike) -> Callable[[], float]:
    """A wall clock in seconds for timing work on ``dev``: ``time.perf_counter`` on a CPU;
    on a GPU the same after waiting for the queued work, so an interval holds the work."""
    if dev is None or torch.device(dev).type != "cuda":
        return time.perf_counter

    def synced() -> float:
        torch.cuda.synchronize(dev)
        return time.perf_counter()

    return synced


@contextmanager
def native_cpu_kernels():
    """Run the block with oneDNN off: ATen's own CPU kernels for matrix products and GELU.

    At batch 1 a matrix product of the models here is a few thousand multiply-adds; oneDNN's
    per-call set-up costs more than that. On the course's 2-core CPU, alternating the two
    settings call by call, the target's lean step cost 493 -> 388 us for one token and
    762 -> 627 us for eight with oneDNN off. The flag is process-wide, so the previous
    setting is restored on exit; nested uses are fine. GPUs are unaffected.
    """
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = was


def with_native_cpu_kernels(fn):
    """``fn`` run inside :func:`native_cpu_kernels` (a decorator for the decoding loops)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with native_cpu_kernels():
            return fn(*args, **kwargs)

    return wrapper


def set_threads(n: int) -> None:
    """Run torch's CPU ops and NumPy's BLAS on ``n`` threads each (``threadpoolctl``): the
    decoding loops' NumPy steps then use the threads torch uses, and no more."""
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(n)
    threadpool_limits(limits=n, user_api="blas")


@functools.cache
def cpu_info() -> tuple[str, str]:
    """This CPU's name and its feature flags as one string, read once from ``/proc/cpuinfo``
    (x86's "model name" and "flags"; Arm's "Processor" or "Hardware" and "Features"). Where
    it cannot be read: the name ``platform`` knows, and no flags."""
    name, flags = "", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Processor", "Hardware") and not name:
                    name = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = value.strip()
    except OSError:
        pass
    import platform

    return name or platform.processor() or platform.machine() or "unknown CPU", flags


def cpu_name() -> str:
    """This CPU's model name (:func:`cpu_info`)."""
    return cpu_info()[0]


def machine_label(device: torch.device | str | None = None) -> str:
    """What a live timing ran on, to print beside it: the CPU model and torch's threads, or
    the GPU, and the clock. A timing shown is this machine's, not a claim for others."""
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cuda":
        return f"{torch.cuda.get_device_name(dev)}, wall clock after a device sync"
    return f"{cpu_name()}, {torch.get_num_threads()} thread(s), wall clock"
