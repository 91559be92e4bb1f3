"""Attacks on the checks themselves, run inline (fast; the sandboxed ones are in
tests/test_judge_sandbox.py): each earns only what its honest part earns.

- statistical checks: a function that keeps count across repeated calls and emits outcomes
  in the exact law's proportions (a low-discrepancy sequence) fails as too good to be true;
- ex04: k + 1 target calls through ``target.forward`` (which skips forward hooks) or through
  ``decode_hidden`` are counted as k + 1 calls;
- ex05: a Python object with a ``[grid]`` that computes the answer is not a Triton kernel;
  under the batch grader the kernel is taken from the notebook's source, and a body that
  names anything but Triton's language and its own variables is refused;
- ex06: a head that zeroes its input in place is judged on the judge's own input;
- the judge's generators and tensors are copies away from the student's code: reseeding or
  zeroing them changes nothing the check computes;
- the package's own versions of what ex01 and ex05 ask for are rewritten out of the modules
  their sandbox mounts (every listed function exists; the copy raises ``WithheldError``
  there and keeps every other line; methods too), such an error from the kernel names the
  function, and every package function a judge module's references use is withheld or
  allowed with a reason;
- the copy scan finds wrappers of those versions however many lines they take (a helper,
  a re-export, a method's class) and ``getattr`` of a computed name on the package or the
  builtins, ``builtins.__dict__[...]``, ``vars(builtins)`` (SCAN_ATTACKS); the solutions
  and stubs are not flagged.

Fixed seeds throughout; the honest counterparts pass at the checks' stated false-failure
rates (tests/test_grading_ex*.py).
"""

from __future__ import annotations

import types

import pytest
import torch
from test_grading_ex04 import _step, commit_row
from test_grading_ex06 import MedusaHead

from specdec_grader import call, run_check
from specdec_grader.judge import edition, withheld
from specdec_grader.judge.context import grading_seed
from specdec_grader.judge.core import exercises, public_implementations
from specdec_grader.judge.ex01 import _joint_law
from specdec_grader.judge.ex07 import V, exact_law

PHI = 0.6180339887498949


def _emit(law: torch.Tensor, k: int) -> int:
    """The ``k``-th outcome of a low-discrepancy walk through ``law``'s quantiles."""
    u = torch.tensor((k * PHI + 0.5) % 1.0, dtype=torch.float64)
    return min(int(torch.searchsorted(law.double().cumsum(0), u)), law.numel() - 1)


def _counting(key_of, outcome_of):
    seen: dict = {}

    def fn(*args, **kwargs):
        key = key_of(*args)
        seen[key] = seen.get(key, -1) + 1
        return outcome_of(seen[key], *args)

    return fn


def test_a_sampler_that_counts_its_calls_is_too_good_to_be_true():
    def outcome(k, p, q):
        i = _emit(_joint_law(p, q), k)
        return i % len(p), i < len(p)

    fn = _counting(lambda p, q: (p.numpy().tobytes(), q.numpy().tobytes()), outcome)
    res = run_check("ex01.speculative_sample", fn, quiet=True)
    assert res.status == "failed" and res.points == 0
    assert "more closely than sampling" in res.message


def _path_to(node: int, children) -> list[int]:
    parent = {c: i for i, kids in enumerate(children) for c in kids}
    path = []
    while node != 0:
        path.append(node)
        node = parent[node]
    return path[::-1]


def test_a_tree_walk_that_counts_its_calls_is_too_good_to_be_true():
    def outcome(k, probs, tokens, children):
        i = _emit(exact_law(probs, tokens, children).flatten(), k)
        return _path_to(i // V, children), i % V

    fn = _counting(lambda p, t, c: (p.numpy().tobytes(), str(c)), outcome)
    res = run_check("ex07.tree_walk", fn, quiet=True)
    assert res.status == "failed" and res.points == 0
    assert "more closely than sampling" in res.message


def _one_call_per_token(entry):
    """A speculative step that scores k + 1 tokens with k + 1 target calls through
    ``entry(target)`` (not ``target(...)``, which a forward hook would see)."""
    honest = _step(commit_row)

    def speculative_step(
        target, draft, ids, target_cache, draft_cache, k, verify, process, generator=None
    ):
        def sneaky_verify(d, q, p):
            # Re-score every token one by one through the other entry (the honest call
            # above already fed the cache; the copies start from the same length).
            n = target_cache.length
            target_cache.crop(n - k - 1)
            for t in torch.cat([ids[-1:], d[0]]):
                entry(target)(t[None, None], target_cache)
            return verify(d, q, p)

        return honest(
            target, draft, ids, target_cache, draft_cache, k, sneaky_verify, process, generator
        )

    return speculative_step


def test_target_calls_are_counted_whatever_the_entry():
    for entry in (lambda m: m.forward, lambda m: m.decode_hidden):
        res = run_check("ex04.speculative_step", _one_call_per_token(entry), quiet=True)
        assert res.status == "failed" and res.points == 0
        assert "target" in res.message and "call" in res.message, res.message


def test_a_python_object_with_a_grid_is_not_a_triton_kernel():
    from specdec_grader.judge.ex05 import reference_race

    class Fake:  # callable and subscriptable, as a JITFunction is
        def __call__(self, *args, **kwargs):
            raise TypeError("launch me with a grid")

        def __getitem__(self, grid):
            def launch(token, pos, p, q, e, K, V, BLOCK_V):
                token.copy_(reference_race(pos, p, q, e))

            return launch

    res = run_check("ex05.race_kernel", Fake(), quiet=True)
    assert res.status == "error" and res.points == 0
    assert "Triton kernel" in res.message


class ZeroesItsInput(MedusaHead):
    def forward(self, h, prev):
        h.zero_()  # the judge's input, were it not a copy: its expected value would be 0
        return super().forward(h, prev)


def test_a_head_that_zeroes_its_input_is_judged_on_the_judges_input():
    res = run_check("ex06.medusa_head", ZeroesItsInput, quiet=True)
    assert res.status == "failed" and res.points == 0
    assert "fresh head" in res.message or "forward" in res.message


def test_a_forged_head_report_earns_nothing(monkeypatch):
    # The probe replaced (in a kernel: by code the scan cannot follow) with one that reports
    # a well-formed head and outputs computed without one: the judge loads its own weights
    # and compares with its own head, so only a real head's output passes.
    from specdec_grader.judge.ex06 import head

    def forged(cls, w, n_layers, h, prev, weights):
        V, C = w.shape
        params = [["embed.weight", torch.randn(V, C)]]
        for i in range(n_layers):
            params += [
                [f"blocks.{i}.weight", torch.zeros(C, C)],
                [f"blocks.{i}.bias", torch.zeros(C)],
            ]
        params.append(["lm_head.weight", w.clone()])
        return {
            "type": "MedusaHead", "params": params, "same": [], "fresh": h @ w.T,
            "w_changed": False, "after": [[k, v.clone()] for k, v in params],
            "random": h @ weights["lm_head.weight"].T,  # lm_head alone: the blocks skipped
        }  # fmt: skip

    monkeypatch.setattr(head, "head_report", forged)
    res = run_check("ex06.medusa_head", MedusaHead, quiet=True)
    assert res.status == "failed" and res.points == 0, res.message
    assert "weights" in res.message, res.message


def test_what_student_code_does_to_its_arguments_stays_with_it():
    g = torch.Generator().manual_seed(7)
    x = torch.ones(3)
    state = g.get_state()

    def vandal(x, generator):
        x.zero_()
        generator.manual_seed(0)
        return torch.rand(1, generator=generator)

    with grading_seed(1):
        call("vandal", vandal, x, generator=g)
    assert torch.equal(x, torch.ones(3)) and torch.equal(g.get_state(), state)


def _rewritten(module: str, exercise: str) -> types.ModuleType:
    """``module`` as the sandbox of ``exercise`` shows it, imported beside the real one."""
    names = {withheld.split(p)[1] for p in public_implementations(exercise)
             if withheld.split(p)[0] == module}  # fmt: skip
    path = withheld.module_file(module)
    text = withheld.rewrite(path.read_text(encoding="utf-8"), module, names, exercise)
    mod = types.ModuleType(module + "_as_withheld")
    mod.__package__ = module.rpartition(".")[0]
    exec(compile(text, str(path), "exec"), mod.__dict__)
    return mod


def test_every_withheld_function_exists_and_the_rest_of_its_module_stays():
    listed = {ex: public_implementations(ex) for ex in exercises()}
    assert "specdec_course.sampling.residual_distribution" in listed["ex01"]
    assert "specdec_course.kernels.rejection.race_kernel" in listed["ex05"]
    for ex, functions in listed.items():
        if functions:
            tree = edition.build_tree(ex, functions)  # ValueError for a missing name
            for path in functions:
                module, name = withheld.split(path)
                if module in edition.STUDENT_EDITION:
                    rel = withheld.module_file(module).relative_to(edition.package_dir().parent)
                    text = (tree / rel).read_text()  # the tree holds the packages by name
                    assert f"{module}.{name} is withheld while {ex}" in text
    sampling = _rewritten("specdec_course.sampling", "ex01")
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    for fn in (sampling.residual_distribution, sampling.speculative_sample, sampling._residual):
        with pytest.raises(RuntimeError, match="withheld while ex01 is graded") as err:
            fn(p, q)
        assert type(err.value).__name__ == withheld.ERROR
    # What the lessons use of the module is intact (and calls through the withheld raise).
    assert sampling.exp_noise((4,), generator=torch.Generator().manual_seed(0)).shape == (4,)
    assert sampling.top_k_filter(torch.tensor([1.0, 3.0, 2.0]), 1)[1] == 3.0
    with pytest.raises(RuntimeError, match="withheld"):
        sampling.speculative_output_distribution(p, q)
    text = withheld.rewrite(
        withheld.module_file("specdec_course.sampling").read_text(encoding="utf-8"),
        "specdec_course.sampling", {"_residual"}, "ex01",
    )  # fmt: skip
    assert "clamp_min(0)" not in text.split("def _residual")[1].split("def ")[0]
    real = withheld.module_file("specdec_course.sampling").read_text(encoding="utf-8")
    body = text.rsplit(f"\n\nclass {withheld.ERROR}", 1)[0]
    assert real.endswith(body.split("def residual_distribution")[1])  # the rest as it was
    with pytest.raises(ValueError, match="no top-level function or method"):
        withheld.rewrite(real, "specdec_course.sampling", {"no_such_function"}, "ex01")


def test_a_withheld_call_from_the_kernel_names_the_function():
    race = _rewritten("specdec_course.sampling", "ex05").exponential_race
    with pytest.raises(RuntimeError) as err:
        race(torch.ones(3))
    from specdec_grader.student_side.errors import error_info

    info = error_info(err.value)
    assert withheld.named_in(info) == ("specdec_course.sampling.exponential_race", "ex05")
    wrapped = {"type": "InterpreterError", "message": f"{info['type']}: {info['message']}"}
    assert withheld.named_in(wrapped) == ("specdec_course.sampling.exponential_race", "ex05")
    assert withheld.named_in({"type": "ValueError", "message": "withheld"}) is None


def test_a_withheld_method_raises_and_its_class_stays():
    dynamic = _rewritten("specdec_course.decoding.dynamic", "ex08")
    h = dynamic.HeuristicK(initial=3)  # the constructor is the lessons' to use
    for call_it in (lambda: h.start(8), h.next_k, lambda: h.update(3, 2)):
        with pytest.raises(RuntimeError, match="HeuristicK.next_k is withheld|withheld"):
            call_it()
    with pytest.raises(RuntimeError, match="ControllerK.alpha is withheld while ex08"):
        dynamic.ControllerK(0.1).alpha  # noqa: B018 - a property
    assert withheld.split("specdec_course.decoding.dynamic.HeuristicK.next_k") == (
        "specdec_course.decoding.dynamic",
        "HeuristicK.next_k",
    )


def _package_refs(exercise: str) -> set[str]:
    """Every dotted path into the package (less the grader) that ``judge/exNN`` names."""
    import ast
    from pathlib import Path

    import specdec_grader.judge as judge

    base = Path(judge.__file__).parent
    files = [base / f"{exercise}.py"] if (base / f"{exercise}.py").exists() else []
    files += sorted((base / exercise).glob("*.py"))
    refs = set()
    for f in files:
        tree = ast.parse(f.read_text(encoding="utf-8"))
        names = {}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                if n.module.split(".")[0] == "specdec_course":
                    for a in n.names:
                        names[a.asname or a.name] = f"{n.module}.{a.name}"
        for n in ast.walk(tree):
            parts, x = [], n
            while isinstance(x, ast.Attribute):
                parts.append(x.attr)
                x = x.value
            if isinstance(x, ast.Name) and x.id in names:
                refs.add(".".join([names[x.id], *reversed(parts)]))
    return {r for r in refs if not r.startswith("specdec_grader")}


def _resolve(path: str):
    import importlib

    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(path)


@pytest.mark.parametrize("exercise", exercises())
def test_every_package_function_a_reference_uses_is_withheld_or_allowed(exercise):
    """What the judge's references call of the package answers the exercise, unless it is
    withheld from its sandbox or listed as allowed, with a reason (the model it drives, a
    statistics tool, a tool the exercise is meant to call)."""
    import sys

    public_implementations(exercise)
    module = sys.modules[f"specdec_grader.judge.{exercise}"]
    allowed = module.ALLOWED
    assert all(isinstance(why, str) and why for why in allowed.values())
    held = set(public_implementations(exercise))
    for path in sorted(_package_refs(exercise)):
        obj = _resolve(path)
        if isinstance(obj, types.ModuleType) or not callable(obj):
            continue  # a module, a constant (a tree's paths)
        name = f"{obj.__module__}.{obj.__qualname__}"
        methods = {h for h in held if h.startswith(name + ".")}
        assert path in allowed or name in allowed or name in held or methods, (
            f"{exercise}'s references use {path} ({name}): withhold it or allow it, saying why"
        )


# Wrappers around the package's own versions of what an exercise asks for, and routes to
# computed names, as a determined student writes them: name -> (exercise, cell, the needed
# names found to forward, the tampering found). Each forwarder scores 0 and is flagged;
# tampering scores the submission 0 (tests/test_judge_sandbox.py runs some for real).
SCAN_ATTACKS = {
    "ex08_methods": (
        "ex08",
        """
from specdec_course.decoding.dynamic import HeuristicK, ControllerK
from specdec_course import theory
def next_k(k, drafted, accepted, k_max):
    h = HeuristicK(initial=k)
    h.start(k_max)
    h.update(drafted, accepted)
    return h.next_k()
def alpha_estimate(outcomes, prior_alpha, prior_weight):
    ctl = ControllerK(0.0, prior_alpha=prior_alpha, prior_weight=prior_weight)
    ctl.start(1)
    for d, a in outcomes:
        ctl.update(d, a)
    return ctl.alpha
def controller_k(outcomes, c, k_max):
    return max(1, theory.optimal_gamma(min(1.0, alpha_estimate(outcomes, 0.5, 2.0)), c, k_max))
""",
        {"next_k", "alpha_estimate", "controller_k"},
        "",
    ),
    "ex10_two_lines": (
        "ex10",
        """
from specdec_course.block_verifier import block_thresholds
def coin_thresholds(p, q, draft):
    w, h = block_thresholds(draft[None], q[None], p[None])
    return w[0], h[0]
""",
        {"coin_thresholds"},
        "",
    ),
    "ex01_through_a_helper": (
        "ex01",
        """
from specdec_course.medusa.candidates import sampled_chain_walk as _walk
from specdec_course import plots
def _help(p, q):
    return plots.proof_picture(p, q)
def residual_distribution(p, q):
    ax, acc, refill = _help(p, q)
    return refill / refill.sum()
def speculative_sample(p, q, generator=None):
    pp = p.double()
    return _walk(pp, [0], [(q, 1.0)], 2, [0.5])
""",
        {"residual_distribution", "speculative_sample"},
        "",
    ),
    "ex06_reexport": (
        "ex06",
        """
from specdec_course import medusa
def medusa_loss(head_logits, ids):
    t, v = medusa.head_targets(ids, head_logits.shape[0])
    out = medusa.medusa_loss(head_logits, t, v, 0.8)
    return out[0]
""",
        {"medusa_loss"},
        "",
    ),
    "ex07_sampled_walk": (
        "ex07",
        """
import torch
from specdec_course.medusa.medusa_generate import _sampled_walk
def tree_walk(probs, tokens, children, generator=None):
    T = probs.shape[0]
    ch = tuple(tuple(c) for c in children)
    parent = {c: i for i, cs in enumerate(ch) for c in cs}
    us = (1 - torch.rand(T + 1, generator=generator, dtype=torch.float64)).tolist()
    node, tok = _sampled_walk(probs.clamp_min(1e-300).log(), None, tokens.tolist(), ch, T, us)
    path = []
    while node != 0:
        path.append(node)
        node = parent[node]
    return path[::-1], int(tok)
""",
        {"tree_walk"},
        "",
    ),
    "ex07_getattr": (
        "ex07",
        """
from specdec_course.medusa import tree as _t
def compact_cache(cache, start, path):
    f = getattr(_t, "compact_" + "cache")
    f(cache, start, path)
""",
        set(),
        "getattr(specdec_course.medusa.tree",
    ),
    "ex05_builtins_dict": (
        "ex05",
        """
import base64, builtins
run = builtins.__dict__['ex' + 'ec']
""",
        set(),
        "builtins.__dict__",
    ),
    "ex05_vars_builtins": (
        "ex05",
        "import builtins\nrun = vars(builtins)['ex' + 'ec']\n",
        set(),
        "vars(builtins)",
    ),
}


@pytest.mark.parametrize("name", sorted(SCAN_ATTACKS))
def test_wrappers_and_computed_names_are_found(name):
    from specdec_grader.judge.copying import scan
    from specdec_grader.judge.core import checks_for

    exercise, cell, forwarders, tamper = SCAN_ATTACKS[name]
    needs = {n for s in checks_for(exercise) for n in s.needs}
    found = scan([cell], needs, public_implementations(exercise))
    assert set(found.forwarders) == forwarders
    for n in forwarders:
        assert any(f.startswith(n + " ") for f in found.flags)
    if tamper:
        assert any(tamper in t for t in found.tampering), found.tampering
    else:
        assert not found.tampering


def test_the_solutions_and_stubs_are_not_flagged():
    import json
    from pathlib import Path

    from specdec_grader.judge.copying import scan
    from specdec_grader.judge.core import checks_for

    root = Path(__file__).resolve().parent.parent
    for path in sorted([*root.glob("solutions/ex*.ipynb"), *root.glob("exercises/ex*.ipynb")]):
        ex = path.name[:4]
        nb = json.loads(path.read_text(encoding="utf-8"))
        cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
        needs = {n for s in checks_for(ex) for n in s.needs}
        assert scan(cells, needs, public_implementations(ex)).flags == [], path.name


KERNEL_HEAD = (
    "@triton.jit\n"
    "def race_kernel(token_ptr, pos_ptr, p_ptr, q_ptr, e_ptr, K, V, BLOCK_V: tl.constexpr):\n"
)


@pytest.mark.parametrize(
    "body, says",
    [
        ("    torch.ops.aten.argmax(p_ptr)\n", "uses torch, defined outside it"),
        ("    x = p_ptr.__class__\n", "reads .__class__"),
        ("    x = p_ptr.handle.data\n", r"reads \.(handle|data)"),
        ("    tl.core.os.system('true')\n", "not Triton's language"),
        ("    triton.runtime.driver\n", "not Triton's language"),
        ("    import torch\n", "holds a Import"),
        ("    f = lambda: 0\n", "holds a Lambda"),
        ("    tl.store(token_ptr, GLOBAL)\n", "uses GLOBAL, defined outside it"),
    ],
)
def test_a_race_kernel_that_is_not_only_triton_is_refused(body, says):
    import json

    from specdec_grader.judge.kernel_source import Refused, kernel_cell

    nb = {"cells": [{"cell_type": "code", "source": KERNEL_HEAD + body}]}
    with pytest.raises(Refused, match=says):
        kernel_cell(json.dumps(nb))


def test_the_race_kernel_and_its_helpers_are_taken_from_the_source_alone():
    import json
    from pathlib import Path

    from specdec_grader.judge.kernel_source import Refused, kernel_cell

    root = Path(__file__).resolve().parent.parent
    cell = kernel_cell((root / "solutions" / "ex05_triton_race.ipynb").read_text())
    assert cell.count("@triton.jit") == 1 and "tl.math.div_rn" in cell
    assert "from specdec_course" not in cell and "import torch" not in cell
    helper = "@triton.jit\ndef score(p, q, e):\n    return tl.maximum(p - q, 0.0) / e\n"
    body = "    tl.store(token_ptr, score(1.0, 0.5, 2.0))\n"
    later = "def race_kernel(*a):\n    return 0\n"  # a plain def of that name, run last
    nb = {"cells": [{"cell_type": "code", "source": s} for s in (helper, KERNEL_HEAD + body)]}
    cell = kernel_cell(json.dumps(nb))
    assert cell.index("def score") < cell.index("def race_kernel")
    nb["cells"].append({"cell_type": "code", "source": later})
    with pytest.raises(Refused, match="no `@triton.jit def race_kernel"):
        kernel_cell(json.dumps(nb))
