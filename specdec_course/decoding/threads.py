"""How many CPU threads a timed decoding run should use: one, unless told otherwise.

At batch 1 the models' matrix products are small; a second thread helps a little on an idle
machine and costs a lot on a busy one, where it waits for a core another process holds
(on a 2-core laptop at load ~10, a 2-token ``generate`` took 606 ms at PyTorch's default of
2 threads against 19 ms at one). So every timing path runs on one thread unless it is told
a number, or told ``"idle"``: the cores left idle by the load average at start
(``os.getloadavg``, rounded down, at least 1). ``fit_threads`` sets torch's and NumPy's
pools (``devices.set_threads``) and returns the number with a line saying which it is, for
the run to print.
"""

from __future__ import annotations

import os

from .._validate import check_int
from ..devices import set_threads

__all__ = ["threads_that_fit", "fit_threads"]


def threads_that_fit(threads: int | str | None = None) -> tuple[int, str]:
    """``(n, why)``: ``None`` -> 1; ``"idle"`` -> the idle cores now (CPUs minus the
    one-minute load average, rounded down, at least 1); an int >= 1 -> itself. Raises
    ValueError for anything else."""
    if threads is None:
        return 1, "1 thread (the default for timing; pass a number or 'idle')"
    if threads == "idle":
        cpus = os.cpu_count() or 1
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        n = max(1, min(cpus, int(cpus - load)))
        return n, f"{n} thread(s): the idle cores at start ({cpus} CPUs, load {load:.2f})"
    if isinstance(threads, str):
        raise ValueError(f"threads must be an int >= 1, 'idle' or None; got {threads!r}")
    n = check_int(threads, "threads")
    return n, f"{n} thread(s), as asked"


def fit_threads(threads: int | str | None = None) -> tuple[int, str]:
    """``threads_that_fit(threads)``, applied to torch's and NumPy's thread pools."""
    n, why = threads_that_fit(threads)
    set_threads(n)
    return n, why
