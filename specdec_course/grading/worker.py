"""The batch grader's worker process: a judge that grades one submission after another.

The parent (:mod:`.runner`) starts :func:`worker_main` once per pool slot and sends it jobs
(``("job", Job as a dict)``) on a pipe; it answers each with ``("result", SubmissionResult as
a dict)``, and ends on ``("stop", None)`` or when the pipe closes. A worker imports torch and
the exercise modules once, not once per submission. It never runs student code itself: that
runs in the kernels it starts (:mod:`.judge`), in a sandbox, as its children.
"""

from __future__ import annotations

import os
from typing import Any

from .jobs import Job, SubmissionResult
from .sandbox import Plan, set_subreaper

__all__ = ["worker_main"]


def worker_main(conn, plan_dict: dict[str, Any]) -> None:
    """The worker's loop: grade each job sent on ``conn`` with kernels under the plan."""
    try:
        os.setsid()  # our own process group: the parent can kill us and what we started
    except OSError:
        pass
    # Orphans of an unsandboxed kernel (a daemon that detached itself) come back to us, so
    # that cleanup finds them.
    set_subreaper()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    import torch

    torch.set_num_threads(1)  # the judge's share of the cores; the kernels have theirs
    from .judge import grade_submission

    plan = Plan.from_dict(plan_dict)
    seq = 0
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            return
        if kind != "job":
            return
        job = Job.from_dict(payload)
        seq += 1
        try:
            res = grade_submission(job, plan, seq)
        except BaseException as e:  # noqa: BLE001 - always answer the parent
            if isinstance(e, KeyboardInterrupt):
                raise
            res = SubmissionResult(
                job.file,
                job.exercise,
                job.failed_checks("crashed", f"the grader failed: {type(e).__name__}: {e}"),
                [f"the grader failed on this submission: {type(e).__name__}: {e}"],
                0.0,
                seed=job.seed,
            )
        try:
            conn.send(("result", res.to_dict()))
        except (OSError, ValueError):
            return
