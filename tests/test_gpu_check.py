"""The GPU check's dry run: ``tools/gpu_check.sh --dry`` on the CPU, so that it cannot rot.

The dry run takes every step of the real check (the `gpu` tests, skipped here; the verifier
sweep under the Triton interpreter at tiny sizes; the speedup benchmark for a few tokens;
the summary and its records), in about half a minute on two cores.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def test_dry_gpu_check_runs_every_step_and_writes_its_records(tmp_path):
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    )
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_check.sh"), "--dry"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "GPU check on cpu-dry" in out and "GPU check finished" in out
    written = [Path(p) for p in re.findall(r"^wrote (.+)$", out, flags=re.M)]
    kinds = {p.name.split("-cpu-dry-")[0] + p.suffix for p in written}
    assert kinds == {
        "verifier.json", "verifier.csv", "verifier.png",
        "speedup.json", "speedup.png", "gpu_check.json",
    }  # fmt: skip
    assert all(p.is_file() for p in written)
    # Dry records never land where lessons look for GPU results.
    assert all("data/results" not in str(p) for p in written)

    from specdec_course import bench

    folder = written[0].parent
    summary = bench.load_gpu_check(folder)
    assert summary["dry"] and summary["verifier_reaches_goal"] is None
    cases, meta = bench.load_verifier_results(folder)
    assert {(c.B, c.K, c.V) for c in cases} == {
        (b, k, v) for b in (1, 3) for k in (1, 2) for v in (65, 300)
    }
    speed = bench.load_gpu_speedup_results(folder)
    assert set(speed["results"][0]["methods"]) == {"draft", "ngram", "distilled"}
    assert speed["results"][0]["medusa"]
    assert json.loads(written[-1].read_text())["files"] == [str(p) for p in written]
    report = bench.gpu_speedup_report(("draft", "ngram", "medusa"), folder)
    assert "best at temperature 1.0: draft x" in report and "medusa x" in report
    assert bench.gpu_speedup_report(directory=tmp_path) == bench.gpu.NO_GPU_RECORD


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a CPU machine")
def test_gpu_check_without_a_gpu_says_to_run_it_dry():
    from specdec_course import bench

    with pytest.raises(ValueError, match="bench gpu --dry"):
        bench.run_gpu_check()
