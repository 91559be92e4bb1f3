"""A sandbox that shows nothing of the host (issue 54): one kernel-less look from inside.

The sandbox shows the interpreter, the course's data and the student edition at neutral
paths (/opt/python, /opt/venv, /course): the grader's checkout, home folder and Python
installation are not there by their host paths, and /proc/self/mountinfo names none of them,
neither as a mount point nor as the folder a bind comes from (the interpreter is bound from
hard-linked copies under neutral names, the edition and the data from the grader's own
temporary copies).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_grader.judge import mounts, sandbox

pytestmark = pytest.mark.skipif(
    sandbox.plan("weak").mode != "bwrap",
    reason="bubblewrap cannot run here (apt-get install bubblewrap)",
)

ROOT = Path(__file__).resolve().parent.parent

LOOK = """
import json, os, sys, specdec_course
from specdec_course.paths import data_dir
table = [line.split() for line in open("/proc/self/mountinfo")]
print(json.dumps({
    "sources": [f[3] for f in table], "points": [f[4] for f in table],
    "table": open("/proc/self/mountinfo").read(),
    "package": specdec_course.__file__, "data": str(data_dir()), "exe": sys.executable,
    "exists": {p: os.path.exists(p) for p in sys.argv[1:]},
}))
"""


def test_the_sandbox_shows_no_host_path():
    import json

    plan = sandbox.plan("weak")
    host = [str(ROOT), str(Path.home()), os.path.realpath(sys.base_prefix), sys.prefix]
    host = sorted({p for p in host if not p.startswith("/usr")})
    argv = [*plan.bwrap, *mounts.kernel_command(LOOK)]
    done = subprocess.run([*argv, *host], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["exists"] == {p: False for p in host}
    assert seen["package"] == "/course/specdec_course/__init__.py"
    assert seen["data"] == "/course/data" and seen["exe"].startswith(("/opt/python/", "/usr/"))
    for point in seen["points"]:  # the mount points: neutral paths, the system's, scratch
        assert not any(point == p or point.startswith(p + "/") for p in host), point
    # The mount table's root column (the folder each bind comes from, on its file system)
    # names no host folder either: the interpreter is bound from hard-linked copies under
    # neutral names, the edition and the data from the grader's temporary copies.
    for source, point in zip(seen["sources"], seen["points"]):
        assert not any(source == p or source.startswith(p + "/") for p in host), (source, point)
        if point.startswith("/course"):
            assert not source.startswith(str(ROOT)), (source, point)
    assert not [p for p in host if p in seen["table"]], seen["table"]
