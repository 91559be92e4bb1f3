"""The grading cell the batch grader runs in each submission's kernel, after its own cells.

It looks the needed functions up by name in the kernel's globals and prints one line per
check: a nonce (so nothing the student prints can pose as a result) and the JSON result.
Lines are printed as each check finishes, so a kernel that dies mid-way still reports the
checks before it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from .core import CheckResult, checks_for, grade_namespace


def report(
    exercise: str, namespace: Mapping[str, Any], nonce: str, time_limit: float, note: str = ""
) -> None:
    for spec in checks_for(exercise):
        # One check at a time through grade_namespace's "missing" logic, on a view that
        # holds only the names this check needs.
        view = {n: namespace[n] for n in spec.needs if n in namespace}
        try:
            res = next(
                r
                for r in grade_namespace(
                    exercise,
                    view,
                    time_limit=time_limit,
                    quiet=True,
                    defined_note=note,
                    only=spec.id,
                ).results
            )
        except Exception as e:  # noqa: BLE001 - report, and go on with the next check
            res = CheckResult(
                spec.id,
                spec.title,
                "error",
                0.0,
                spec.points,
                message=f"grading failed: {type(e).__name__}: {e}",
            )
        sys.stdout.write(f"{nonce} {json.dumps(res.to_dict())}\n")
        sys.stdout.flush()
