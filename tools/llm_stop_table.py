"""Does the feature draft's confidence stop pay on this machine? Its thresholds, paired.

    python tools/llm_stop_table.py            # 64 tokens, 2 rounds, chat and code prompts
    STOP_TOKENS=32 STOP_ROUNDS=1 python tools/llm_stop_table.py

SmolLM2-135M-Instruct (float32, one thread), greedy, on every chat and code prompt of
``llm.prompts.PROMPT_SETS``: plain ``decoding.generate`` and ``speculative_generate`` with the
shipped feature draft at ``stop_below`` 0.1, 0.03 and None (no stop), each at ``k="auto"``
and at k = 3, interleaved per prompt; every speculative text is checked equal to plain's.
Prints, per set and arm, the speedup over plain (total thread CPU time, which leaves out
the time a busy machine gives to other work) and tokens per target call. This is how
``llm.STOP_BELOW`` was chosen; one run's figures.
"""

from __future__ import annotations

import os
import time

import torch

from specdec_course import decoding, llm
from specdec_course.llm.draft import FeatureDraftProposer
from specdec_course.llm.prompts import PROMPT_SETS

TOKENS = int(os.environ.get("STOP_TOKENS", "64"))
ROUNDS = int(os.environ.get("STOP_ROUNDS", "2"))


def main() -> None:
    torch.set_num_threads(1)
    model, tok = llm.load(torch.float32)
    draft = llm.proposers(model)["feature_draft"].draft
    arms = {sb: FeatureDraftProposer(model, draft, stop_below=sb) for sb in (0.1, 0.03, None)}
    res: dict = {}

    def add(key, seconds, calls):
        r = res.setdefault(key, [0.0, 0])
        r[0] += seconds
        r[1] += calls

    for _ in range(ROUNDS):
        for set_name in ("chat", "code"):
            for text in PROMPT_SETS[set_name]:
                ids = torch.tensor(tok.apply_chat_template([{"role": "user", "content": text}]))
                t0 = time.thread_time()
                ref = decoding.generate(model, ids, TOKENS, temperature=0)
                add((set_name, "plain", "-"), time.thread_time() - t0, TOKENS)
                for stop, prop in arms.items():
                    for k in ("auto", 3):
                        t0 = time.thread_time()
                        out, st = decoding.speculative_generate(
                            model, prop, ids, TOKENS, k=k, temperature=0
                        )
                        add((set_name, f"stop_below={stop}", k), time.thread_time() - t0,
                            st.target_calls)  # fmt: skip
                        assert torch.equal(out, ref), "greedy text differs from plain's"
    print(f"{TOKENS} tokens, greedy, {ROUNDS} rounds, 1 thread, thread CPU time")
    for key, (s, calls) in res.items():
        plain_s, plain_calls = res[key[0], "plain", "-"]
        print(f"{key[0]:5s} {key[1]:18s} k={key[2]!s:5s} {plain_s / s:5.2f}x plain, "
              f"{plain_calls / calls:4.2f} tokens per call")  # fmt: skip


if __name__ == "__main__":
    main()
