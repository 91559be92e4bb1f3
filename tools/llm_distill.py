"""Retrain the real model's feature draft (data/checkpoints/smollm2_draft.pt) from scratch.

    python tools/llm_distill.py     # needs the [llm] and [hf] extras; resumes its data

Stage 1 writes the target's own answers and features to bench-results/llm_distill/
(``llm.distill.make_data``: 78 batches of 32 answers, up to 160 new tokens each, as the
shipped draft had: the first round's 42 batches, then 36 of the second round's open
questions and code tasks; about a minute a batch on one core of a 2-core CPU). Stage 2 trains
the draft (``llm.distill.train``, 3,000 steps of 256 unrolled windows; about 20 minutes) and
saves it with its record (the checkpoint's ``train_seconds``). The settings are the shipped
draft's; change them here.
"""

from __future__ import annotations

import torch

from specdec_course.llm import distill
from specdec_course.llm.draft import CHECKPOINT, save_draft
from specdec_course.paths import REPO_ROOT, checkpoints_dir

DATA = REPO_ROOT / "bench-results" / "llm_distill"
SETTINGS = dict(vocab=4096, hidden=1024, depth=4, steps=3000, batch=256, lr=1e-3)


def main() -> None:
    torch.set_num_threads(1)
    distill.make_data(DATA, batch=32, new_tokens=160, n_batches=78)
    out = checkpoints_dir() / CHECKPOINT
    data = (
        "78 batches of 32 answers (half greedy, half sampled at T=1), up to 160 new tokens "
        "each: 42 of the first round of prompts, 36 of the second"
    )
    distill.train(DATA, **SETTINGS, checkpoint=lambda d, r: save_draft(out, d, dict(r, data=data)))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
