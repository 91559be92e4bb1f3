"""Does the EAGLE-style draft gain from the target's lower layers (EAGLE-3's feature fusion)?

    python tools/eagle_fusion_probe.py LAYERS STEPS
    python tools/eagle_fusion_probe.py -1 1500          # the top feature only, as shipped
    python tools/eagle_fusion_probe.py 0,1,2,-1 1500    # blocks 1-3's outputs and the top

Trains a fresh ``EagleDraft`` for STEPS steps (32 windows x 128 positions, training-time
test two drafts deep, KL + feature regression, EAGLE's feature noise 0.1, one thread) on
the target's features from the listed layers (block outputs by index, -1 the top feature
after the final LayerNorm; more than one are fused by a linear layer into the draft's input
width, and later drafts read the draft's own output, as EAGLE-3 does), then prints the
acceptance sum(min(p, q)) at temperature 1 by draft position on 16 validation windows.
Both arms see the same windows in the same order. A probe, not the shipped training
(``specdec-course train --preset eagle``): it says whether fusion is worth building.
"""

import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from specdec_course import data as D
from specdec_course.data import eval_windows
from specdec_course.drafts.eagle import EagleDraft
from specdec_course.drafts.eagle.eagle_training import unrolled_features
from specdec_course.model import load_pretrained

torch.set_num_threads(1)
torch.manual_seed(0)
t = load_pretrained("target").eval()
tok = D.CharTokenizer(t.vocab)
tr, va = D.corpus_split(tok)
LAYERS = [
    int(v) for v in sys.argv[1].split(",")
]  # block outputs to fuse (0-based), -1 = top (ln_f)
STEPS = int(sys.argv[2])


@torch.inference_mode()
def feats(ids, n):
    x, _ = eval_windows(ids, t.config.block_size, n)
    outs = []
    for i in range(0, len(x), 32):
        xb = x[i : i + 32]
        h = t.transformer.wte(xb) + t.transformer.wpe.weight[: xb.shape[1]]
        hs = []
        for blk in t.transformer.h:
            h = blk(h)
            hs.append(h)
        top = t.transformer.ln_f(h)
        outs.append(torch.cat([top if l == -1 else hs[l] for l in LAYERS], -1))
    return torch.cat(outs), x


f_tr, x_tr = feats(tr, 1500)
f_va, x_va = feats(va, 16)
f_tr = f_tr.clone()
C = t.config.n_embd
top_tr = f_tr[..., LAYERS.index(-1) * C : (LAYERS.index(-1) + 1) * C] if -1 in LAYERS else None
with torch.inference_mode():
    ft_va = t.hidden_states(x_va)
with torch.inference_mode():
    ft_tr_all = torch.cat([t.hidden_states(x_tr[i : i + 32]) for i in range(0, len(x_tr), 32)])
ft_tr_all = ft_tr_all.clone()
d = EagleDraft.from_target(t)
fuse = nn.Linear(len(LAYERS) * C, C) if LAYERS != [-1] else None
params = list(d.parameters()) + (list(fuse.parameters()) if fuse else [])
params = [p for p in params if p.requires_grad]
opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.99))
g = torch.Generator().manual_seed(0)
depth = 2
t0 = time.time()
for step in range(STEPS):
    lr = (
        3e-3
        * min(1, (step + 1) / 50)
        * (0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(step / STEPS * 3.14159)).item()))
    )
    for pg in opt.param_groups:
        pg["lr"] = lr
    w = torch.randint(len(x_tr), (32,), generator=g)
    s = int(torch.randint(256 - 128 + 1, (1,), generator=g))
    fm, xx, goal_f = f_tr[w, s : s + 128], x_tr[w, s : s + 128], ft_tr_all[w, s : s + 128]
    fm = fm + (2 * torch.rand(fm.shape, generator=g) - 1) * 0.1
    fin = fuse(fm) if fuse else fm
    outs = unrolled_features(d, fin, xx, depth, s)
    goal = goal_f[:, 1:]
    lp = d.logits(goal).log_softmax(-1)
    loss = 0
    for k, fh in enumerate(outs):
        reg = F.smooth_l1_loss(fh[:, k:], goal[:, k:])
        lq = d.logits(fh[:, k:]).log_softmax(-1)
        kl = (lp[:, k:].exp() * (lp[:, k:] - lq)).sum(-1).mean()
        loss = loss + 0.8**k * (reg + kl)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
with torch.inference_mode():
    fin = fuse(f_va) if fuse else f_va
    outs = unrolled_features(d, fin, x_va, 4)
    p = d.logits(ft_va[:, 1:]).double().softmax(-1)
    res = [
        float(p[:, k:].minimum(d.logits(fh[:, k:]).double().softmax(-1)).sum(-1).mean())
        for k, fh in enumerate(outs)
    ]
print(
    LAYERS,
    STEPS,
    "alpha by depth",
    [round(r, 4) for r in res],
    f"{time.time() - t0:.0f}s",
    flush=True,
)
