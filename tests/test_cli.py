"""The `specdec-course` command: generate and bench speedup, driven through `cli.main`."""

import argparse
import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import assert_prints, data_readme

from specdec_course import bench, cli, medusa, theory
from specdec_course.data import CharTokenizer
from specdec_course.decoding import speculative_generate
from specdec_course.model import load_pretrained

ROOT = Path(__file__).resolve().parent.parent


def test_generate_greedy_is_the_same_text_for_both_methods(capsys):
    texts = []
    for method in ("autoregressive", "speculative", "medusa"):
        code = cli.main(
            [
                "generate",
                "ROMEO:",
                "--method",
                method,
                "--max-new-tokens",
                "40",
                "--temperature",
                "0",
                "--k",
                "3",
            ]
        )
        assert code == 0
        out = capsys.readouterr().out
        texts.append(out.split("-" * 60)[0])
        assert out.startswith("ROMEO:")
    assert texts[0] == texts[1] == texts[2]


def test_generate_prints_speculative_stats(capsys):
    assert cli.main(["generate", "\n", "--max-new-tokens", "30", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "tokens per target call" in out and "30 new characters" in out


def test_generate_rejects_characters_outside_the_vocabulary(capsys):
    assert cli.main(["generate", "caf\u00e9", "--max-new-tokens", "5"]) == 2
    assert "error" in capsys.readouterr().err


def test_measure_speedup_reports_every_k_with_both_predictions():
    target, draft = load_pretrained("target"), load_pretrained("draft")
    prompts = bench.validation_prompts(CharTokenizer(target.vocab), n=1)
    res = bench.measure_speedup(
        target, {"draft": draft}, prompts, max_new_tokens=30, ks=(1, 2), repeats=1
    )
    rows = res["methods"]["draft"]
    assert [r["k"] for r in rows] == [1, 2]
    for r in rows:
        assert 0 < r["alpha"] <= 1 and r["tokens_per_target_call"] >= 1
        assert r["predicted_speedup"] == pytest.approx(theory.speedup(r["alpha"], r["k"], r["c"]))
        # The cost-aware prediction prices the target call, the drafts and the prompt's
        # prefill (seconds per new token) as measured.
        # With one repeat its costs are the row's.
        tokens = theory.expected_tokens(r["alpha"], r["k"])
        cost = r["k"] * r["draft_token_s"] + r["target_call_s"]
        per_new = r["prefill_token_s"] + cost / tokens
        assert r["prefill_token_s"] > 0  # (this one repeat also builds the draft step)
        assert r["cost_aware_speedup"] == pytest.approx(r["plain_token_s"] / per_new)
        assert r["c"] == pytest.approx(r["draft_token_s"] / r["plain_token_s"])
        assert r["measured_speedup"] == pytest.approx(r["plain_token_s"] * 30 / r["seconds"])
        assert sum(r["split_s"].values()) > 0
    assert "cost-aware" in bench.format_speedup_table(res)
    assert bench.best_row(res, "draft") in rows


def test_bench_speedup_writes_its_json(tmp_path, capsys, monkeypatch):
    # A smaller sweep than the real command, through the same code path.
    monkeypatch.setattr(
        bench,
        "validation_prompts",
        lambda tok, n=4, length=32: [tok.encode("\nKING LEAR:\nThou art a soul in")],
    )
    code = cli.main(
        [
            "bench",
            "speedup",
            "--quick",
            "--temperature",
            "0",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    data = json.loads((tmp_path / "speedup_cpu.json").read_text())
    assert data["command"].startswith("specdec-course bench speedup")
    res = data["results"][0]
    assert res["temperature"] == 0.0
    assert set(res["methods"]) == {"draft", "ngram", "distilled", "eagle", "fused", "recurrent"}
    for rows in res["methods"].values():
        assert [r["k"] for r in rows] == [1, 2, 3, 4]
        for r in rows:
            assert 0 < r["alpha"] <= 1 and r["tokens_per_target_call"] >= 1
            assert set(r["split_s"]) == {"prefill", "draft", "target", "verify", "rest"}
            assert r["measured_over_cost_aware"] == r["measured_speedup"] / r["cost_aware_speedup"]
    # the shipped Hydra heads' greedy trees (at temperature 0 no sampled chains)
    assert [r["tree"] for r in res["medusa"]] == [f"top{n + 1}" for n in bench.TREE_SIZES]
    assert {r["heads"] for r in res["medusa"]} == {"hydra"}
    assert (tmp_path / "speedup_cpu.png").stat().st_size > 10_000
    assert "cost of one cached forward" in capsys.readouterr().out


def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_bench_writes_to_scratch_and_leaves_the_committed_records_alone(
    tmp_path, capsys, monkeypatch
):
    # The cheapest bench speedup, as a user types it (no --out): the committed records that
    # generate and the lessons read stay as they were, byte for byte and for git.
    from specdec_course.paths import REPO_ROOT, results_dir

    monkeypatch.setattr(
        bench, "validation_prompts", lambda tok, n=4, length=32: [tok.encode("\nKING LEAR:\n")]
    )
    monkeypatch.setenv("SPECDEC_SCRATCH", str(tmp_path / "scratch"))
    before = _digest(results_dir())
    git = ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", str(results_dir())]
    in_git = (REPO_ROOT / ".git").exists()
    status = subprocess.run(git, capture_output=True, text=True).stdout if in_git else ""
    argv = ["bench", "speedup", "--quick", "--method", "ngram", "--temperature", "0"]
    assert cli.main([*argv, "--repeats", "1"]) == 0
    assert _digest(results_dir()) == before
    if in_git:
        assert subprocess.run(git, capture_output=True, text=True).stdout == status
        # and the default scratch folder is one git ignores
        probe = ["git", "-C", str(REPO_ROOT), "check-ignore", "-q", "bench-results/x.json"]
        assert subprocess.run(probe).returncode == 0
    assert (tmp_path / "scratch" / "speedup_cpu.json").exists()
    assert f"wrote {tmp_path / 'scratch' / 'speedup_cpu.json'}" in capsys.readouterr().out


def test_train_help_gives_the_hydra_steps_the_code_takes(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"its Hydra heads take {medusa.HYDRA_STEPS} whatever --steps says" in out


def test_a_prompt_outside_the_vocabulary_gets_the_alphabet_and_a_fix_without_python(capsys):
    assert cli.main(["generate", "caf\u00e9", "--max-new-tokens", "5"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "65 characters: letters A-Z a-z, newline, space and !&',-.:;?[]" in err
    assert "remove or replace it in the text (e.g. café -> cafe" in err


def test_only_record_writes_to_data_results():
    from specdec_course.cli.bench_models import checked
    from specdec_course.paths import results_dir, scratch_dir

    parse = cli.build_parser().parse_args
    for what in ("speedup", "verifier", "gpu", "beyond", "eagle", "hf"):
        args = parse(["bench", what, "--record"])
        checked(args)
        assert args.out == str(results_dir()), what
        args = parse(["bench", what])
        checked(args)
        assert args.out == str(scratch_dir()), what
    with pytest.raises(SystemExit):  # one or the other
        parse(["bench", "speedup", "--record", "--out", "x"])


def test_bench_help_says_where_it_writes(capsys):
    for what in ("speedup", "verifier", "gpu", "beyond", "eagle", "hf"):
        with pytest.raises(SystemExit):
            cli.main(["bench", what, "--help"])
        out = "".join(capsys.readouterr().out.split())  # help wraps at a hyphen too
        assert "--record" in out and "data/results/" in out and "bench-results/" in out, what


# ----------------------------------------------------------------------------- help texts


def _parsers(parser, path=("specdec-course",)):
    """Every (sub)command's parser, with the words that reach it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_option_of_every_command_has_help_and_shows_its_default():
    for path, parser in _parsers(cli.build_parser()):
        text = " ".join(parser.format_help().split())  # a default may wrap onto a new line
        assert parser.description, f"{' '.join(path)} has no description"
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            where = f"{' '.join(path)} {action.option_strings or action.dest}"
            assert action.help, f"{where} has no help text"
            if action.default not in (None, False) and action.option_strings:
                assert f"(default: {action.default}" in text, f"{where} hides its default"


def test_bench_speedup_help_describes_the_benchmark_and_its_methods(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "speedup", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: specdec-course bench speedup")
    for words in ("round-robin", "Theorem 3.8", "draft", "ngram", "medusa", "(default: all)"):
        assert words in out
    assert "--repeats" in out and "verifier" not in out.split("options:")[0].split("\n")[0]


def test_generate_help_names_the_fastest_method_of_the_stored_bench(capsys):
    best = bench.fastest_method(bench.load_speedup_results())
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"--method {best['method']} --k {best['k']}" in out
    assert "--compare" in out and "(default: speculative for char, lookup for smollm2)" in out


def test_readme_recommends_the_method_the_stored_cpu_bench_found_fastest():
    best = bench.fastest_method(bench.load_speedup_results())
    assert not best["plain_fastest"] and best["method"] == "distilled"
    readme = " ".join((ROOT / "README.md").read_text().split())
    # The command it recommends (a command, not prose) and the figures the prose prints.
    assert f"`--method {best['method']} --k {best['k']}`" in readme
    assert_prints(readme, f"{best['speedup']:.2f}")
    # ... and what the counted n-gram and the draft model reach at best in the same bench.
    t1 = bench.load_speedup_results()["results"][0]
    for name in ("ngram", "draft", "eagle"):
        row = bench.best_row(t1, name)
        assert_prints(readme, f"{row['measured_speedup']:.2f}", str(row["k"]))
    # ... Medusa's best tree at each temperature (beside the draft model's best, whatever
    # words the prose puts between them).
    t0 = bench.load_speedup_results()["results"][1]
    med = [max(t["medusa"], key=lambda r: r["measured_speedup"]) for t in (t1, t0)]
    assert_prints(readme, *(f"{m['measured_speedup']:.2f}" for m in med))
    assert all(m["tree"] in readme for m in med)
    # ... and the recurrent draft against the draft model in the EAGLE bench's same run.
    e1 = bench.load_eagle_results()["runs"][0]
    assert e1["temperature"] == 1.0
    rec, dm = e1["methods"]["recurrent"], e1["methods"]["draft"]
    others = [e1["methods"][m]["best_speedup"] for m in ("eagle", "fused", "draft")]
    assert rec["best_speedup"] > max(others)  # the fastest of the EAGLE-style drafts
    assert_prints(readme, f"{rec['best_speedup']:.2f}", str(rec["best_k"]))
    assert_prints(readme, f"{dm['best_speedup']:.2f}", str(dm["best_k"]))
    assert [r["k"] for r in rec["rows"]] == list(range(1, 17))
    assert_prints(readme, "1", "16")
    # "at a lower cost per drafted token than the draft model's over long proposals"
    assert all(r["c"] < d["c"] for r, d in zip(rec["rows"][5:], dm["rows"][5:]))
    # "accepted at least 0.03 more often at every depth": the shipped draft's record
    from specdec_course.drafts.eagle import load_recurrent

    meta = load_recurrent(target=load_pretrained("target")).meta
    assert all(a > b + 0.03 for a, b in zip(meta["alpha_by_depth"], meta["draft_alpha_by_depth"]))
    # ... and the same with the target's steps in NumPy, in both runs (fast.numpy_steps).
    lean = bench.load_speedup_results(name="speedup_cpu_numpy")
    assert "--target-executor numpy" in lean["command"]
    n1 = lean["results"][0]
    assert n1["temperature"] == 1.0 and "medusa" not in n1
    assert_prints(readme, f"{n1['plain_token_s'] * 1e6:.0f}", f"{t1['plain_token_s'] * 1e6:.0f}")
    best = {m: bench.best_row(n1, m)["measured_speedup"] for m in ("distilled", "ngram", "draft")}
    assert_prints(readme, *(f"{v:.2f}" for v in best.values()))
    assert min(best.values()) > 1.0  # "though it still wins"


def test_data_readme_gives_the_stored_cpu_benchs_best_figures():
    # data/README.md's "Measured speedup on a CPU" names every method's best row.
    names = {
        "distilled": "the distilled n-gram",
        "ngram": "the counted n-gram",
        "draft": "the draft model",
        "eagle": "the EAGLE-style draft",
        "fused": "the fused draft",
        "recurrent": "the recurrent draft",
    }
    _, section = data_readme("Measured speedup on a CPU")
    rec = bench.load_speedup_results()
    assert f"`{rec['command']}`" in section
    for res in rec["results"]:
        for m in res["methods"]:
            assert m in names
            b = bench.best_row(res, m)
            assert_prints(section, f"{b['measured_speedup']:.2f}", str(b["k"]))
        med = max(res["medusa"], key=lambda r: r["measured_speedup"])
        assert_prints(section, f"{med['measured_speedup']:.2f}")
        assert med["tree"] in section


def test_readme_gives_the_shipped_checkpoints_figures_from_their_meta():
    readme = " ".join((ROOT / "README.md").read_text().split())
    target, draft = load_pretrained("target").meta, load_pretrained("draft").meta
    stage2 = draft["init_meta"]  # the draft after its cross-entropy stage, before 1 - alpha
    assert_prints(readme, f"{target['val_loss']:.3f}", f"{draft['val_loss']:.3f}")
    assert_prints(readme, f"{draft['alpha_vs_teacher']:.3f}", f"{stage2['alpha_vs_teacher']:.3f}")
    assert_prints(readme, f"{stage2['alpha_before_distill']:.3f}")
    assert draft["alpha_before_distill"] == stage2["alpha_vs_teacher"]  # the stages chain


# ----------------------------------------------------------------------------- generate


def test_generate_compare_times_the_method_against_plain_decoding(capsys):
    args = ["generate", "--method", "ngram", "--max-new-tokens", "20", "--compare"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out.split("-" * 60)[1]
    assert "median of 5 round-robin runs each" in out and "warm-up excluded" in out
    assert "autoregressive" in out and "chars/s" in out
    assert out.count("chars/s") == 2  # one figure per method: the warm one, not the first run
    assert "as fast as plain decoding" in out or "plain decoding is faster" in out


def test_generate_prints_one_speed_and_says_it_includes_the_warm_up(capsys):
    assert cli.main(["generate", "--method", "ngram", "--max-new-tokens", "10"]) == 0
    out = capsys.readouterr().out.split("-" * 60)[1]
    assert out.count("chars/s") == 1 and "warm-up included" in out


def test_generate_with_the_distilled_ngram(capsys):
    args = ["generate", "--method", "distilled", "--k", "7", "--max-new-tokens", "40"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out.split("-" * 60)[1]
    assert "distilled: 40 new characters" in out and "acceptance" in out


def test_train_preset_ngram_writes_a_file_that_loads(tmp_path, capsys, monkeypatch):
    # The same command path on a slice of the training text (the real one reads all of it).
    from specdec_course import data as D
    from specdec_course.drafts.distilled import DistilledNgramDraft

    ids = D.train_val_split(D.CharTokenizer().encode(D.load_corpus()))[0][:20_000]
    real = DistilledNgramDraft.from_target.__func__
    monkeypatch.setattr(
        DistilledNgramDraft, "from_target", classmethod(lambda cls, t: real(cls, t, ids=ids))
    )
    out = tmp_path / "d.npz"
    assert cli.main(["train", "--preset", "ngram", "--out", str(out)]) == 0
    assert "ngram: order 5" in capsys.readouterr().out
    back = DistilledNgramDraft.load(out, ids=ids)
    assert back.order == 5 and back.meta["trained_on"] == 20_000


def test_generate_compare_with_plain_decoding_says_there_is_nothing_to_compare(capsys):
    args = ["generate", "--method", "autoregressive", "--max-new-tokens", "5", "--compare"]
    assert cli.main(args) == 0
    assert "nothing to compare" in capsys.readouterr().out


def test_generate_with_a_huge_k_drafts_at_most_the_characters_left(capsys):
    # Noise for [max_new_tokens, k + 1, V] up front would be 14.5 GB at k = 10**6.
    assert cli.main(["generate", "--k", "1000000", "--max-new-tokens", "30"]) == 0
    assert "30 new characters" in capsys.readouterr().out
    target, draft = load_pretrained("target"), load_pretrained("draft")
    prompt = CharTokenizer(target.vocab).encode("ROMEO:")
    outs = []
    for k in (10**12, 19):  # k' = min(k, max_new_tokens - 1): the same random numbers
        g = torch.Generator().manual_seed(3)
        out, stats = speculative_generate(target, draft, prompt, 20, k=k, generator=g)
        outs.append(out)
        assert max(stats.accepted_per_iteration) <= 19
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("temperature", ["1e-320", "1e-9", "inf", "-inf", "nan", "-1"])
def test_generate_rejects_a_temperature_outside_its_range(temperature, capsys):
    assert cli.main(["generate", f"--temperature={temperature}", "--max-new-tokens", "5"]) == 2
    err = capsys.readouterr().err
    assert "temperature must be 0 (greedy) or a finite number >= 1e-06" in err
    assert "Traceback" not in err


def test_generate_accepts_the_smallest_temperature_and_greedy(capsys):
    for t in ("1e-6", "0"):
        assert cli.main(["generate", "--temperature", t, "--max-new-tokens", "5"]) == 0
    assert "nan" not in capsys.readouterr().out.lower()


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "--preset", "medusa", "--steps", "0"], "--steps must be >= 1"),
        (["train", "--preset", "medusa", "--init-from", "x.pt"], "--init-from does not apply"),
        (["train", "--preset", "medusa", "--distill-from", "x.pt"], "--distill-from does not"),
        (["train", "--preset", "ngram", "--steps", "5"], "--steps does not apply"),
        (["train", "--preset", "ngram", "--lr", "0.1"], "--lr does not apply"),
        (["bench", "speedup", "--repeats", "0"], "--repeats must be >= 1"),
        (["bench", "speedup", "--temperature", "-1"], "--temperature -1"),
        (["bench", "hf", "--temperature", "-1"], "--temperature -1"),
        (
            ["train", "--preset", "draft", "--init-from", "/tmp/x/missing.pt"],
            "--init-from /tmp/x/missing.pt: no such file; check the path",
        ),
        (["train", "--preset", "draft", "--distill-from", "nope.pt"], "--distill-from nope.pt"),
    ],
)
def test_bad_options_get_one_clear_error_and_no_work(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.ipynb").write_text("{}")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "specdec-course train --preset" not in err
    assert not any(tmp_path.glob("*.pt")) and not any(tmp_path.glob("*.csv"))


# ------------------------------------------------- generate: the stored best k, and its errors


@pytest.mark.parametrize(
    "method", ["speculative", "ngram", "distilled", "eagle", "fused", "recurrent", "medusa"]
)
def test_generate_runs_each_method_at_the_stored_best_k_and_compare_reports_its_speed(
    method, capsys, monkeypatch
):
    from specdec_course import decoding, medusa

    best = bench.stored_best(method, 1.0)
    used = {}
    for module, name in ((decoding, "speculative_generate"), (medusa, "medusa_generate")):
        real = getattr(module, name)

        def spy(*a, _real=real, **kw):
            used.setdefault("k", kw.get("k"))
            used.setdefault("tree", kw.get("tree"))
            return _real(*a, **kw)

        monkeypatch.setattr(module, name, spy)
    args = ["generate", "--method", method, "--max-new-tokens", "8", "--compare"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    if method == "medusa":  # the stored tree's paths and kind of draft, as the bench ran it
        heads = medusa.load_heads(target=load_pretrained("target"), kind="hydra")
        assert used["tree"] == bench.bench_trees(heads, 1.0)[best["tree"]][0]
        assert f"tree {best['tree']}: the fastest tree in the stored CPU bench" in out
        how = f"tree {best['tree']}"
    else:
        assert used["k"] == best["k"]
        assert f"k = {best['k']}: the fastest k for --method {method}" in out
        how = f"k = {best['k']}"
    assert best["record"] in out
    assert f"the stored CPU bench measured {best['speedup']:.2f}x at {how}" in out


def test_generate_k_overrides_the_stored_best_and_says_both(capsys):
    best = bench.stored_best("ngram", 0.0)
    k = best["k"] % 8 + 1  # another k
    args = ["generate", "--method", "ngram", "--k", str(k), "--temperature", "0"]
    assert cli.main([*args, "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert f"k = {k}: as --k gives it (the stored CPU bench's best is k = {best['k']}" in out


def test_generate_reads_the_nearest_stored_temperature_and_says_so(capsys):
    args = ["generate", "--method", "distilled", "--temperature", "0.8", "--max-new-tokens", "5"]
    assert cli.main(args) == 0
    assert "the stored temperature nearest to 0.8" in capsys.readouterr().out


def test_generate_eagle_greedy_is_the_target_s_greedy_text(capsys):
    texts = []
    for method in ("autoregressive", "eagle", "recurrent"):
        args = ["generate", "ROMEO:", "--method", method, "--temperature", "0"]
        assert cli.main([*args, "--max-new-tokens", "30"]) == 0
        texts.append(capsys.readouterr().out.split("-" * 60)[0])
    assert texts[0] == texts[1] == texts[2]


def test_stored_best_without_a_record_falls_back_to_the_default_k(capsys, monkeypatch):
    from specdec_course.cli import generate as gen

    def missing(*a, **kw):
        raise FileNotFoundError("data/results/speedup_cpu.json not found")

    monkeypatch.setattr(bench, "stored_best", missing)
    setting, why = gen.choose_setting("speculative", None, 1.0)
    assert setting["k"] == gen.DEFAULT_K and "no stored bench says better" in why


@pytest.mark.parametrize(
    "argv, words",
    [
        ([""], "the prompt is empty"),
        (["x", "--max-new-tokens", "-1"], "--max-new-tokens must be >= 0"),
        (["x" * 200, "--max-new-tokens", "100"], "shorten the prompt or lower --max-new-tokens"),
        (["x", "--k", "0"], "--k must be >= 1"),
        (["x", "--top-k", "0"], "--top-k must be >= 1"),
        (["x", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["x", "--top-p", "nan"], "--top-p must be in (0, 1]"),
        (["caf\u00e9"], "the prompt cannot be encoded: character 'é' at index 3"),
    ],
)
def test_generate_errors_speak_of_options_and_text(argv, words, capsys):
    assert cli.main(["generate", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    for api_name in ("prompt_ids", "max_new_tokens", "top_k", "top_p"):
        assert api_name not in err


def test_the_llm_record_draws_its_figure(tmp_path):
    # bench llm writes llm_cpu.png beside llm_cpu.json; drawn here from the committed record
    # (no model needed), the figure holds the call-cost curves and every best-k speedup.
    from specdec_course.bench import llm_race

    record = llm_race.load_llm_results()
    fig = llm_race.plot_llm(record)
    left, right = fig.axes
    assert len(left.lines) == 2 and len(right.patches) == len(record["best"])
    png = llm_race.save_llm_plot(record, tmp_path / "llm_cpu.json")
    assert png.endswith("llm_cpu.png") and (tmp_path / "llm_cpu.png").stat().st_size > 10_000
