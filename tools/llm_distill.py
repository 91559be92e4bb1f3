"""Retrain the real model's feature draft (data/checkpoints/smollm2_draft.pt) from scratch.

    python tools/llm_distill.py     # needs the [llm] and [hf] extras; resumes its data

Stage 1 writes the target's own answers and features to bench-results/llm_distill/
(``llm.distill.make_data``: 42 batches of 32 answers, up to 160 new tokens each, as the
shipped draft had; about 35 minutes on one core of a 2-core CPU). Stage 2 trains the draft
(``llm.distill.train``, 2,000 steps of 256 unrolled windows; about 15 minutes) and saves it
with its record. The settings are the shipped draft's; change them here.
"""

from __future__ import annotations

import torch

from specdec_course.llm import distill
from specdec_course.llm.draft import CHECKPOINT, save_draft
from specdec_course.paths import REPO_ROOT, checkpoints_dir

DATA = REPO_ROOT / "bench-results" / "llm_distill"
SETTINGS = dict(vocab=4096, hidden=1024, depth=4, steps=2000, batch=256, lr=1e-3)


def main() -> None:
    torch.set_num_threads(1)
    distill.make_data(DATA, batch=32, new_tokens=160, n_batches=42)
    out = checkpoints_dir() / CHECKPOINT
    distill.train(DATA, **SETTINGS, checkpoint=lambda d, r: save_draft(out, d, r))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
