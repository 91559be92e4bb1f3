"""The grader's trust boundaries, piece by piece, without kernels (fast).

The channel's format refuses what is not plain, well-formed data; the reports escape what a
submission controls; discovery never opens what is not a regular file; copy detection finds
wrappers around the package's reference and leaves the course's own notebooks alone; the
judge's objects handed to student code stay the judge's; the batch grader's cases are fresh
per seed while inline checks keep the visible ones.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_notebook

import specdec_grader as grading
from specdec_course.model import CharGPT, GPTConfig
from specdec_grader.judge import context, copying, discovery, ex01, reports
from specdec_grader.judge.exposure import Exposed
from specdec_grader.judge.jobs import SubmissionResult
from specdec_grader.student_side import wire

ROOT = Path(__file__).resolve().parent.parent
CFG = GPTConfig(vocab_size=7, block_size=8, n_layer=1, n_head=1, n_embd=4)


# --------------------------------------------------------------------------- the channel


def test_values_cross_the_channel_as_plain_data_with_aliases_kept():
    g = torch.Generator().manual_seed(3)
    t = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    value = {
        "t": t,
        "again": t,
        "b": torch.tensor([True, False]),
        "h": torch.ones(2, dtype=torch.bfloat16),
        "x": (1, 2.5, float("nan"), None, "s"),
        "g": g,
        "cfg": CFG,
    }
    enc, blobs, objects = wire.encode(value)
    back, made = wire.decode(json.loads(json.dumps(enc)), b"".join(blobs))
    assert torch.equal(back["t"], t) and back["again"] is back["t"]
    assert back["h"].dtype == torch.bfloat16 and back["b"].dtype == torch.bool
    assert back["x"][:2] == (1, 2.5) and back["x"][2] != back["x"][2]
    assert torch.equal(back["g"].get_state(), g.get_state()) and back["cfg"] == CFG
    assert len(made) == len(objects) == 4  # t (once), b, h, g: the order write-back relies on
    enc, blobs, _ = wire.encode(object())
    assert isinstance(wire.decode(enc, b"".join(blobs))[0], wire.Opaque)


@pytest.mark.parametrize(
    "bad",
    [
        {"$tensor": ["object", [1], 0, 8, 0]},  # a dtype not on the list
        {"$tensor": ["float64", [2], 0, 8, 0]},  # bytes do not match the shape
        {"$tensor": ["float64", [1], 100, 8, 0]},  # past the end of the frame
        {"$tensor": ["float64", [-1], 0, 0, 0]},  # a negative dimension
        {"$pickle": "gASVAAAAAAAAAA=="},  # no such tag: nothing is ever unpickled
        {"$ref": [1, "CharGPT"]},  # a reference without a resolver
        {"a": 1, "b": 2},  # not a tag
    ],
)
def test_malformed_values_are_refused(bad):
    with pytest.raises(wire.WireError):
        wire.decode(bad, b"\0" * 8)


def test_nesting_and_frame_size_are_bounded():
    deep: list = []
    for _ in range(wire.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(wire.WireError):
        wire.encode(deep)
    r, w = os.pipe()
    try:
        os.write(w, struct.pack(">II", wire.MAX_FRAME + 1, 2))
        with pytest.raises(wire.WireError):
            wire.read_frame(r)
    finally:
        os.close(r)
        os.close(w)


def test_a_rebuilt_error_keeps_its_name_message_and_builtin_base():
    try:
        raise KeyError("nope")
    except KeyError as e:
        info = wire.error_info(e)
    exc = wire.rebuild_error(info)
    assert isinstance(exc, KeyError) and type(exc).__name__ == "KeyError"
    assert str(exc) == "'nope'"
    wrapped = wire.rebuild_error({**info, "case": "case 3"})
    assert isinstance(wrapped, grading.StudentError) and wrapped.case == "case 3"
    stub = wire.rebuild_error({"type": "NotImplementedError", "bases": ["NotImplementedError"]})
    assert isinstance(stub, NotImplementedError)


# --------------------------------------------------------------------------- the reports


def test_reports_escape_control_characters_and_neutralise_formulas(tmp_path):
    evil = "=HYPERLINK(1)\x00\x1b[31m\nrow,10\r\u202e\udcff"
    res = SubmissionResult(evil, "ex01", notes=["-cmd"], flags=["@x"], seed=5)
    res.checks = [grading.CheckResult("ex01.a", "t", "error", 0.0, 3.0, message=evil)]
    reports.write_csv([res], tmp_path / "g.csv")
    reports.write_junit([res], tmp_path / "g.xml")
    text = (tmp_path / "g.csv").read_text(encoding="utf-8")
    assert text.count("\n") == 2  # the header and one row, nothing injected
    assert "'=HYPERLINK(1)\\x00\\x1b[31m\\nrow,10\\r\\u202e\\udcff" in text
    assert ",'-cmd,'@x,,5" in text  # (time_limited empty)
    import xml.etree.ElementTree as ET

    ET.parse(tmp_path / "g.xml")  # valid XML although the input was not
    summary = reports.format_summary([res], ["no sandbox"])
    assert "\x1b" not in summary and "WARNING: no sandbox" in summary
    assert not list(tmp_path.glob(".g.*"))  # no temporary file left behind


def test_a_malformed_result_from_a_worker_is_refused():
    good = SubmissionResult("f", "ex01", [grading.CheckResult("ex01.a", "t", "passed", 3, 3)])
    d = good.to_dict()
    assert SubmissionResult.from_dict(d).points == 3
    for field, value in (("points", "10"), ("status", "hacked"), ("points", float("inf"))):
        bad = json.loads(json.dumps(d, allow_nan=True))
        bad["checks"][0][field] = value
        with pytest.raises((ValueError, TypeError)):
            SubmissionResult.from_dict(bad)
    big = json.loads(json.dumps(d))
    big["checks"][0]["points"] = 1e6
    assert SubmissionResult.from_dict(big).points == 3  # clamped to the maximum


# --------------------------------------------------------------------------- discovery


def test_discovery_reads_regular_files_and_reports_the_rest(tmp_path, monkeypatch):
    nbformat.write(new_notebook(), tmp_path / "ok_ex01.ipynb")
    os.mkfifo(tmp_path / "fifo_ex01.ipynb")
    (tmp_path / "zero_ex01.ipynb").symlink_to("/dev/zero")
    (tmp_path / "gone_ex01.ipynb").symlink_to(tmp_path / "missing")
    (tmp_path / "link_ex01.ipynb").symlink_to(tmp_path / "ok_ex01.ipynb")
    (tmp_path / "big_ex01.ipynb").write_text("x" * 100)
    (tmp_path / "latin1_ex01.ipynb").write_bytes(b'{"cells": "\xe9"}')
    monkeypatch.setattr(discovery, "MAX_NOTEBOOK_BYTES", 99)
    subs = {Path(s.display).name: s for s in discovery.collect([tmp_path])}
    assert subs["ok_ex01.ipynb"].source and not subs["ok_ex01.ipynb"].problem
    assert subs["link_ex01.ipynb"].source == subs["ok_ex01.ipynb"].source
    assert "FIFO" in subs["fifo_ex01.ipynb"].problem
    assert "character device" in subs["zero_ex01.ipynb"].problem
    assert "leads nowhere" in subs["gone_ex01.ipynb"].problem
    assert "larger than" in subs["big_ex01.ipynb"].problem
    assert "UTF-8" in subs["latin1_ex01.ipynb"].problem


def test_names_that_are_not_utf8_are_shown_escaped(tmp_path):
    raw = os.fsencode(str(tmp_path)) + b"/\xff\xfe\x1b_ex01.ipynb"
    with open(raw, "w") as f:
        f.write("{}")
    (sub,) = discovery.collect([tmp_path])
    assert sub.display.endswith("/\\xff\\xfe\\x1b_ex01.ipynb")
    assert discovery.exercise_of(sub) == ("ex01", "")


# --------------------------------------------------------------------------- copy detection


def _code(kind: str, name: str) -> list[str]:
    nb = nbformat.read(ROOT / kind / name, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


ALL_NEEDS = {n for ex in grading.exercises() for s in grading.checks_for(ex) for n in s.needs}


@pytest.mark.parametrize("kind", ["exercises", "solutions"])
def test_the_course_notebooks_raise_no_flag(kind):
    for path in sorted((ROOT / kind).glob("ex*.ipynb")):
        found = copying.scan(_code(kind, path.name), ALL_NEEDS)
        assert found.forwarders == {} and found.flags == [], path.name


@pytest.mark.parametrize(
    "source, why",
    [
        ("from specdec_course.sampling import residual_distribution", "imported from"),
        ("import specdec_course as s\nresidual_distribution = s.sampling.residual_distribution",
         "is the package's"),
        ("from specdec_course import sampling as S\n"
         "def residual_distribution(p, q):\n    '''mine'''\n"
         "    return S.residual_distribution(p, q)",
         "calls the package's own"),
        ("import specdec_course\nresidual_distribution = lambda p, q: "
         "specdec_course.sampling.residual_distribution(p, q)", "lambda"),
        ("import functools\nfrom specdec_course import sampling\n"
         "residual_distribution = functools.partial(sampling.residual_distribution)", "partial"),
        ("import types\nfrom specdec_course import sampling as S\nresidual_distribution = "
         "types.FunctionType(S.residual_distribution.__code__, {})", "FunctionType"),
        ("from specdec_course import theory\n"
         "def residual_distribution(p, q):\n    return theory.tv_distance(p, q)", "only returns"),
        ("from specdec_course import medusa\nclass residual_distribution(medusa.MedusaHead):\n"
         "    pass", "subclasses"),
        ("r = __import__('specdec_course.sampling').sampling.residual_distribution\n"
         "residual_distribution = r", "is the package's"),
    ],
)  # fmt: skip
def test_forwarders_to_the_package_are_found(source, why):
    found = copying.scan(["import torch", source], {"residual_distribution"})
    assert why in found.forwarders.get("residual_distribution", ""), found


def test_a_later_own_definition_clears_an_earlier_copy():
    cells = [
        "from specdec_course.sampling import residual_distribution",
        "def residual_distribution(p, q):\n    r = (p - q).clamp(min=0)\n    return r / r.sum()",
    ]
    assert copying.scan(cells, {"residual_distribution"}).forwarders == {}


def test_tampering_is_flagged_for_the_instructor():
    cells = [
        "import gc, pathlib, specdec_course\nimport specdec_grader.core as core\n"
        "core.run_check = None\ngc.get_objects()\n"
        "p = pathlib.Path(specdec_course.__file__).parent.parent / 'solutions'"
    ]
    flags = " ".join(copying.scan(cells, set()).flags)
    for what in ("patches specdec_grader.core.run_check", "gc.get_objects", "__file__"):
        assert what in flags
    assert "solutions" in flags


# --------------------------------------------------------------------------- exposed objects


def test_student_code_may_call_and_read_the_judges_model_but_not_change_it():
    model = CharGPT(CFG).eval()
    ex = Exposed()
    ref = ex.for_arguments(model)["$ref"][0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = ex.call(ref, (torch.zeros(1, 3, dtype=torch.long),), {})
    assert logits.shape == (1, 3, CFG.vocab_size)
    assert ex.getattr(ref, "config")[0] == CFG
    for name in ("load_state_dict", "register_forward_hook", "train", "to", "_modules", "apply"):
        with pytest.raises(AttributeError, match="not available"):
            ex.getattr(ref, name)
    with pytest.raises(AttributeError):
        ex.setattr(ref, "lm_head", None)
    # No weights leave the judge (issue 43): a notebook could rebuild the model from them
    # and call the copy uncounted.
    for name in ("state_dict", "parameters", "named_parameters", "buffers", "modules",
                 "children", "lm_head", "transformer"):  # fmt: skip
        with pytest.raises(AttributeError, match="not available"):
            ex.getattr(ref, name)
    with pytest.raises(AttributeError, match="not available"):
        ex.getattr(ex.export(model.lm_head, may_call=True)["$ref"][0], "weight")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_judges_caches_take_no_write_back_unless_the_check_accepts_it():
    cache = CharGPT(CFG).new_cache(1)
    ex = Exposed()
    ref = ex.for_arguments(cache)["$ref"][0]
    k, live = ex.getattr(ref, "k")
    assert not live and k is not cache.k
    ex.write_back([[ref, "k", torch.ones_like(cache.k)]])
    assert not cache.k.any()  # the judge's cache is the judge's
    ex.cache_writes = True  # ex07's compaction: moving the slots is the API
    k, live = ex.getattr(ref, "k")
    assert live
    ex.write_back([[ref, "k", torch.ones_like(cache.k)]])
    assert cache.k.all()


def test_a_caches_length_can_be_set_only_within_its_capacity():
    cache = CharGPT(CFG).new_cache(1)
    ex = Exposed()
    ref = ex.for_arguments(cache)["$ref"][0]
    ex.setattr(ref, "length", 3)
    assert cache.length == 3
    for bad in (-1, CFG.block_size + 1, True, 2.0):
        with pytest.raises((ValueError, TypeError)):
            ex.setattr(ref, "length", bad)
    with pytest.raises(TypeError, match="not callable"):
        ex.call(ref, (), {})


# --------------------------------------------------------------------------- fresh cases


def test_batch_cases_are_fresh_per_seed_and_inline_cases_are_the_visible_ones():
    visible = ex01._residual_cases()[1][0][0]
    with context.grading_seed(1):
        one = ex01._residual_cases()[1][0][0]
        assert context.fresh_cases()
    with context.grading_seed(1):
        again = ex01._residual_cases()[1][0][0]
    with context.grading_seed(2):
        two = ex01._residual_cases()[1][0][0]
    assert torch.equal(ex01._residual_cases()[1][0][0], visible)
    assert torch.equal(one, again) and not torch.equal(one, visible)
    assert one.shape != two.shape or not torch.equal(one, two)


def test_inline_check_says_that_its_cases_are_the_visible_ones(capsys):
    grading.check("ex01.residual_distribution", lambda p, q: p)
    assert "visible cases" in capsys.readouterr().out
