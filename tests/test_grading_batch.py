"""The batch grader on a folder of good and bad submissions, through the command line.

One grading run serves every test here: the shared class of ``tests/graded_class.py``,
graded once per session, to which this file adds the solved and untouched notebooks of the
exercises, and ex01 submissions that have a syntax error, loop forever, wait past their
wall-clock limit, raise, kill their kernel, exhaust memory, define nothing, are not JSON, or
had their cells deleted, reordered and duplicated. Attacks on the grader are in
``test_grading_attacks.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import graded_class as graded_class_module
import nbformat
import pytest
from graded_class import defs_only
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from specdec_grader import cli
from specdec_grader.judge import batch

ROOT = Path(__file__).resolve().parent.parent
MEMORY_MB = graded_class_module.MEMORY_MB
_TEXT = {"capture_output": True, "text": True, "timeout": 120}


def _read(kind: str, name: str):
    return nbformat.read(ROOT / kind / name, as_version=4)


def _make_submissions(folder: Path) -> dict[str, Path]:
    sol1, ex1 = _read("solutions", "ex01_residual.ipynb"), _read("exercises", "ex01_residual.ipynb")
    sol2, ex2 = (
        _read("solutions", "ex02_acceptance.ipynb"),
        _read("exercises", "ex02_acceptance.ipynb"),
    )
    subs = {
        "ex01_solved": sol1,
        "ex01_untouched": ex1,
        "ex02_solved": sol2,
        "ex02_untouched": ex2,
        # The other exercises' checks pass models, caches and callbacks to student code, or
        # inspect a class or a Triton kernel where it lives: all through the judge's channel.
        "ex03_solved": _read("solutions", "ex03_char_lm.ipynb"),
        "ex05_solved": _read("solutions", "ex05_triton_race.ipynb"),
        "ex05_untouched": _read("exercises", "ex05_triton_race.ipynb"),
        "ex06_solved": _read("solutions", "ex06_medusa.ipynb"),
        "ex06_untouched": _read("exercises", "ex06_medusa.ipynb"),
        "ex07_solved": _read("solutions", "ex07_tree_walk.ipynb"),
        "ex07_untouched": _read("exercises", "ex07_tree_walk.ipynb"),
        "ex08_solved": _read("solutions", "ex08_dynamic_k.ipynb"),
        "ex08_untouched": _read("exercises", "ex08_dynamic_k.ipynb"),
        "ex09_solved": _read("solutions", "ex09_ngram_proposer.ipynb"),
        "ex09_untouched": _read("exercises", "ex09_ngram_proposer.ipynb"),
        "ex10_solved": _read("solutions", "ex10_block_thresholds.ipynb"),
        "ex10_untouched": _read("exercises", "ex10_block_thresholds.ipynb"),
        "ex01_infinite_loop": defs_only(sol1, [new_code_cell("while True:\n    pass")]),
        "ex01_ignores_interrupt": defs_only(
            sol1,
            [
                new_code_cell(
                    "import signal, time\n"
                    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                    "while True:\n    time.sleep(1)"
                )
            ],
        ),
        "ex01_raises": defs_only(sol1, [new_code_cell("raise RuntimeError('half done')")]),
        "ex01_kernel_dies": defs_only(sol1, [new_code_cell("import os\nos._exit(1)")]),
    }
    # A cell and a (redefined, last) function that both allocate past the memory cap.
    hog = defs_only(
        sol1, [new_code_cell("hog = [bytearray(50 * 2**20) for _ in range(120)]  # 6 GB")]
    )
    hog.cells.append(
        new_code_cell(
            "def chi_square_p_value(counts, probs):\n"
            "    return len([bytearray(50 * 2**20) for _ in range(120)])"
        )
    )
    subs["ex01_memory_hog"] = hog

    broken = defs_only(sol1)
    first_def = next(c for c in broken.cells if "def residual_distribution" in c.source)
    first_def.source = first_def.source.replace("def residual_distribution(", "def residual(", 1)
    first_def.source = first_def.source.replace(") -> torch.Tensor:", ") torch.Tensor:", 1)
    subs["ex01_syntax_error"] = broken

    # Cells deleted, reordered (definitions last-first), one duplicated with a wrong version
    # first: the grade depends only on the functions defined at the end.
    shuffled = defs_only(sol1)
    defs = [c for c in shuffled.cells if c.source.lstrip().startswith("def ")]
    wrong = new_code_cell("def residual_distribution(p, q):\n    return p")
    shuffled.cells = shuffled.cells[:2] + [wrong] + defs[::-1]
    subs["ex01_cells_deleted"] = shuffled

    nothing = new_notebook(cells=[new_markdown_cell("# my work"), new_code_cell("x = 1")])
    subs["ex01_defines_nothing"] = nothing
    subs["homework"] = new_notebook(cells=[new_code_cell("x = 1")])

    paths = {}
    for name, nb in subs.items():
        paths[name] = folder / f"{name}.ipynb"
        nbformat.write(nb, paths[name])
    paths["ex01_not_json"] = folder / "ex01_not_json.ipynb"
    paths["ex01_not_json"].write_text('{"cells": [')
    # Checkpoints are not submissions.
    (folder / ".ipynb_checkpoints").mkdir()
    nbformat.write(sol1, folder / ".ipynb_checkpoints" / "ex01_solved-checkpoint.ipynb")
    return paths


def submissions(folder: Path, out: Path) -> dict:
    """This file's part of the shared class (tests/graded_class.py)."""
    paths = _make_submissions(folder)
    return {"paths": {name: str(path) for name, path in paths.items()}, "files": len(paths)}


@pytest.fixture(scope="module")
def graded(graded_class):
    paths = {
        name: Path(p) for name, p in graded_class["parts"]["test_grading_batch"]["paths"].items()
    }
    by_file: dict[str, list[dict]] = {}
    every_file = set()
    for r in graded_class_module.check_rows(graded_class):
        every_file.add(Path(r["file"]).stem)
        if Path(r["file"]).stem in paths:
            by_file.setdefault(Path(r["file"]).stem, []).append(r)
    book = {
        Path(r["file"]).stem: r
        for r in graded_class_module.book(graded_class)
        if Path(r["file"]).stem in paths
    }
    return {
        "rc": graded_class["rc"], "stdout": graded_class["stdout"], "rows": by_file,
        "book": book, "paths": paths, "before": graded_class["before"],
        "after": graded_class["after"], "junit": Path(graded_class["out"]) / "grades.xml",
        "files": graded_class_module.expected_files(graded_class), "every_file": every_file,
    }  # fmt: skip


def _points(rows) -> tuple[float, float]:
    return sum(float(r["points"]) for r in rows), sum(float(r["max_points"]) for r in rows)


def _status(rows) -> dict[str, str]:
    return {r["check"].split(".", 1)[1]: r["status"] for r in rows}


def test_the_run_finishes_and_grades_every_submission_once(graded):
    assert graded["rc"] == 0
    assert set(graded["rows"]) == set(graded["paths"])
    # The whole shared class has per-check rows (every file, readable or not, has one).
    assert len(graded["every_file"]) == graded["files"]
    for name, rows in graded["rows"].items():
        assert len({r["check"] for r in rows}) == len(rows), name


def test_the_gradebook_has_one_row_per_submission_with_total_and_first_problem(graded):
    book = graded["book"]
    assert set(book) == set(graded["paths"])
    assert (book["ex01_solved"]["points"], book["ex01_solved"]["max_points"]) == ("10", "10")
    assert book["ex01_solved"]["status"] == "passed" and book["ex01_solved"]["message"] == ""
    syn = book["ex01_syntax_error"]
    assert syn["points"] == "3" and syn["status"] == "missing"
    assert (
        syn["message"].startswith("ex01.residual_distribution:") and "SyntaxError" in syn["message"]
    )
    assert book["homework"]["status"] == "unknown exercise"


def test_submissions_are_never_modified(graded):
    assert graded["after"] == graded["before"]


@pytest.mark.parametrize(
    "name",
    [
        "ex01_solved",
        "ex02_solved",
        "ex03_solved",
        "ex05_solved",
        "ex06_solved",
        "ex07_solved",
        "ex08_solved",
        "ex09_solved",
        "ex10_solved",
    ],
)
def test_solution_notebooks_get_full_marks(graded, name):
    rows = graded["rows"][name]
    assert _points(rows) == (10, 10)
    assert all(r["status"] == "passed" and r["message"] == "" for r in rows)
    # Nothing the solution uses of the package is withheld from its sandbox or flagged.
    # (The class holds copies of the solutions under other names: those are near-copies.)
    flags = [f for f in graded["book"][name]["flags"].split("; ") if f]
    assert [f for f in flags if not f.startswith("a near-copy of ")] == []


@pytest.mark.parametrize(
    "name",
    [
        "ex01_untouched",
        "ex02_untouched",
        "ex05_untouched",
        "ex06_untouched",
        "ex07_untouched",
        "ex08_untouched",
        "ex09_untouched",
        "ex10_untouched",
    ],
)
def test_untouched_exercises_get_zero_as_not_attempted(graded, name):
    rows = graded["rows"][name]
    assert _points(rows) == (0, 10)
    assert all(r["status"] == "not attempted" for r in rows)
    assert all("NotImplementedError" in r["message"] for r in rows)


def test_deleted_reordered_and_duplicated_cells_do_not_change_the_grade(graded):
    assert _points(graded["rows"]["ex01_cells_deleted"]) == (10, 10)


def test_a_syntax_error_costs_only_the_function_it_breaks(graded):
    rows = graded["rows"]["ex01_syntax_error"]
    st = _status(rows)
    assert st["residual_distribution"] == "missing"
    assert st["chi_square_p_value"] == "passed"
    # speculative_sample calls the missing residual_distribution.
    assert st["speculative_sample"] == "error"
    msg = next(r["message"] for r in rows if r["check"] == "ex01.residual_distribution")
    assert "SyntaxError" in msg


def test_an_endless_loop_is_interrupted_and_the_rest_is_graded(graded):
    assert _points(graded["rows"]["ex01_infinite_loop"]) == (10, 10)


def test_a_cell_that_waits_past_its_wall_limit_scores_zero_and_names_it(graded):
    # SIGINT ignored and a sleep: the kernel's wall-clock alarm stops it (sleeping uses no
    # CPU time, so only the wall limit binds), and a limit passed costs the exercise.
    rows = graded["rows"]["ex01_ignores_interrupt"]
    assert _points(rows) == (0, 10)
    assert all(r["status"] == "timeout" and "--cell-wall" in r["message"] for r in rows)
    assert "--cell-wall" in graded["book"]["ex01_ignores_interrupt"]["notes"]


def test_a_cell_that_raises_does_not_stop_the_notebook(graded):
    assert _points(graded["rows"]["ex01_raises"]) == (10, 10)


def test_a_cell_that_kills_its_kernel_is_skipped_and_the_rest_graded(graded):
    assert _points(graded["rows"]["ex01_kernel_dies"]) == (10, 10)
    notes = graded["book"]["ex01_kernel_dies"]["notes"]
    assert "killed the kernel" in notes and "run again without it" in notes


def test_a_memory_hog_hits_the_cap_and_scores_zero_with_the_cap_named(graded):
    rows = graded["rows"]["ex01_memory_hog"]
    assert _points(rows) == (0, 10)
    cap = f"the memory cap ({MEMORY_MB} MiB, --memory-mb)"
    assert all(cap in r["message"] for r in rows), rows
    assert "exercise scores 0" in graded["book"]["ex01_memory_hog"]["message"]


def test_a_notebook_that_defines_nothing_gets_zero_as_missing(graded):
    rows = graded["rows"]["ex01_defines_nothing"]
    assert _points(rows) == (0, 10)
    assert all(r["status"] == "missing" for r in rows)


def test_a_file_that_is_not_json_is_unreadable(graded):
    rows = graded["rows"]["ex01_not_json"]
    assert _points(rows) == (0, 10)
    assert all(r["status"] == "unreadable" for r in rows)


def test_a_notebook_of_unknown_exercise_gets_one_row_that_says_what_to_do(graded):
    (row,) = graded["rows"]["homework"]
    assert row["status"] == "unknown exercise" and "--exercise" in row["message"]


def test_the_summary_table_lists_every_submission(graded):
    out = graded["stdout"]
    assert "ex01_solved.ipynb" in out and "10/10" in out and "submissions graded in" in out
    for name in graded["paths"]:
        assert f"{name}.ipynb" in out


def test_junit_xml_has_one_suite_per_submission(graded):
    root = ET.parse(graded["junit"]).getroot()
    suites = root.findall("testsuite")
    assert len(suites) == graded["files"]  # the whole shared class
    for name in graded["paths"]:
        assert sum(Path(s.get("name")).name == f"{name}.ipynb" for s in suites) == 1, name
    solved = next(s for s in suites if s.get("name").endswith("ex01_solved.ipynb"))
    assert solved.get("failures") == "0" and solved.get("errors") == "0"
    untouched = next(s for s in suites if s.get("name").endswith("ex01_untouched.ipynb"))
    assert untouched.find("testcase/error") is not None


# --------------------------------------------------------------------------- no kernels


def test_exercise_comes_from_metadata_then_file_name_then_override(tmp_path):
    nb = _read("solutions", "ex01_residual.ipynb")
    renamed = tmp_path / "alice.ipynb"
    nbformat.write(nb, renamed)
    assert batch.exercise_of(renamed) == ("ex01", "")
    plain = tmp_path / "bob_ex02_try2.ipynb"
    nbformat.write(new_notebook(), plain)
    assert batch.exercise_of(plain) == ("ex02", "")
    assert batch.exercise_of(plain, "ex01") == ("ex01", "")
    unknown = tmp_path / "carol.ipynb"
    nbformat.write(new_notebook(), unknown)
    ex, why = batch.exercise_of(unknown)
    assert ex is None and "--exercise" in why


def test_bad_arguments_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        batch.grade([tmp_path / "nope"])
    with pytest.raises(ValueError, match="no .ipynb"):
        batch.grade([tmp_path])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not a notebook"):
        batch.grade([tmp_path / "notes.txt"])
    nb = tmp_path / "ex01_a.ipynb"
    nbformat.write(new_notebook(), nb)
    with pytest.raises(ValueError, match="exercise must be one of"):
        batch.grade([nb], exercise="ex99")
    with pytest.raises(ValueError, match="workers"):
        batch.grade([nb], workers=0)
    with pytest.raises(ValueError, match="cell_timeout"):
        batch.grade([nb], cell_timeout=-1)
    with pytest.raises(ValueError, match="memory_mb"):
        batch.grade([nb], memory_mb=100)


def test_cli_reports_a_missing_folder_as_an_error(tmp_path, capsys):
    assert cli.main([str(tmp_path / "nope"), "--out", str(tmp_path / "g.csv")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("scheduler", ["local:0", "myhost"])
def test_a_bad_scheduler_gets_one_clear_error_and_no_work(scheduler, tmp_path, capsys):
    (tmp_path / "x.ipynb").write_text("{}")
    argv = [str(tmp_path / "x.ipynb"), "--scheduler", scheduler, "--out", str(tmp_path / "g.csv")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--scheduler must be" in err and "Traceback" not in err
    assert not (tmp_path / "g.csv").exists()


def test_every_option_of_the_grader_has_help_and_shows_its_default():
    parser = cli.build_parser()
    text = " ".join(parser.format_help().split())  # a default may wrap onto a new line
    assert parser.description and text.startswith("usage: specdec-grader")
    for action in parser._actions:
        assert action.help, f"{action.option_strings or action.dest} has no help text"
        if action.default not in (None, False, "==SUPPRESS==") and action.option_strings:
            assert f"(default: {action.default}" in text, f"{action.option_strings} hides it"


def test_the_grader_answers_help_without_importing_torch():
    code = (
        "import runpy, sys\nsys.argv = ['specdec-grader', '--help']\ntry:\n"
        "    runpy.run_module('specdec_grader', run_name='__main__')\n"
        "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], **_TEXT)
    assert done.stdout.split()[-2:] == ["0", "False"], done.stdout[-500:] + done.stderr


def test_the_course_command_passes_grade_through_to_the_grader(tmp_path):
    # `specdec-course grade ARGS` runs `python -m specdec_grader ARGS` in its own process
    # (the course never imports the grader): the same arguments, answers and exit status.
    nope = str(tmp_path / "nope")
    course = [sys.executable, "-m", "specdec_course.cli", "grade"]
    done = subprocess.run([*course, nope, "--out", str(tmp_path / "g.csv")], **_TEXT)
    assert done.returncode == 2
    assert done.stderr.startswith("specdec-grader: error: ") and "does not exist" in done.stderr
    helped = subprocess.run([*course, "--help"], **_TEXT)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: specdec-grader")
    assert "--notebook-wall" in helped.stdout


def test_jobs_and_results_cross_the_process_boundary_as_plain_dicts(tmp_path):
    from specdec_grader import Case, CheckResult, checks_for
    from specdec_grader.judge.jobs import Job, Submission, SubmissionResult

    nb = tmp_path / "ex01_a.ipynb"
    nbformat.write(new_notebook(), nb)
    job = Job.for_submission(
        Submission(nb, "ex01", source=nb.read_text()),
        cell_timeout=5,
        notebook_timeout=30,
        memory_mb=0,
        seed=3,
    )
    assert [c[0] for c in job.checks] == [s.id for s in checks_for("ex01")]
    assert Job.from_dict(json.loads(json.dumps(job.to_dict()))) == job  # plain data only
    res = SubmissionResult(
        str(nb),
        "ex01",
        [CheckResult("ex01.x", "t", "failed", 0.0, 3.0, "wrong", cases=[Case("c", False, "1")])],
        ["a note"],
        1.5,
        flags=["a flag"],
        seed=3,
    )
    back = SubmissionResult.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back == res and back.first_problem == "ex01.x: wrong"
    assert SubmissionResult("f", None, notes=["why", "what"]).first_problem == "why; what"


def test_whole_number_arguments_are_checked(tmp_path):
    nb = tmp_path / "ex01_a.ipynb"
    nbformat.write(new_notebook(), nb)
    for bad in (-1, True, 2048.0):
        with pytest.raises(ValueError, match="memory_mb"):
            batch.grade([nb], memory_mb=bad)
    for bad in (2.5, True, -3):
        with pytest.raises(ValueError, match="workers"):
            batch.grade([nb], workers=bad)
