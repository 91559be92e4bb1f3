"""Is k="auto" never slower than plain decoding here? Plain, fixed best k and auto, paired.

    python tools/auto_k_table.py            # quiet, then with burners on 1.5 cores beside it
    AUTO_K_TOKENS=96 AUTO_K_ROUNDS=3 python tools/auto_k_table.py
    AUTO_K_BURNERS=1.5 python tools/auto_k_table.py   # one condition only: burners on 1.5 cores

The real model (SmolLM2-135M-Instruct, float32, one thread), greedy, ``AUTO_K_TOKENS`` (64)
new tokens on the first grounded prompt (copyable) and the first chat prompt
(``llm.prompts.PROMPT_SETS``), for each proposer of ``llm.proposers``: plain
``decoding.generate``, ``speculative_generate`` at the fixed k the shipped record found best
for that set and proposer (``data/results/llm_cpu.json``'s ``best``), and at ``k="auto"``.
Paired: each arm runs beside a plain run of its own on the same prompt (plain first in even
rounds, second in odd ones, so a drift in the load hits both sides of a pair alike), and its
speedup is its pairs' plain seconds over its own; ``AUTO_K_ROUNDS`` (2) rounds. The
proposers are built once, so from the second run on k="auto" starts from what it measured
before (the first run includes its learning). Then the same with CPU burners taking 1.5
cores (a busy loop ``python -c 'while 1: pass'`` and one busy half of every 20 ms) in other
processes, started here and stopped at the end. Prints, per condition, set and proposer:
tokens/s of each arm (total tokens over total wall seconds), tokens per target call, the
speedup over plain, and whether the text equals plain's; with the load average at start and
end. Takes about 4 minutes per condition on a quiet 2-core CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

from specdec_course import decoding, llm
from specdec_course.decoding.threads import fit_threads
from specdec_course.llm.prompts import PROMPT_SETS
from specdec_course.paths import results_dir

TOKENS = int(os.environ.get("AUTO_K_TOKENS", "64"))
ROUNDS = int(os.environ.get("AUTO_K_ROUNDS", "2"))
SETS = ("grounded", "chat")
BURNERS = [float(b) for b in os.environ.get("AUTO_K_BURNERS", "0,1.5").split(",")]
# A burner's busy loop; a fractional one is busy that share of every 20 ms and sleeps the rest.
BUSY = "while 1: pass"
PART = (
    "import time\nwhile 1:\n t = time.perf_counter() + {:.4f}\n"
    " while time.perf_counter() < t: pass\n time.sleep({:.4f})"
)


def burners(n: float) -> list:
    """Processes that take ``n`` cores: ``int(n)`` busy loops and one busy ``n % 1`` of the time."""
    codes = [BUSY] * int(n)
    if n % 1:
        codes.append(PART.format(0.02 * (n % 1), 0.02 * (1 - n % 1)))
    return [subprocess.Popen([sys.executable, "-c", code]) for code in codes]


def best_ks() -> dict:
    with open(results_dir() / "llm_cpu.json") as f:
        record = json.load(f)
    return {(r["set"], r["proposer"]): r["k"] for r in record["best"] if r["temperature"] == 0}


def _plain(model, ids) -> tuple[torch.Tensor, float]:
    t0 = time.perf_counter()
    out = decoding.generate(model, ids, TOKENS, temperature=0)
    return out, time.perf_counter() - t0


def table(model, tok, proposers, ks) -> list[dict]:
    cells: dict = {}
    for r in range(ROUNDS):
        for set_name in SETS:
            text = PROMPT_SETS[set_name][0]
            ids = torch.tensor(tok.apply_chat_template([{"role": "user", "content": text}]))
            ref, _ = _plain(model, ids)
            for name, prop in proposers.items():
                for k in (ks[set_name, name], "auto"):
                    # Each arm is paired with a plain run next to it, plain first in even
                    # rounds and second in odd ones, so a drift in the load hits both sides
                    # of a pair alike whichever way it goes.
                    c = cells.setdefault(
                        (set_name, name, k), dict(s=0.0, plain_s=0.0, calls=0, same=True)
                    )
                    if r % 2 == 0:
                        again, c_plain = _plain(model, ids)
                    t0 = time.perf_counter()
                    out, st = decoding.speculative_generate(
                        model, prop, ids, TOKENS, k=k, temperature=0
                    )
                    c["s"] += time.perf_counter() - t0
                    if r % 2 == 1:
                        again, c_plain = _plain(model, ids)
                    c["plain_s"] += c_plain
                    c["calls"] += st.target_calls
                    c["same"] &= bool(torch.equal(out, ref) and torch.equal(again, ref))
    n = TOKENS * ROUNDS
    rows = []
    for set_name in SETS:
        plain_s = sum(c["plain_s"] for (s_, _, _), c in cells.items() if s_ == set_name)
        pairs = sum(1 for (s_, _, _) in cells if s_ == set_name)
        rows.append(dict(set=set_name, arm="plain", tok_s=n * pairs / plain_s,
                         tokens_per_call=1.0, speedup=1.0, identical=True))  # fmt: skip
        for (s_, name, k), c in cells.items():
            if s_ == set_name:
                rows.append(dict(set=set_name, arm=f"{name} k={k}", tok_s=n / c["s"],
                                 tokens_per_call=n / c["calls"], speedup=c["plain_s"] / c["s"],
                                 identical=c["same"]))  # fmt: skip
    return rows


def show(title: str, rows: list[dict], load: tuple) -> None:
    print(f"\n{title} (load average {load[0]:.2f} at start, {load[1]:.2f} at end)")
    print(f"{'set':9s} {'arm':26s} {'tok/s':>6s} {'tok/call':>8s} {'x plain':>7s} identical")
    for r in rows:
        print(
            f"{r['set']:9s} {r['arm']:26s} {r['tok_s']:6.1f} {r['tokens_per_call']:8.2f} "
            f"{r['speedup']:7.2f} {r['identical']}"
        )


def main() -> None:
    _, why = fit_threads()
    print(
        f"threads: {why}; {TOKENS} tokens, greedy, {ROUNDS} rounds, wall clock; the CPU is "
        "shared with other work: these are one run's figures"
    )
    model, tok = llm.load(torch.float32)
    proposers = llm.proposers(model)
    ks = best_ks()
    for n_burn in BURNERS:
        procs = burners(n_burn)
        try:
            start = os.getloadavg()[0]
            rows = table(model, tok, proposers, ks)
            show(f"CPU burners taking {n_burn:g} core(s)", rows, (start, os.getloadavg()[0]))
        finally:
            for p in procs:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
