"""Paired probe: the shipped one-layer draft's step in NumPy (the default on a CPU) against
the same folded step as tensor ops.

    python tools/probe_draft_step.py

Two measurements, each alternating the two executors round by round (the order flipped every
round) so that a drifting machine affects both alike, medians over the rounds:

1. the step alone, 200 steps from context 50, in a tight loop (warm caches);
2. the draft model's speculative run (4 validation prompts, 200 new characters, k = 5,
   temperature 1, fixed seeds): the draft's in-loop time per drafted token and the run's
   wall time and the loop's time split per iteration, which include the cold caches after
   each target call.

It also checks that both executors give the same ids. Figures move with the machine's state
(README, "Which method on a CPU"); quote them with the date they were taken.
"""

from __future__ import annotations

import statistics
import time

import torch

from specdec_course import decoding, devices
from specdec_course.bench.speedup import validation_prompts
from specdec_course.data import CharTokenizer
from specdec_course.fast import draft_step
from specdec_course.model import load_pretrained

ROUNDS = 20


def _order(r: int) -> tuple[str, str]:
    return ("tensor", "numpy") if r % 2 else ("numpy", "tensor")


def main() -> None:
    torch.set_num_threads(1)
    target, draft = load_pretrained("target").eval(), load_pretrained("draft").eval()
    folded = draft_step(draft)
    host = folded.np_step
    if host is None:
        raise SystemExit("this draft has no NumPy step here (a CPU float32/float64 draft needed)")
    x = torch.randint(draft.config.vocab_size, (256,), generator=torch.Generator().manual_seed(0))
    logits = torch.empty(1, draft.config.vocab_size)
    prompts = validation_prompts(CharTokenizer())
    step = {"numpy": [], "tensor": []}
    run = {"numpy": [], "tensor": []}
    per_draft = {"numpy": [], "tensor": []}
    split = {"numpy": [], "tensor": []}  # per iteration: seconds by part of the loop
    ids = {}
    try:
        with torch.inference_mode(), devices.native_cpu_kernels():
            for r in range(ROUNDS):
                for name in _order(r):
                    folded.np_step = host if name == "numpy" else None
                    cache = folded.new_cache()
                    folded.feed(x[:50], cache)
                    t0 = time.perf_counter()
                    for i in range(50, 250):
                        folded.step(x[i : i + 1], cache, logits)
                    step[name].append((time.perf_counter() - t0) / 200)
            for r in range(ROUNDS // 2):
                for name in _order(r):
                    folded.np_step = host if name == "numpy" else None
                    drafting = drafted = iterations = 0.0
                    parts = dict.fromkeys(("prefill", "draft", "target", "verify", "rest"), 0.0)
                    outs = []
                    t0 = time.perf_counter()
                    for i, prompt in enumerate(prompts):
                        out, stats = decoding.speculative_generate(
                            target, draft, prompt, 200, k=5, temperature=1.0,
                            generator=torch.Generator().manual_seed(i), timings=True,
                        )  # fmt: skip
                        drafting += stats.seconds["draft"]
                        drafted += stats.drafted
                        iterations += stats.iterations
                        for key in parts:
                            parts[key] += stats.seconds[key]
                        outs.append(out)
                    run[name].append(time.perf_counter() - t0)
                    per_draft[name].append(drafting / drafted)
                    split[name].append({key: v / iterations for key, v in parts.items()})
                    ids.setdefault(name, outs)
    finally:
        folded.np_step = host
    same = all(torch.equal(a, b) for a, b in zip(ids["numpy"], ids["tensor"]))

    def med(d, name, scale=1e6):
        return statistics.median(d[name]) * scale

    print(f"step alone:     tensor {med(step, 'tensor'):.1f} us, numpy {med(step, 'numpy'):.1f} us"
          f"  -> {med(step, 'numpy') / med(step, 'tensor'):.2f}")  # fmt: skip
    print(f"in the loop:    tensor {med(per_draft, 'tensor'):.1f} us, numpy "
          f"{med(per_draft, 'numpy'):.1f} us per drafted token"
          f"  -> {med(per_draft, 'numpy') / med(per_draft, 'tensor'):.2f}")  # fmt: skip
    print(
        f"the whole run:  tensor {med(run, 'tensor', 1e3):.1f} ms, numpy "
        f"{med(run, 'numpy', 1e3):.1f} ms  -> {med(run, 'numpy') / med(run, 'tensor'):.3f}"
    )
    for name in ("tensor", "numpy"):
        parts = {key: statistics.median(s[key] for s in split[name]) for key in split[name][0]}
        print(f"per iteration, {name}: " + ", ".join(f"{k} {v * 1e6:.0f}" for k, v in parts.items())
              + " us")  # fmt: skip
    print(f"same ids: {same}")


if __name__ == "__main__":
    main()
