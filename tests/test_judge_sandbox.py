"""The attacks of issue 27 that need a kernel, through the real ``specdec-grader``
(bubblewrap, a cgroup where one can be made), in one run (the shared class of
``tests/graded_class.py``, graded once per session): each earns only what its honest part
earns, is flagged where it copies or tampers, and harms no classmate.

- the references are not in the sandbox: importing one, by the public path or the judge's,
  fails there (and is flagged); the judge side's folder is empty and read-only;
- a probe replaced in the kernel (a forged report of a stub head, by code the scan cannot
  follow) gets nothing: the judge loads its own weights and compares with its own head;
- a head that zeroes its input is judged on the judge's own input;
- four cells that kill the kernel after correct functions cost nothing;
- ``target.new_cache(65536)`` costs its own check only, and the judge survives it;
- a symbolic link to ``solutions/`` is refused; a solved ex08 named ``*_ex01`` is graded as
  ex01 and flagged;
- code built at run time that finds the kernel's agent (through ``gc``) and patches its call
  path, so that the stubs' graded calls are answered by the package's own implementation
  (ex01's residual and step in ``sampling``, ex05's race in the public Triton kernels), gets
  only what the notebook itself wrote: those functions are not in the sandbox (the modules
  it mounts hold a copy that raises ``WithheldError``), and the call is flagged; honest ex01
  and ex05 beside it keep full points;
- ex05's launcher replaced in the kernel (a PyTorch race for the stub, zeros beside a solved
  kernel) changes nothing: the judge launches the kernel it took from the source in a kernel
  where no student cell ran; a "kernel" whose body calls torch is refused;
- wrappers of the package's own versions of ex01, ex07, ex08 and ex10 (several lines, a
  helper, a method's class, ``getattr`` on a computed name) are found by the scan and score
  0, flagged; the same code run where the scan cannot see it reaches a withheld function
  (the methods of ex08's schedule and controller, ex07's walks, ex06's loss) and is
  flagged;
- without a cgroup (``--sandbox weak``), a root grader's kernel runs under a uid of its own,
  so that its process limit binds: 600 forks after correct functions are refused past the
  limit, the functions still earn their points and the next classmate is graded as usual.
"""

from __future__ import annotations

import base64
import copy
import os
from pathlib import Path

import graded_class as graded_class_module
import nbformat
import pytest
from graded_class import defs_only, ex01_defs
from nbformat.v4 import new_code_cell
from test_judge_attacks import SCAN_ATTACKS

from specdec_grader.judge import sandbox

ROOT = Path(__file__).resolve().parent.parent
HAS_BWRAP = sandbox.plan("weak").mode == "bwrap"

pytestmark = pytest.mark.skipif(
    not HAS_BWRAP, reason="bubblewrap cannot run here (apt-get install bubblewrap)"
)

PROBE_JUDGE_SIDE = """
import os, specdec_course
package = os.path.dirname(specdec_course.__file__)
judge = os.path.join(package, "grading", "judge")
assert not os.path.exists(judge), os.listdir(judge)  # the student edition has no judge side
try:
    os.makedirs(judge)
    raise AssertionError("made a judge folder in the package")
except OSError:
    pass
"""

IMPORT_REFERENCE = """
def next_k(*args, **kwargs):
    from specdec_grader.judge.ex08 import reference_next_k as _nk
    return _nk(*args, **kwargs)
def alpha_estimate(*args, **kwargs):
    from specdec_grader.ex08 import reference_alpha_estimate as _a
    return _a(*args, **kwargs)
"""

# Replaces the head probe in the kernel with one that reports a correct-looking head built
# by the untouched stub; written so that the source scan cannot follow it.
_FORGE = """
import sys, torch
probes = sys.modules["specdec_grader.student_side.probes"]
def fake(cls, w, n_layers, h, prev, weights):
    C, V = w.shape[1], w.shape[0]
    return {"module": True, "type": "MedusaHead", "layers": ("ModuleList", "Embedding", "Linear"),
            "shapes": (tuple((((C, C), True),) * n_layers), (V, C), ((V, C), True)),
            "distinct": True, "blocks_distinct": True, "fresh": h @ w.T, "shared": False,
            "random": (h @ w.T) * 0}
for name in list(probes.PROBES):
    if name != "launch_race":
        probes.PROBES[name] = fake
"""
FORGE_PROBE = (
    "import base64, builtins\n"
    "run = builtins.__dict__[''.join(['e', 'x', 'e', 'c'])]\n"
    f"run(base64.b64decode({base64.b64encode(_FORGE.encode()).decode()!r}).decode())\n"
)

ZERO_INPUT = """
_Base = MedusaHead
class MedusaHead(_Base):
    def forward(self, h, prev):
        h.zero_()  # the judge's input, were it the judge's: its expected value would be 0
        return self.lm_head(h)
"""

# Finds the kernel's agent through gc and patches its call path, so that a graded call of a
# stub is answered by the package's own function; describe() still shows the stub. Run by
# code the scan cannot follow (the exec built from strings, the payload in base64).
_PATCH_EX01 = """
import gc, importlib
S = importlib.import_module("specdec_course." + "sampling")
A = type(next(o for o in gc.get_objects() if type(o).__name__ == "_Ag" + "ent"))
_call = A.call
def call(self, h, blob):
    name = (h.get("target") or {}).get("name")
    ns = self.shell.user_ns
    if name not in ("residual_distribution", "speculative_sample"):
        return _call(self, h, blob)
    mine, real = ns[name], getattr(S, name)
    ns[name] = real if name == "residual_distribution" else (
        lambda p, q, generator=None: real(p, q, generator=generator))
    try:
        return _call(self, h, blob)
    finally:
        ns[name] = mine
A.call = call
"""
# The same route for ex05: the launch of the stub kernel is answered by the public Triton
# kernels, on drafts that reject at each row's position (as the judge's reference does).
_PATCH_EX05 = """
import gc, sys, importlib, torch
kernels = importlib.import_module("specdec_course." + "kernels")
A = type(next(o for o in gc.get_objects() if type(o).__name__ == "_Ag" + "ent"))
def fake(kernel, pos, p, q, e, block_v):
    B, K, V = q.shape
    rows, j = torch.arange(B), torch.arange(K)
    drafts = torch.where(j < pos[:, None], p[:, :K].argmax(-1), -1)
    drafts[rows, pos] = (q - p[:, :K]).argmax(-1)[rows, pos]
    u = torch.where(j < pos[:, None], 1e-9, 1.0).double()
    out = kernels.rejection_sample_triton(drafts, q, p, uniforms=u, exp_noise=e)
    return out.token_ids[rows, pos]
sys.modules[A.__module__].PROBES["launch" + "_race"] = fake
"""


def _hidden(code: str) -> str:
    # (``builtins.__dict__[...]`` would be found as tampering: this route only flags.)
    return (
        "import base64\n"
        "b = __import__('bu' + 'iltins')\n"
        "run = getattr(b, 'ex' + 'ec')\n"
        f"run(base64.b64decode({base64.b64encode(code.encode()).decode()!r}).decode())\n"
    )


# ex05's launcher replaced in the student's kernel: a race in PyTorch answers every launch
# (the stub kernel untouched), or zeros do (a solved kernel beside it). The judge launches
# the kernel taken from the source in a kernel of its own, so neither reaches the verdict.
_PROBE_EX05 = """
import sys, torch
probes = sys.modules["specdec_grader.student_side." + "pro" + "bes"]
def fake(kernel, pos, p, q, e, block_v):
    r = torch.arange(pos.shape[0])
    return ((p[r, pos] - q[r, pos]).clamp_min(0) / e).argmax(-1).to(torch.int64)
probes.PROBES["launch" + "_race"] = fake
"""
_SABOTAGE_EX05 = _PROBE_EX05.replace(
    "return ((p[r, pos] - q[r, pos]).clamp_min(0) / e).argmax(-1).to(torch.int64)",
    "return torch.zeros(pos.shape[0], dtype=torch.int64)",
)
# A torch race in the kernel's body: refused before anything runs.
_TORCH_KERNEL = """
@triton.jit
def race_kernel(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V: tl.constexpr):
    torch.ops.aten.argmax(p_ptr)
"""


def _solution_cell(notebook: str, name: str) -> str:
    nb = nbformat.read(ROOT / "solutions" / notebook, as_version=4)
    return next(c.source for c in nb.cells if c.source.startswith(f"def {name}("))


CHI_SOLVED = _solution_cell("ex01_residual.ipynb", "chi_square_p_value")
CHI_POINTS = 3  # ex01.chi_square_p_value (asserted against the registry below)

KILLER = "import os\nos._exit(1)"

BIG_CACHE = """
_honest_step = speculative_step
def speculative_step(target, draft, *args, **kwargs):
    target.new_cache(65536)  # 3.4 GB in the judge, were it allowed
    return _honest_step(target, draft, *args, **kwargs)
"""

# name -> (notebook, extra cells, expected points, expected flag or "")
ATTACKS = {
    "classmate_ex01": ("solutions/ex01_residual.ipynb", [], 10, ""),
    "look_for_the_judge_ex01": (
        "solutions/ex01_residual.ipynb",
        [PROBE_JUDGE_SIDE],
        10,
        "__file__",
    ),
    "import_reference_ex08": ("exercises/ex08_dynamic_k.ipynb", [IMPORT_REFERENCE], 0, "grader"),
    "forged_probe_ex06": ("exercises/ex06_medusa.ipynb", [FORGE_PROBE], 0, ""),
    "zero_input_ex06": ("solutions/ex06_medusa.ipynb", [ZERO_INPUT], 7, ""),
    "killers_ex01": ("solutions/ex01_residual.ipynb", [KILLER] * 4, 10, ""),
    "big_cache_ex04": ("solutions/ex04_rollback.ipynb", [BIG_CACHE], 6, ""),
    "wrong_name_ex01": ("solutions/ex08_dynamic_k.ipynb", [], 0, "metadata says ex08"),
    "patched_agent_ex01": (
        "exercises/ex01_residual.ipynb",
        [CHI_SOLVED, _hidden(_PATCH_EX01)],
        CHI_POINTS,
        "sandbox withholds",
    ),
    "patched_agent_ex05": (
        "exercises/ex05_triton_race.ipynb",
        [_hidden(_PATCH_EX05)],
        0,
        "code built at run time",
    ),
    "classmate_ex05": ("solutions/ex05_triton_race.ipynb", [], 10, ""),
    "probe_replaced_ex05": (
        "exercises/ex05_triton_race.ipynb",
        [_hidden(_PROBE_EX05)],
        0,
        "code built at run time",
    ),
    "probe_sabotaged_ex05": (
        "solutions/ex05_triton_race.ipynb",
        [_hidden(_SABOTAGE_EX05)],
        10,
        "code built at run time",
    ),
    "torch_kernel_ex05": ("exercises/ex05_triton_race.ipynb", [_TORCH_KERNEL], 0, ""),
    # Wrappers of the package's own versions (tests/test_judge_attacks.py: SCAN_ATTACKS),
    # found by the scan, then the same code run where the scan cannot see it: the sandbox
    # holds none of those versions, and the graded call that reaches one is flagged.
    "wrappers_ex01": (
        "exercises/ex01_residual.ipynb",
        [CHI_SOLVED, SCAN_ATTACKS["ex01_through_a_helper"][1]],
        CHI_POINTS,
        "plots.proof_picture",
    ),
    "wrappers_ex08": (
        "exercises/ex08_dynamic_k.ipynb",
        [SCAN_ATTACKS["ex08_methods"][1]],
        0,
        "HeuristicK",
    ),  # fmt: skip
    "wrappers_ex10": (
        "exercises/ex10_block_thresholds.ipynb",
        [SCAN_ATTACKS["ex10_two_lines"][1]],
        0,
        "block_thresholds",
    ),  # fmt: skip
    "getattr_ex07": (
        "exercises/ex07_tree_walk.ipynb",
        [SCAN_ATTACKS["ex07_getattr"][1]],
        0,
        "getattr(specdec_course.medusa.tree",
    ),  # fmt: skip
    "hidden_methods_ex08": (
        "exercises/ex08_dynamic_k.ipynb",
        [_hidden(SCAN_ATTACKS["ex08_methods"][1])],
        0,
        "HeuristicK.start, which its sandbox withholds",
    ),
    "hidden_walk_ex07": (
        "exercises/ex07_tree_walk.ipynb",
        [_hidden(SCAN_ATTACKS["ex07_sampled_walk"][1])],
        0,
        "generate._sampled_walk, which its sandbox withholds",
    ),
    "hidden_loss_ex06": (
        "exercises/ex06_medusa.ipynb",
        [_hidden(SCAN_ATTACKS["ex06_reexport"][1])],
        0,
        "which its sandbox withholds",
    ),
}


def submissions(folder: Path, out: Path) -> dict:
    """This file's part of the shared class (tests/graded_class.py); nothing without
    bubblewrap, where this file's tests are skipped."""
    if not HAS_BWRAP:
        return {"names": [], "files": 0}
    for name, (base, cells, _, _) in ATTACKS.items():
        nb = copy.deepcopy(nbformat.read(ROOT / base, as_version=4))
        if base == "solutions/ex01_residual.ipynb":
            # ex01's functions are all that these attacks and classmates need: its
            # definitions only (the full solution is graded in test_grading_batch's part).
            nb = defs_only(nb)
        nb.cells += [new_code_cell(c) for c in cells]
        # Each is a notebook of its own: the grader flags byte-identical submissions as
        # copies, and the shared class holds the same solutions in test_grading_batch's part.
        nb.metadata["submission"] = name
        nbformat.write(nb, folder / f"{name}.ipynb")
    os.symlink(ROOT / "solutions" / "ex01_residual.ipynb", folder / "link_ex01.ipynb")
    return {"names": [*ATTACKS, "link_ex01"], "files": len(ATTACKS) + 1}


@pytest.fixture(scope="module")
def run(graded_class):
    book = {Path(r["file"]).stem: r for r in graded_class_module.book(graded_class)}
    checks: dict[str, dict[str, dict]] = {}
    for r in graded_class_module.check_rows(graded_class):
        checks.setdefault(Path(r["file"]).stem, {})[r["check"]] = r
    return {
        "rc": graded_class["rc"], "book": book, "checks": checks,
        "names": set(graded_class["parts"]["test_judge_sandbox"]["names"]),
        "files": graded_class_module.expected_files(graded_class),
    }  # fmt: skip


def test_the_run_grades_every_submission(run):
    assert run["rc"] == 0
    assert run["names"] == {*ATTACKS, "link_ex01"} and run["names"] <= set(run["book"])
    assert len(run["book"]) == run["files"]  # the whole shared class, one row each


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_each_attack_earns_only_its_honest_part_and_is_flagged(run, name):
    row = run["book"][name]
    _, _, points, flag = ATTACKS[name]
    assert float(row["points"]) == points, (row["message"], row["notes"])
    assert flag in row["flags"]


def test_the_judge_side_is_out_of_the_sandbox(run):
    assert "raised" not in run["book"]["look_for_the_judge_ex01"]["notes"]  # its asserts held
    rows = run["checks"]["import_reference_ex08"]
    assert all(float(r["points"]) == 0 for r in rows.values())
    assert "reaches into the grader" in run["book"]["import_reference_ex08"]["flags"]


def test_a_forged_probe_earns_nothing(run):
    # (Its exec through builtins.__dict__ is tampering: the submission scores 0, flagged.
    # The same forgery written so that the scan sees nothing earns 0 too, since the head is
    # probed in a fresh kernel where only the notebook's class was defined:
    # test_grading_ex06's test_a_forged_head_probe_earns_no_head_points.)
    head = run["checks"]["forged_probe_ex06"]["ex06.medusa_head"]
    assert head["status"] == "failed" and float(head["points"]) == 0


def test_a_head_that_zeroes_its_input_fails_its_own_check_only(run):
    rows = run["checks"]["zero_input_ex06"]
    assert float(rows["ex06.medusa_head"]["points"]) == 0
    assert float(rows["ex06.medusa_loss"]["points"]) == 3
    assert float(rows["ex06.tree_attention_bias"]["points"]) == 4


def test_a_huge_cache_costs_its_check_and_nothing_else(run):
    rows = run["checks"]["big_cache_ex04"]
    step = rows["ex04.speculative_step"]
    assert float(step["points"]) == 0 and "rows" in step["message"]
    assert float(rows["ex04.rollback"]["points"]) + float(rows["ex04.commit_tokens"]["points"]) == 6


def test_a_link_to_the_solutions_is_refused(run):
    row = run["book"]["link_ex01"]
    assert float(row["points"]) == 0 and "leads out of the submissions folder" in row["notes"]


def test_the_packages_own_answers_are_not_in_the_sandbox(run):
    from specdec_grader.judge.core import checks_for

    assert {s.id: s.points for s in checks_for("ex01")}["ex01.chi_square_p_value"] == CHI_POINTS
    rows = run["checks"]["patched_agent_ex01"]
    assert rows["ex01.chi_square_p_value"]["status"] == "passed"  # its honest part
    for check in ("ex01.residual_distribution", "ex01.speculative_sample"):
        assert float(rows[check]["points"]) == 0 and "withheld" in rows[check]["message"]
    flags = run["book"]["patched_agent_ex01"]["flags"]
    assert "specdec_course.sampling.residual_distribution" in flags
    # ex05's launch happens in a kernel where no student cell ran: the patch never runs it.
    for check, row in run["checks"]["patched_agent_ex05"].items():
        assert float(row["points"]) == 0 and row["status"] == "not attempted", check
    # Honest classmates, graded in the same run by the same workers, keep every point.
    for name in ("classmate_ex01", "classmate_ex05"):
        flags = [f for f in run["book"][name]["flags"].split("; ") if f]
        # (The class holds copies of these notebooks under other names: near-copies.)
        assert all(f.startswith("a near-copy of ") for f in flags), flags
        assert float(run["book"][name]["points"]) == 10


FORKS = """
import os, time
kids = 0
try:
    for _ in range(600):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        kids += 1
except OSError:
    pass
raise RuntimeError(f"forked {kids} processes")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the grader is not root here")
def test_weak_as_root_runs_kernels_under_their_own_uid(monkeypatch, tmp_path):
    from specdec_grader.judge.discovery import collect
    from specdec_grader.judge.jobs import Job
    from specdec_grader.judge.submission import grade_submission

    monkeypatch.setattr(sandbox.CGroup, "available", classmethod(lambda cls: None))
    plan = sandbox.plan("weak")
    assert plan.own_uid and plan.mode == "bwrap" and "--unshare-user" not in plan.bwrap
    # ex01's definitions only: the forks and the uid are what is checked, not the notebook.
    solved = ex01_defs("solutions")
    nbformat.write(solved, tmp_path / "classmate_ex01.ipynb")
    nb = copy.deepcopy(solved)
    who = (
        "import os\n"
        f"assert os.getresuid() == ({sandbox.kernel_uid()},) * 3 and os.getgroups() == []\n"
        "assert open('/proc/self/status').read().split('CapEff:')[1].split()[0] == '0' * 16\n"
        "open(os.path.expanduser('~/x'), 'w').write('a home of its own')"
    )
    nb.cells[2:2] = [new_code_cell(who), new_code_cell(FORKS)]  # after setup and imports
    nbformat.write(nb, tmp_path / "forks_ex01.ipynb")
    rows = []
    for path in (tmp_path / "forks_ex01.ipynb", tmp_path / "classmate_ex01.ipynb"):
        (sub,) = collect([path])
        sub.exercise = "ex01"
        job = Job.for_submission(sub, cell_timeout=60, notebook_timeout=120, memory_mb=3000, seed=2)
        rows.append(grade_submission(job, plan))
    forks, classmate = rows
    assert forks.points == classmate.points == 10, (forks.notes, forks.checks)
    (note,) = [n for n in forks.notes if "forked" in n]  # the only cell that raised
    kids = int(note.split("forked ")[1].split()[0])
    assert 0 < kids < 256, note  # submission.py's nproc limit, with the kernel's own threads
    assert forks.flags == classmate.flags == []


def test_without_bubblewrap_weak_is_refused_too(monkeypatch):
    # (weak gives up the cgroup, never the sandbox: only --sandbox off grades without one.)
    monkeypatch.setattr(sandbox.CGroup, "available", classmethod(lambda cls: None))
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    plan = sandbox.plan("weak")
    assert plan.mode == "none" and "not installed" in plan.why
    with pytest.raises(sandbox.NoSandbox, match="apt-get install bubblewrap"):
        sandbox.refuse_unsandboxed(plan, "weak")
    for mode in ("auto", "require"):
        with pytest.raises(sandbox.NoSandbox, match="no cgroup can be created") as e:
            sandbox.plan(mode)
        assert "--sandbox off" in str(e.value) and "--sandbox weak" in str(e.value)


def test_a_kernel_that_is_not_triton_is_refused_before_it_runs(run):
    row = run["checks"]["torch_kernel_ex05"]["ex05.race_kernel"]
    assert float(row["points"]) == 0 and "uses torch, defined outside it" in row["message"]
