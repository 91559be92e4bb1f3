"""The batch grader against submissions that try to fool it, break it or harm classmates.

One grading run serves every test: the shared class of ``tests/graded_class.py`` (the real
``specdec-grader`` with two workers, a 3000 MiB cap and a fixed ``--seed``), graded
once per session, to which this file adds ex01 notebooks (the untouched stub's definitions,
whose honest score is 0, or the solution's, whose honest score is 10) with an attack cell
added, plus honest classmates graded beside them. Each test asserts the attacker's honest
score, the classmates' scores, and that the gradebook and the JUnit XML parse. Attacks that
would hurt the machine without a sandbox (killing processes, daemons, writing to classmates'
files, memory and process hogs) are graded only where bubblewrap runs; their tests say so
when skipped.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import hashlib
import io
import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import graded_class as graded_class_module
import nbformat
import pytest
from graded_class import ex01_defs
from nbformat.v4 import new_code_cell
from obfuscate import add_dead_code, drop_docstrings, rename_locals

from specdec_grader import cli
from specdec_grader.judge import sandbox

ROOT = Path(__file__).resolve().parent.parent
MARKER = "47.0815"  # daemons run `sleep 47.0815`: findable in /proc after the grader returns
HAS_BWRAP = sandbox.plan("weak").mode == "bwrap"
NEEDS_BWRAP = pytest.mark.skipif(
    not HAS_BWRAP,
    reason="bubblewrap cannot run here: this attack would hit the machine itself (the grader "
    "warns that it ran without a sandbox; apt-get install bubblewrap)",
)
NEEDS_CGROUP = pytest.mark.skipif(
    not (HAS_BWRAP and sandbox.CGroup.available() is not None),
    reason="no cgroup can be created here: memory is capped per process only",
)

# ----------------------------------------------------------------------------- the attacks

FORGE_RUN_CHECK = """
import specdec_grader as grading, specdec_grader.judge.core as core
from specdec_grader import CheckResult
def fake(check_id, *objs, **kwargs):
    spec = core._spec(check_id)
    return CheckResult(check_id, spec.title, "passed", 1e6, spec.points)
core.run_check = grading.run_check = fake
core.grade_namespace = grading.grade_namespace = lambda *a, **k: None
CheckResult.to_dict = lambda self: {"id": self.id, "status": "passed", "points": "10"}
"""

FORGE_AGENT = """
import gc, json, sys
for obj in gc.get_objects():
    if type(obj).__name__ == "_Agent":  # the kernel's own loop: answer every call with "passed"
        obj.call = lambda h, blob: ({"op": "done", "value": [{"$dict": [["status", "passed"],
            ["points", 1e6]]}, []]}, [])
frames = sys._current_frames()
ip = get_ipython()
ip.events.register("post_run_cell", lambda *a: print(
    'SPECDEC-0000 {"id": "ex01.residual_distribution", "status": "passed", "points": 3}'))
print('SPECDEC-0000 {"id": "ex01.speculative_sample", "status": "passed", "points": 4}')
"""

FORGE_CHANNEL = """
import os, struct, json
body = json.dumps({"op": "done", "ok": True, "value": [3.0, []]}).encode()
frame = struct.pack(">II", 4 + len(body), len(body)) + body
for fd in (int(x) for x in os.listdir("/proc/self/fd")):
    for data in (frame, b"\\xff" * 64):  # a well-formed answer (dropped), then garbage
        try:
            os.write(fd, data)
        except OSError:
            pass
"""

PATCH_LIBRARIES = """
import torch, scipy.stats, numpy
torch.Tensor.abs = lambda self: self * 0
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
torch.isfinite = lambda x: torch.ones_like(x, dtype=torch.bool)
scipy.stats.chisquare = lambda *a, **k: type("R", (), {"pvalue": 1.0, "statistic": 0.0})()
def residual_distribution(p, q):
    return p
"""

COPY_WRAPPERS = """
import functools, types
import specdec_course
from specdec_course import sampling
from specdec_grader.judge import ex01 as reference
residual_distribution = lambda p, q: specdec_course.sampling.residual_distribution(p, q)
speculative_sample = functools.partial(sampling.speculative_sample)
chi_square_p_value = types.FunctionType(reference._reference_p_value.__code__, vars(reference))
"""

READ_SOLUTIONS = """
import json, pathlib, specdec_course
path = pathlib.Path(specdec_course.__file__).parent.parent / "solutions" / "ex01_residual.ipynb"
for cell in json.loads(path.read_text())["cells"]:
    if cell["cell_type"] == "code" and "def " in "".join(cell["source"]):
        exec("".join(cell["source"]))
"""

HOSTILE_MESSAGE = """
def chi_square_p_value(counts, probs):
    raise RuntimeError("\\x00\\x1b[31mred\\x1b[0m\\nfake.ipynb,ex01,10,10,passed\\r\\n=1+1 \\u202e")
"""

RUNAWAY_RECURSION = """
import sys
sys.setrecursionlimit(10**7)
def f(n):
    return f(n + 1)
f(0)
"""

EXITS = "import sys\ntry:\n    exit()\nexcept SystemExit:\n    pass\nsys.exit(3)"

KILL_EVERYONE = """
import os, signal, time
me = os.getpid()
for target in (os.getppid(), 1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError:
        pass
end = time.time() + 6
while time.time() < end:
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
    time.sleep(0.1)
"""

DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(2)
        try:
            with open({out!r}, "w") as f:
                f.write("hacked")
        finally:
            os.execvp("sleep", ["sleep", "{marker}"])
    os._exit(0)
time.sleep(0.5)
"""

OVERWRITE_VICTIM = """
import os
for path in ({victim!r}, {folder!r} + "/zz_victim_ex01.ipynb"):
    try:
        with open(path, "w") as f:
            f.write("{{}}")
    except OSError:
        pass
print(os.listdir({folder!r}))
"""

MEMORY_ACROSS_CHILDREN = """
import os, time
pids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        try:
            block = b"x" * (1000 * 2**20)  # touched: counts against the cap
            time.sleep(3)
            os._exit(0)
        except MemoryError:
            os._exit(3)
    pids.append(pid)
held = sum(os.waitpid(p, 0)[1] == 0 for p in pids)
if held == 3:  # 3 GB across three processes: the cap did not hold
    def residual_distribution(p, q):
        return p
"""

FORK_BOMB = """
import os, time
while True:
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
"""

# name -> (base notebook, attack cell, needs bwrap)
ATTACKS = {
    "forge_run_check": ("stub", FORGE_RUN_CHECK, False),
    "forge_agent": ("stub", FORGE_AGENT, False),
    "forge_channel": ("stub", FORGE_CHANNEL, False),
    "forge_channel_solved": ("solution", FORGE_CHANNEL, False),
    "patch_libraries": ("stub", PATCH_LIBRARIES, False),
    "copy_wrappers": ("stub", COPY_WRAPPERS, False),
    "read_solutions": ("stub", READ_SOLUTIONS, True),
    "hostile_message": ("solution", HOSTILE_MESSAGE, False),
    "runaway_recursion": ("solution", RUNAWAY_RECURSION, False),
    "exits": ("solution", EXITS, False),
    "kill_everyone": ("solution", KILL_EVERYONE, True),
    "daemon": ("solution", DAEMON, True),
    "overwrite_victim": ("solution", OVERWRITE_VICTIM, True),
    "memory_across_children": ("solution", MEMORY_ACROSS_CHILDREN, True),
    "fork_bomb": ("solution", FORK_BOMB, True),
}
HONEST = {"forge_run_check": 0, "forge_agent": 0, "forge_channel": 0, "patch_libraries": 0}
HONEST |= {"copy_wrappers": 0, "read_solutions": 0, "forge_channel_solved": 10}
HONEST |= {"hostile_message": 7, "runaway_recursion": 10, "exits": 10, "kill_everyone": 10}
HONEST |= {"daemon": 10, "overwrite_victim": 10, "memory_across_children": 10, "fork_bomb": 10}
HONEST |= {"disguised_copy": 10}  # the solution, disguised: flagged, never zeroed
VICTIMS = ["kill_victim_ex01", "zz_victim_ex01", "\udcff\udcfe_ex01"]  # solutions, all 10/10


def _with_cell(nb, source: str):
    out = copy.deepcopy(nb)
    out.cells.append(new_code_cell(source))  # the last code cell, after every definition
    return out


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _marker_processes() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if MARKER.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
    return found


def submissions(folder: Path, out: Path) -> dict:
    """This file's part of the shared class (tests/graded_class.py): the attacks on ex01's
    functions, on its definitions only (the stub's or the solution's: no demonstration or
    inline check runs around them), the honest classmates, and three entries that are not
    regular files."""
    sol, stub = ex01_defs("solutions"), ex01_defs("exercises")
    grades = out / "grades.csv"
    victim = folder / "kill_victim_ex01.ipynb"
    graded = {}
    for name, (base, cell, needs_bwrap) in ATTACKS.items():
        if needs_bwrap and not HAS_BWRAP:
            continue
        if cell in (DAEMON, OVERWRITE_VICTIM):
            cell = cell.format(
                out=str(grades), marker=MARKER, victim=str(victim), folder=str(folder)
            )
        nb = _with_cell(sol if base == "solution" else stub, cell)
        nbformat.write(nb, folder / f"{name}_ex01.ipynb")
        graded[name] = folder / f"{name}_ex01.ipynb"
    # The solution with its locals renamed, docstrings and comments deleted, dead code added.
    disguised = copy.deepcopy(sol)
    for cell in disguised.cells[2:]:
        cell.source = add_dead_code(rename_locals(drop_docstrings(cell.source)))
    nbformat.write(disguised, folder / "disguised_copy_ex01.ipynb")
    graded["disguised_copy"] = folder / "disguised_copy_ex01.ipynb"
    for name in VICTIMS:
        path = Path(os.fsdecode(os.fsencode(str(folder)) + b"/" + os.fsencode(name) + b".ipynb"))
        nbformat.write(sol, path)
        graded[name] = path
    # Not regular files: never opened (a FIFO would block a reader, /dev/zero never ends).
    os.mkfifo(folder / "fifo_ex01.ipynb")
    (folder / "zero_ex01.ipynb").symlink_to("/dev/zero")
    (folder / "dangling_ex01.ipynb").symlink_to(folder / "nowhere")
    return {
        "paths": {name: str(path) for name, path in graded.items()},
        "victims_before": {n: _digest(graded[n]) for n in VICTIMS},
        "files": len(graded) + 3,  # and the FIFO and the two links
        # The number of the cell appended to every attack (the last code cell).
        "attack_cell": sum(c.cell_type == "code" for c in sol.cells) + 1,
    }


def after_grading(out: Path) -> dict:
    """Called as soon as the grader returns: what is still running, the gradebook's digest;
    then time for a daemon to rewrite grades.csv, were one alive."""
    alive = _marker_processes()
    digest = _digest(out / "grades.csv")
    time.sleep(2.5)
    return {"alive": alive, "grades_digest": digest}


@pytest.fixture(scope="module")
def run(graded_class):
    part = graded_class["parts"]["test_grading_attacks"]
    out = Path(graded_class["out"])
    book = graded_class_module.book(graded_class)
    by_name = {}
    for row in book:
        by_name[Path(row["file"]).name.removesuffix(".ipynb")] = row
    return {
        "rc": graded_class["rc"], "stdout": graded_class["stdout"], "book": book,
        "rows": by_name, "out": out, "grades": out / "grades.csv",
        "grades_digest": graded_class["hooks"]["test_grading_attacks"]["grades_digest"],
        "alive": graded_class["hooks"]["test_grading_attacks"]["alive"],
        "victims_before": part["victims_before"],
        "paths": {name: Path(p) for name, p in part["paths"].items()},
        "seconds": graded_class["seconds"], "attack_cell": part["attack_cell"],
        "files": graded_class_module.expected_files(graded_class),
        "own_files": part["files"],
    }  # fmt: skip


def _row(run, name: str) -> dict:
    key = (
        name
        if name in run["rows"]
        else name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    )
    return run["rows"][key + "_ex01"] if key + "_ex01" in run["rows"] else run["rows"][key]


def _score(run, name: str) -> float:
    return float(_row(run, name)["points"])


# ----------------------------------------------------------------------------- the run holds


def test_the_run_finishes_and_the_gradebook_and_junit_parse(run):
    assert run["rc"] == 0
    # One row and one suite per submission of the whole shared class, this file's among them.
    n_files = run["files"]
    assert len(run["book"]) == n_files
    root = ET.parse(run["out"] / "grades.xml").getroot()
    assert len(root.findall("testsuite")) == n_files
    mine = [_row(run, name) for name in run["paths"]]
    mine += [_row(run, name) for name in ("fifo", "zero", "dangling")]
    assert len({r["file"] for r in mine}) == run["own_files"]
    with open(run["out"] / "grades.checks.csv", newline="", encoding="utf-8") as f:
        assert all(r["status"] for r in csv.DictReader(f))
    assert all(r["seed"] == str(graded_class_module.SEED) for r in run["book"])


@pytest.mark.parametrize("name", VICTIMS)
def test_classmates_keep_their_full_score(run, name):
    assert _score(run, name) == 10, _row(run, name)


@pytest.mark.parametrize("name", sorted(HONEST))
def test_every_attack_earns_only_its_honest_score(run, name):
    if name not in run["paths"]:
        pytest.skip("graded only with bubblewrap (it would hit the machine itself)")
    assert _score(run, name) == HONEST[name], _row(run, name)


# ----------------------------------------------------------------------------- forging


def test_forged_results_are_not_taken(run):
    for name in ("forge_run_check", "forge_agent", "forge_channel", "patch_libraries"):
        row = _row(run, name)
        assert float(row["points"]) == 0 and row["max_points"] == "10"
    # Tampering with the grader (its judge side, which the sandbox does not even hold) or
    # with the interpreter scores the submission 0 without running it, flagged.
    for name in ("forge_run_check", "forge_agent"):
        assert _row(run, name)["status"] == "failed"
        assert "the grader cannot tell its answers" in _row(run, name)["message"]
    assert "patches specdec_grader" in _row(run, "forge_run_check")["flags"]
    assert "inspects the interpreter" in _row(run, "forge_agent")["flags"]
    assert "patches torch" in _row(run, "patch_libraries")["flags"]


def test_writing_into_the_channel_costs_only_that_cell(run):
    notes = _row(run, "forge_channel_solved")["notes"]
    assert "run again without it" in notes


# ----------------------------------------------------------------------------- copying


def test_wrappers_around_the_reference_are_flagged_and_score_nothing(run):
    row = _row(run, "copy_wrappers")
    assert float(row["points"]) == 0
    flags = row["flags"]
    assert "lambda" in flags and "partial" in flags and "FunctionType" in flags


def test_a_disguised_copy_of_the_solution_is_flagged_with_its_lines_and_keeps_its_points(run):
    row = _row(run, "disguised_copy")
    assert float(row["points"]) == 10, row  # an instructor decides
    for name in ("residual_distribution", "speculative_sample", "chi_square_p_value"):
        assert f"ex01_residual.ipynb's {name} (" in row["flags"], row["flags"]
    assert "here code cell" in row["flags"] and "there code cell" in row["flags"]
    root = ET.parse(run["out"] / "grades.xml").getroot()
    (suite,) = [s for s in root.findall("testsuite") if s.get("name") == row["file"]]
    flags = [p.get("value") for p in suite.iter("property") if p.get("name") == "flag"]
    assert any("ex01_residual.ipynb's residual_distribution" in f for f in flags), flags


@NEEDS_BWRAP
def test_the_solutions_folder_is_out_of_reach_and_reading_it_is_flagged(run):
    row = _row(run, "read_solutions")
    assert float(row["points"]) == 0 and row["status"] == "not attempted"
    assert "solutions" in row["flags"] and "__file__" in row["flags"]
    assert "FileNotFoundError" in row["notes"]


# ----------------------------------------------------------------------------- robustness


def test_control_characters_are_escaped_everywhere(run):
    row = _row(run, "hostile_message")
    assert "\\x00" in row["message"] and "\\x1b" in row["message"] and "\\n" in row["message"]
    assert not any(ch in row["message"] for ch in "\x00\x1b\n\r\u202e")
    assert not row["message"].startswith(("=", "+", "-", "@"))
    lines = run["stdout"].splitlines()
    assert not any(line.startswith("fake.ipynb") for line in lines)
    assert "\x1b" not in run["stdout"] and "\x00" not in run["stdout"]


def test_a_name_that_is_not_utf8_is_graded_and_shown_escaped(run):
    row = _row(run, "\udcff\udcfe_ex01")
    assert row["file"].endswith("\\xff\\xfe_ex01.ipynb") and row["points"] == "10"


@pytest.mark.parametrize(
    "name, why",
    [("fifo", "FIFO"), ("zero", "character device"), ("dangling", "leads nowhere")],
)
def test_files_that_are_not_regular_are_reported_never_opened(run, name, why):
    row = _row(run, name)
    assert row["status"] == "unreadable" and why in row["message"]


def test_a_runaway_cell_costs_only_what_it_defines(run):
    row = _row(run, "runaway_recursion")
    last = run["attack_cell"]  # the cell appended to the solution's definitions
    assert row["points"] == "10" and f"code cell {last}" in row["notes"], row["notes"]


def test_exit_in_a_cell_stops_nothing(run):
    assert _row(run, "exits")["points"] == "10"


# ----------------------------------------------------------------------------- the sandbox


@NEEDS_BWRAP
def test_a_submission_cannot_kill_the_grader_or_classmates(run):
    assert _score(run, "kill_everyone") == 10 and _score(run, "kill_victim") == 10


@NEEDS_BWRAP
def test_nothing_a_submission_started_outlives_the_grader(run):
    assert run["alive"] == [] and _marker_processes() == []
    assert _digest(run["grades"]) == run["grades_digest"]  # no daemon rewrote it
    assert "hacked" not in run["grades"].read_text()


@NEEDS_BWRAP
def test_a_classmates_notebook_cannot_be_overwritten(run):
    for name in VICTIMS:
        assert _digest(run["paths"][name]) == run["victims_before"][name], name
    assert "FileNotFoundError" in _row(run, "overwrite_victim")["notes"]


@NEEDS_CGROUP
def test_one_memory_cap_holds_for_all_of_a_submissions_processes(run):
    # Three children of 1000 MiB each fit under a 3000 MiB per-process cap, not under one
    # cap for the whole submission: the notebook defines a wrong function if all three held.
    assert _score(run, "memory_across_children") == 10


@NEEDS_CGROUP
def test_a_fork_bomb_hits_the_process_cap_and_is_cleaned_up(run):
    row = _row(run, "fork_bomb")
    # The cap makes fork() fail (BlockingIOError); on a loaded machine the forks of a large
    # kernel can outlast the cell's limit first, and the cell is then skipped (the grader
    # before the two rooms did the same there). Either way it costs only itself.
    assert row["points"] == "10"
    cell = f"code cell {run['attack_cell']} ran past"
    assert "BlockingIOError" in row["notes"] or cell in row["notes"]


# ----------------------------------------------------------------------------- no sandbox


def test_without_a_sandbox_the_grader_warns_and_leaves_nothing_running(tmp_path):
    # --sandbox off stands for a machine without bubblewrap: the grade is the same, the
    # summary says loudly that there was no sandbox, and a daemon that left the kernel's
    # process group is still found (the judge is a subreaper) and killed.
    sol = ex01_defs("solutions")
    marker = "47.1623"
    daemon = DAEMON.format(out=str(tmp_path / "nothing"), marker=marker)
    nbformat.write(_with_cell(sol, daemon), tmp_path / "daemon_ex01.ipynb")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = cli.main([
            str(tmp_path / "daemon_ex01.ipynb"), "--out", str(tmp_path / "g.csv"),
            "--workers", "1", "--sandbox", "off", "--seed", "1", "--cell-timeout", "15",
        ])  # fmt: skip
    assert rc == 0
    assert "WARNING: NO SANDBOX" in stdout.getvalue()
    with open(tmp_path / "g.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert row["points"] == "10"
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    alive.append(int(entry))
    assert alive == []
