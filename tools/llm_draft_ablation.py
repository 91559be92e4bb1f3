"""Would EAGLE's attention, or EAGLE-3's fused features, make the real model's draft better?

    python tools/llm_draft_ablation.py   # needs [llm], [hf] and tools/llm_distill.py's data

The shipped draft (``llm.draft.FeatureDraft``) reads only the target's last feature f_t and
the token after it. Two changes the field makes were left out of it; this trains three
drafts side by side on the same self-distilled answers, with the same sampler, steps and
seed, and compares their acceptance on held-out answers:

- ``last_feature``: the shipped design;
- ``attention``: plus one attention layer over the committed context, as EAGLE's decoder
  layer has (4 heads of 64; keys from (f_{s-1}, x_s), values from (f_s, x_{s+1}) for every
  committed s <= t, so a head can look up what followed an earlier occurrence of the token
  just committed; a learnt linear recency bias per head and a null key);
- ``fused_layers``: EAGLE-3's input: the residual stream after blocks 3, 15 and 27 (each
  RMS-normalised without weights) and f_t, projected to one feature (started as f_t alone).

Data: the first ``BATCHES`` files of ``bench-results/llm_distill`` (``llm.distill.make_data``;
the first 64 answers held out); the blocks' features come from one teacher-forced forward of
each answer through Hugging Face's ``LlamaForCausalLM`` on the same weights. Writes
``data/results/llm_draft_ablation.json`` (each variant's parameters, held-out alpha by depth
and seconds). Measured on the course's 2-core CPU: about 30 minutes.
"""

from __future__ import annotations

import glob
import json
import math
import os
import time
from datetime import date

import torch
import torch.nn as nn
import torch.nn.functional as F

from specdec_course.llm import distill
from specdec_course.llm.draft import FeatureDraft
from specdec_course.llm.loading import load
from specdec_course.paths import REPO_ROOT, results_dir

DATA = REPO_ROOT / "bench-results" / "llm_distill"
BATCHES, VAL, STEPS, DEPTH, VOCAB, HIDDEN = 32, 64, 1500, 4, 4096, 1024
SEQS_PER_STEP, STARTS_PER_SEQ, HEADS, HEAD_DIM, BLOCKS = 8, 32, 4, 64, (3, 15, 27)
VARIANTS = {"last_feature": {}, "attention": {"heads": HEADS}, "fused_layers": {"fused": True}}


class AblationDraft(FeatureDraft):
    """``FeatureDraft`` with, optionally, attention over the committed context and a fused
    multi-block input."""

    def __init__(self, embed, vocab_ids, hidden, heads=0, fused=False):
        super().__init__(embed, vocab_ids, hidden)
        d = embed.shape[1]
        self.heads, self.fused = heads, fused
        if heads:
            self.anorm = nn.RMSNorm(d, eps=1e-5)
            self.wq = nn.Linear(d, heads * HEAD_DIM, bias=False)
            self.wk = nn.Linear(2 * d, heads * HEAD_DIM, bias=False)
            self.wv = nn.Linear(2 * d, heads * HEAD_DIM, bias=False)
            self.wo = nn.Linear(heads * HEAD_DIM, d, bias=False)
            self.slope = nn.Parameter(torch.zeros(heads))
        if fused:
            self.fuse = nn.Linear((len(BLOCKS) + 1) * d, d, bias=False)

    def init_from_target(self) -> None:
        super().init_from_target()  # "the next feature is this one"
        d = self.fc.out_features
        with torch.no_grad():
            if self.heads:
                self.wo.weight.zero_()
            if self.fused:
                self.fuse.weight.zero_()
                self.fuse.weight[:, -d:].copy_(torch.eye(d))

    def keys(self, f_prev, x_cur, f_cur, x_next):
        def emb(x):
            return F.embedding(x, self.embed)

        K = self.wk(torch.cat([f_prev, emb(x_cur)], -1))
        V = self.wv(torch.cat([f_cur, emb(x_next)], -1))
        shape = K.shape[:-1] + (self.heads, HEAD_DIM)
        return K.view(shape), V.view(shape)

    def forward(self, f, x, kv=None):
        # f, x: [B, Q, d], [B, Q]; kv: (K, V [B, S, H, e], allowed [B, Q, S], distance [B, Q, S])
        h = self.fc(torch.cat([f, F.embedding(x, self.embed)], -1))
        if self.heads:
            K, V, allowed, dist = kv
            q = self.wq(self.anorm(h)).view(h.shape[:-1] + (self.heads, HEAD_DIM))
            s = torch.einsum("bqhe,bshe->bhqs", q, K) / math.sqrt(HEAD_DIM)
            s = s - self.slope.view(1, -1, 1, 1) * dist.unsqueeze(1)
            s = s.masked_fill(~allowed.unsqueeze(1), float("-inf"))
            s = torch.cat([s, torch.zeros_like(s[..., :1])], -1)  # a null key
            p = torch.softmax(s, -1)[..., :-1]
            h = h + self.wo(torch.einsum("bhqs,bshe->bqhe", p, V).flatten(-2))
        n = self.norm(h)
        h = h + self.down(F.silu(self.gate(n)) * self.up(n))
        return h, self.head(h)


def block_features(seqs):
    """For each answer ``(ids, f, _)``: the residual stream after each of ``BLOCKS``,
    RMS-normalised, and ``f``, concatenated (bfloat16), from one forward of ``ids[:-1]``."""
    hf = distill.hf_model(torch.float32)
    out = []
    with torch.inference_mode():
        for ids, f, _ in seqs:
            hs = hf(ids[None, :-1], output_hidden_states=True).hidden_states
            parts = [F.rms_norm(hs[b][0], (f.shape[1],), eps=1e-5) for b in BLOCKS]
            out.append(torch.cat(parts + [f], -1).to(torch.bfloat16))
    return out


def windows(draft, seqs, teach, multi, idx, starts_per_seq, g):
    """Per-depth inputs and targets for ``starts_per_seq`` random starts t in each answer of
    ``idx`` (t >= 1: at least one committed key), and the attention's keys."""
    B, S = len(idx), max(len(seqs[i][0]) for i in idx) - 2
    d = seqs[idx[0]][1].shape[1]
    T = torch.stack(
        [torch.randint(1, len(seqs[i][0]) - 1 - DEPTH, (starts_per_seq,), generator=g) for i in idx]
    )
    kv = None
    if draft.heads:
        fp, fc = torch.zeros(B, S, d), torch.zeros(B, S, d)
        xc, xn = torch.zeros(B, S, dtype=torch.long), torch.zeros(B, S, dtype=torch.long)
        for b, i in enumerate(idx):
            ids, f, _ = seqs[i]
            L = len(ids)
            fp[b, : L - 2], fc[b, : L - 2] = f[: L - 2], f[1 : L - 1]
            xc[b, : L - 2], xn[b, : L - 2] = ids[1 : L - 1], ids[2:L]
        j = torch.arange(S).view(1, 1, -1)  # key j belongs to s = j + 1
        allowed = j <= (T - 1).unsqueeze(-1)
        dist = (T.unsqueeze(-1) - 1 - j).clamp(min=0).float()
        kv = (*draft.keys(fp, xc, fc, xn), allowed, dist)
    if draft.fused:
        f0 = draft.fuse(torch.stack([multi[i][T[b]] for b, i in enumerate(idx)]).float())
    else:
        f0 = torch.stack([seqs[i][1][T[b]] for b, i in enumerate(idx)])

    def at(dd, which):
        if which == "x":
            return torch.stack([seqs[i][0][T[b] + dd + 1] for b, i in enumerate(idx)])
        if which == "f":
            return torch.stack([seqs[i][1][T[b] + dd + 1] for b, i in enumerate(idx)])
        return torch.stack([teach[i][T[b] + dd + 1] for b, i in enumerate(idx)]).float()

    return f0, kv, at


def loss_and_alpha(draft, seqs, teach, multi, idx, starts_per_seq, g, decay=0.9):
    """``llm.distill.unrolled_loss`` over these windows: ``distill.depth_loss`` per depth,
    weighted ``decay ** depth``."""
    f, kv, at = windows(draft, seqs, teach, multi, idx, starts_per_seq, g)
    loss, alphas = 0.0, []
    for dd in range(DEPTH):
        h, logits = draft(f, at(dd, "x"), kv)
        term, alpha = distill.depth_loss(h, logits, at(dd, "p"), at(dd, "f"))
        loss = loss + decay**dd * term
        alphas.append(alpha)
        f = h
    return loss, alphas


def train_variant(embed, vocab_ids, seqs, teach, multi, **kw):
    torch.manual_seed(0)
    draft = AblationDraft(embed, vocab_ids, HIDDEN, **kw)
    draft.init_from_target()
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=STEPS, pct_start=0.05)
    g, t0 = torch.Generator().manual_seed(0), time.perf_counter()
    for _ in range(STEPS):
        idx = (VAL + torch.randint(len(seqs) - VAL, (SEQS_PER_STEP,), generator=g)).tolist()
        loss, _ = loss_and_alpha(draft, seqs, teach, multi, idx, STARTS_PER_SEQ, g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    seconds = time.perf_counter() - t0
    gv, val = torch.Generator().manual_seed(1), []
    with torch.no_grad():
        for c in range(0, VAL, 8):
            val.append(loss_and_alpha(draft, seqs, teach, multi, list(range(c, c + 8)), 32, gv)[1])
    alpha = [round(sum(a[d] for a in val) / len(val), 4) for d in range(DEPTH)]
    n_params = sum(p.numel() for p in params)
    print(f"  held-out alpha by depth {alpha}, {n_params:,} parameters, {seconds:.0f}s")
    return {"params": n_params, "val_alpha": alpha, "train_seconds": round(seconds)}


def main() -> None:
    torch.set_num_threads(2)
    files = sorted(glob.glob(os.path.join(DATA, "batch*.pt")))[:BATCHES]
    if len(files) < BATCHES:
        raise SystemExit(f"needs {BATCHES} batch files in {DATA}: run tools/llm_distill.py")
    seqs = []
    for path in files:
        seqs += distill._load_sequences_of(path)
    model, _ = load(torch.float32)
    embed = model.tok_embeddings.weight.detach()
    counts = torch.zeros(embed.shape[0])
    for ids, _, prompt_len in seqs[VAL:]:
        counts += torch.bincount(ids[prompt_len:], minlength=embed.shape[0]).float()
    vocab_ids = torch.sort(torch.topk(counts, VOCAB).indices).values
    lens = [len(s[1]) for s in seqs]
    teach = list(
        torch.split(distill._teacher(torch.cat([s[1] for s in seqs]), embed, vocab_ids), lens)
    )
    t0 = time.perf_counter()
    multi = block_features(seqs)
    print(f"{len(seqs)} answers; block features in {time.perf_counter() - t0:.0f}s")
    variants = {}
    for name, kw in VARIANTS.items():
        print(name)
        variants[name] = train_variant(embed, vocab_ids, seqs, teach, multi, **kw)
    record = {
        "command": "python tools/llm_draft_ablation.py",
        "date": date.today().isoformat(),
        "data": f"the first {BATCHES} batch files of llm.distill.make_data ({len(seqs)} "
        f"answers, the first {VAL} held out)",
        "steps": STEPS,
        "windows_per_step": SEQS_PER_STEP * STARTS_PER_SEQ,
        "depth": DEPTH,
        "blocks": list(BLOCKS),
        "variants": variants,
    }
    out = results_dir() / "llm_draft_ablation.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
