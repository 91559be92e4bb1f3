"""The `specdec-course` command: generate and bench speedup, driven through `cli.main`."""

import json

import pytest

from specdec_course import bench, cli, theory
from specdec_course.data import CharTokenizer
from specdec_course.model import load_pretrained


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
        # The cost-aware prediction prices the target call and the drafts as measured.
        tokens = theory.expected_tokens(r["alpha"], r["k"])
        cost = r["k"] * r["draft_token_s"] + r["target_call_s"]
        assert r["cost_aware_speedup"] == pytest.approx(tokens * res["plain_token_s"] / cost)
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
    assert res["temperature"] == 0.0 and set(res["methods"]) == {"draft", "ngram"}
    for rows in res["methods"].values():
        assert [r["k"] for r in rows] == [1, 2, 3, 4]
        for r in rows:
            assert 0 < r["alpha"] <= 1 and r["tokens_per_target_call"] >= 1
            assert set(r["split_s"]) == {"draft", "target", "verify", "rest"}
            assert r["measured_over_cost_aware"] == r["measured_speedup"] / r["cost_aware_speedup"]
    assert [r["tree"] for r in res["medusa"]] == ["chain", "small", "large"]
    assert (tmp_path / "speedup_cpu.png").stat().st_size > 10_000
    assert "cost of one cached forward" in capsys.readouterr().out
