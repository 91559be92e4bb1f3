"""The cost story of lessons 04 and 07 and appendix A is the stored record's: every c value and
speedup their committed outputs print from data/results/speedup_cpu.json is the record's
figure at the printed precision, and their prose types no c value or speedup a record could
contradict (lesson 04 defines one c; appendix A splits it into c_call and c_loop). Neither do the
exercises, their solutions, or lessons 01-03 (outside lesson 02's hypothetical examples).
Lessons 06b, 08, 09 and 09b print their verdicts on the stored records (Medusa against plain
decoding and the draft model, the controller against the best fixed k, block against
token-wise verification, EAGLE against the draft model) from the records, with words chosen
from the figures."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from specdec_course import bench

ROOT = Path(__file__).resolve().parent.parent
L04 = ROOT / "lessons" / "04_speculative_decoding.ipynb"
L07 = ROOT / "lessons" / "07_ngram_draft.ipynb"
APPENDIX_A = ROOT / "lessons" / "appendix_a_cpu_costs.ipynb"


def _cells(path, kind):
    cells = json.loads(path.read_text())["cells"]
    return [c for c in cells if c["cell_type"] == kind]


def _text(src):
    return "".join(src) if isinstance(src, list) else src


def outputs(path) -> str:
    """Everything the committed notebook's code cells printed."""
    parts = []
    for c in _cells(path, "code"):
        for o in c.get("outputs", []):
            data = o.get("data", {})
            parts.append(
                _text(o.get("text", ""))
                or _text(data.get("text/markdown", ""))
                or _text(data.get("text/plain", ""))
            )
    return "\n".join(parts)


@pytest.fixture(scope="module")
def record():
    return bench.load_speedup_results()


def _t1(record):
    return next(r for r in record["results"] if r["temperature"] == 1.0)


def test_appendix_a_prints_the_records_cost_table(record):
    out = outputs(APPENDIX_A)
    rows = _t1(record)["methods"]["draft"]
    ks = np.array([r["k"] for r in rows])
    c_loop = np.array([r["c"] for r in rows])
    for r in rows:
        c_call = r["target_call_s"] / r["plain_token_s"]
        assert f"{r['k']:2d} | {c_call:6.2f} | {r['c']:6.3f} |" in out, r["k"]
    c_step, c_fixed = np.polyfit(ks, ks * c_loop, 1)
    assert f"per drafted token c_step = {c_step:.3f}, per proposal c_fixed = {c_fixed:.3f}" in out


def test_lesson_04_prints_the_records_speedups_with_one_c(record):
    out = outputs(L04)
    for res in record["results"]:
        for r in res["methods"]["draft"]:
            line = (
                f"{res['temperature']:.0f}  | {r['k']} | {r['alpha']:.3f} | {r['c']:.3f} | "
                f"{r['predicted_speedup']:10.2f}x | {r['measured_speedup']:7.2f}x"
            )
            assert line in out, line
    best = bench.best_row(_t1(record), "draft")
    assert (
        f"best at temperature 1: k = {best['k']}, {best['measured_speedup']:.2f}x measured, "
        f"{best['predicted_speedup']:.2f}x by Theorem 3.8 (c = {best['c']:.3f})" in out
    )


def test_lesson_05b_sets_the_gpu_model_beside_the_records_best(record):
    # Lesson 04's GPU section moved to lesson 05b, which quotes lesson 04's best row.
    out = outputs(ROOT / "lessons" / "05b_verifier_on_a_gpu.ipynb")
    best = bench.best_row(_t1(record), "draft")
    assert f"this CPU (stored record): k = {best['k']}, {best['measured_speedup']:.2f}x" in out
    assert f"this CPU measured {best['measured_speedup']:.2f}x" in out


def test_appendix_a_prints_the_records_speedups_and_theorem_range(record):
    out = outputs(APPENDIX_A)
    for res in record["results"]:
        rows = res["methods"]["draft"]
        for r in rows:
            line = (
                f"{res['temperature']:.0f}  | {r['k']} | {r['alpha']:.3f} | "
                f"{r['predicted_speedup']:10.2f}x | {r['cost_aware_speedup']:9.2f}x | "
                f"{r['measured_speedup']:7.2f}x"
            )
            assert line in out, line
        thm = [r["predicted_speedup"] for r in rows]
        b = bench.best_row(res, "draft")
        assert (
            f"T = {res['temperature']:.0f}: Theorem 3.8 predicts {min(thm):.2f}x to "
            f"{max(thm):.2f}x over k = 1..8; measured at the best k ({b['k']}): "
            f"{b['measured_speedup']:.2f}x" in out
        )
    best = bench.best_row(_t1(record), "draft")
    assert (
        f"best at temperature 1: k = {best['k']}, {best['measured_speedup']:.2f}x measured, "
        f"{best['predicted_speedup']:.2f}x by Theorem 3.8" in out
    )


def test_lesson_07_prints_the_records_tables_and_c(record):
    out = outputs(L07)
    for res in record["results"]:
        assert bench.format_speedup_table(res) in out, res["temperature"]
    t1 = _t1(record)
    dm, ng = bench.best_row(t1, "draft"), bench.best_row(t1, "ngram")
    assert f"alpha: draft model {dm['alpha']:.3f}, n-gram {ng['alpha']:.3f}" in out
    assert f"on this CPU c is {dm['c']:.2f}" in out


# Typed figures a record could contradict: a c value ("c ≈ 0.2", "c_loop = 0.19"), a speedup
# ("1.6x", "1.3×"), a share of a step in words ("about a fifth of a target step"), or a cost
# in steps ("1.4 plain steps", "2 target calls").
_TYPED = [
    re.compile(r"\bc(_\{\\text\{\w+\}\})?\s*(\\approx|≈|=|~)\s*0?\.\d"),
    re.compile(r"\d+(\.\d+)?\s*(x|×)(?![\w])"),
    re.compile(r"about (a|one) (fifth|quarter|third|half)"),
    re.compile(r"\d+(\.\d+)?\s+(plain|target)\b( decoding)?( steps?| calls?)?"),
]
# Hypotheticals, not measurements: no record speaks of them (lesson 02's worked examples of
# Theorem 3.8 and its explorer's starting values).
_ALLOWED = (
    "A draft with a hundredth of the target's parameters then costs $c \\approx 0.01$",
    # example inputs of lesson 02's check, not measured costs
    "a draft costing half a target call ($c = 0.5$) gains under 7% (printed), and at $c = 0.6$",
    "The explorer at alpha = 0.80, gamma = 4, c = 0.10",
)


def _prose_hits(path):
    hits = []
    for c in _cells(path, "markdown"):
        text = " ".join(_text(c["source"]).split())
        for allowed in _ALLOWED:
            text = text.replace(allowed, "")
        for pat in _TYPED:
            hits += [m.group(0) for m in pat.finditer(text)]
    return hits


def _compare(x, y):
    # the lessons' words for speedup x against y at the two decimals they print
    x, y = round(x, 2), round(y, 2)
    return "beats" if x > y else ("matches" if x == y else "trails")


def test_lesson_06b_prints_the_records_medusa_verdicts(record):
    out = outputs(ROOT / "lessons" / "06b_medusa_on_a_cpu.ipynb")
    for res in record["results"]:
        top = max(res["medusa"], key=lambda r: r["measured_speedup"])
        rival = bench.best_row(res, "draft")
        x, y = top["measured_speedup"], rival["measured_speedup"]
        line = (
            f"`{top['tree']}` ({top['nodes']} nodes, {top['tokens_per_target_call']:.2f} tokens "
            f"per target call) runs at {x:.2f}x: it **{_compare(x, 1.0)}** plain decoding and "
            f"**{_compare(x, y)}** the draft model's best ({y:.2f}x at k = {rival['k']}"
        )
        assert line in out, line


def test_lesson_08_prints_the_records_dynamic_verdicts():
    rec = bench.load_beyond_results()
    out = outputs(ROOT / "lessons" / "08_when_speculation_pays.ipynb")
    rows = {r["name"]: r for r in rec["dynamic"]["rows"]}
    best = max(
        (r for r in rows.values() if r["name"].startswith("fixed")), key=lambda r: r["speedup"]
    )
    f_ctl = rows["controller"]["speedup"] / best["speedup"]
    assert f"The controller reaches **{f_ctl:.2f}** of the best fixed $k$'s speedup" in out
    dm, ng = rec["batch"]["rows"], rec["batch_ngram"]["rows"]
    assert (
        f"With the n-gram as its draft, batched speculation reaches {ng[0]['best_speedup']:.2f}x "
        f"at $B$ = 1, against {dm[0]['best_speedup']:.2f}x with the draft model" in out
    )


def test_lesson_09_prints_the_records_block_rows_with_their_standard_errors():
    blk = bench.load_beyond_results()["block"]
    out = outputs(ROOT / "lessons" / "09_block_verification.ipynb")
    for r in blk["rows"]:
        assert f"| {r['gain']:18.3f} | {r['diff']:+.3f} ({r['diff_se']:.3f})" in out, r["k"]


def test_lesson_09b_prints_the_records_eagle_verdicts():
    out = outputs(ROOT / "lessons" / "09b_feature_drafts.ipynb")
    for run in bench.load_eagle_results()["runs"]:
        e, d = run["methods"]["eagle"]["best_speedup"], run["methods"]["draft"]["best_speedup"]
        t = run["temperature"]
        word = _compare(e, d)
        assert (
            f"at temperature {t:g} it **{word}** the draft model ({e:.2f}x against {d:.2f}x)" in out
        )


@pytest.mark.parametrize(
    "name",
    [
        "04_speculative_decoding",
        "05_triton_verifier",
        "05b_verifier_on_a_gpu",
        "06_tiny_medusa",
        "06b_medusa_on_a_cpu",
        "07_ngram_draft",
        "08_when_speculation_pays",
        "09_block_verification",
        "09b_feature_drafts",
        "appendix_a_cpu_costs",
    ],
)
def test_prose_types_no_c_value_or_speedup(name):
    assert _prose_hits(ROOT / "lessons" / f"{name}.ipynb") == []


_EXERCISES = sorted(
    str(p.relative_to(ROOT)) for d in ("exercises", "solutions") for p in (ROOT / d).glob("*.ipynb")
) + [
    f"lessons/{n}.ipynb"
    for n in ("01_residual_distribution", "02_acceptance_rate", "03_char_lm_pair")
]


@pytest.mark.parametrize("rel", _EXERCISES)
def test_exercise_and_early_lesson_prose_types_no_cost_figure(rel):
    # An exercise that quotes lesson 04's costs prints them from the record, as the lessons do.
    assert _prose_hits(ROOT / rel) == []


def test_the_prose_check_catches_a_typed_figure(tmp_path):
    nb = {
        "cells": [{"cell_type": "markdown", "source": "Theorem 3.8 predicts about 1.6x, c ≈ 0.2."}]
    }
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
    assert _prose_hits(tmp_path / "nb.ipynb") == ["c ≈ 0.2", "1.6x"]


def test_the_prose_check_catches_a_typed_cost_in_plain_steps(tmp_path):
    # the sentence an exercise once typed against the record it loads (about 1.8 at 8 tokens)
    nb = {
        "cells": [
            {
                "cell_type": "markdown",
                "source": "and a\ntarget call over 8 tokens costs about 1.4 plain steps.",
            }
        ]
    }
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
    assert _prose_hits(tmp_path / "nb.ipynb") == ["1.4 plain steps"]
