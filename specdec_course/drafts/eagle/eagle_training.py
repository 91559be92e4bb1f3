"""Training the EAGLE-style draft on the frozen target, measuring it, and its checkpoint.

EAGLE-1: the target's features over fixed training windows are computed once
(:func:`collect_features`); each step then takes random windows and minimises
``SmoothL1(f_hat, f) + 0.1 * CE(lm_head(f_hat), next token)`` (:func:`eagle_loss`).
``specdec-course train --preset eagle`` (:func:`train_shipped_eagle`) writes
``data/checkpoints/eagle.pt``; :func:`load_eagle` reads it.

The shipped draft trains on more than EAGLE-1's loss (:func:`eagle_loss`, kept for the
lesson): :func:`unrolled_loss` runs the draft as it drafts, several tokens deep, on every
position at once (:func:`unrolled_features`: EAGLE-3's "training-time test"), with the
target's whole next-token distribution as the token target and EAGLE's feature noise.
The first draft of a proposal reads the target's true features, every later one the
draft's own predictions: trained on the first only, the draft's acceptance falls with the
draft's depth.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn import functional as F

from ..._validate import check_int
from ...model import CharGPT, check_model, rebuild_command
from ...paths import checkpoints_dir
from ...train import window_features
from .eagle_draft import EagleDraft, check_eagle, target_features

__all__ = [
    "REBUILD_COMMAND",
    "SHIPPED",
    "shipped_meta",
    "collect_features",
    "eagle_loss",
    "eagle_alpha",
    "eagle_alpha_by_depth",
    "unrolled_features",
    "unrolled_loss",
    "train_eagle",
    "save_eagle",
    "load_eagle",
    "train_shipped_eagle",
]

REBUILD_COMMAND = "specdec-course train --preset eagle"
CE_WEIGHT = 0.1  # EAGLE-1's weight of the token loss beside the feature regression


@torch.inference_mode()
def collect_features(
    target: CharGPT,
    ids: torch.Tensor,
    n_windows: int | None = None,
    batch_size: int = 32,
    layers: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's last hidden states on fixed windows of ``ids``: ``(f [N, T, C], x [N, T])``
    (``data.eval_windows``; all non-overlapping windows when ``n_windows`` is None); with
    ``layers = m > 1``, ``f [N, T, m * C]`` in ``target_features``' layout."""
    return window_features(
        target, ids, n_windows, batch_size, functools.partial(target_features, layers=layers)
    )


def eagle_loss(
    draft: EagleDraft,
    f: torch.Tensor,
    x: torch.Tensor,
    ce_weight: float = CE_WEIGHT,
    start: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EAGLE-1's loss on windows ``f [B, T, C]`` (target features) and ``x [B, T]`` (ids)
    at positions ``start ..``.

    The draft reads ``(f_t, x_{t+1})`` for ``t < T - 1`` and predicts ``f_{t+1}``; the loss is
    SmoothL1 to the true features plus ``ce_weight`` times the cross-entropy of
    ``lm_head(f_hat_{t+1})`` against ``x_{t+2}``. Returns ``(loss, regression, ce)``."""
    f_hat = draft(f[:, :-1], x[:, 1:], start)
    reg = F.smooth_l1_loss(f_hat, f[:, 1:])
    logits = draft.logits(f_hat[:, :-1])
    ce = F.cross_entropy(logits.flatten(0, 1), x[:, 2:].flatten())
    return reg + ce_weight * ce, reg, ce


def _shift(t: torch.Tensor, by: int) -> torch.Tensor:
    # t [B, nh, T, hs] moved ``by`` positions later along T (row i holds row i - by; zeros
    # where there is none).
    return t if by == 0 else F.pad(t, (0, 0, by, 0))[:, :, : t.shape[2]]


def _unrolled_attention(q, keys, values, d: int) -> torch.Tensor:
    # Draft depth d's attention at every position t at once: the committed pairs of depth
    # 0 up to t - d (a causal block, offset), and one pair of each depth i = 1 .. d, the one
    # it placed at t - d + i (a diagonal: one score per query). What the draft's cache holds
    # when it drafts its (d + 1)-th token at t. q, keys[i], values[i]: [B, nh, T, hs].
    if d == 0:
        return F.scaled_dot_product_attention(q, keys[0], values[0], is_causal=True)
    T, hs = q.shape[2], q.shape[3]
    scale = hs**-0.5
    s0 = (q @ keys[0].transpose(-1, -2)) * scale  # [B, nh, T, T]
    keep = torch.ones(T, T, dtype=torch.bool, device=q.device).tril(-d)
    s0 = s0.masked_fill(~keep, float("-inf"))
    diag_k = [_shift(keys[i], d - i) for i in range(1, d + 1)]
    diag_v = [_shift(values[i], d - i) for i in range(1, d + 1)]
    sd = torch.stack([(q * k).sum(-1) * scale for k in diag_k], -1)  # [B, nh, T, d]
    t = torch.arange(T, device=q.device)
    valid = t[:, None] >= torch.arange(d - 1, -1, -1, device=q.device)[None, :]  # t - d + i >= 0
    sd = sd.masked_fill(~valid, float("-inf"))
    w = torch.cat([s0, sd], -1).softmax(-1)
    y = w[..., :T] @ values[0]
    for i, v in enumerate(diag_v):
        y = y + w[..., T + i, None] * v
    return y


def unrolled_features(
    draft: EagleDraft, f: torch.Tensor, x: torch.Tensor, depth: int, start: int = 0
) -> list[torch.Tensor]:
    """The draft run as it drafts, ``depth`` tokens deep, on every position at once.

    Depth 0 reads the pairs ``(f_t, x_{t+1})`` of windows ``f [B, T, C]``, ``x [B, T]`` and
    predicts ``f_{t+1}`` at row ``t`` (``draft(f[:, :-1], x[:, 1:])``). Depth ``d`` reads,
    at position ``t``, the pair (depth ``d - 1``'s prediction of ``f_t``, ``x_{t+1}``), and
    its attention sees exactly what the draft's cache would hold there: committed pairs up
    to ``t - d`` and its own earlier drafted pairs (``_unrolled_attention``). Training on every
    depth (EAGLE-3's "training-time test") teaches the draft to read its own predictions,
    which is what it reads for every draft after the first. Returns ``depth`` tensors
    ``[B, T - 1, C]``; rows ``t < d`` of depth ``d`` have no committed context and are not
    meaningful."""
    fin, e = f[:, :-1], F.embedding(x[:, 1:], draft.wte)
    B, T, C = fin.shape
    nh = draft.config.n_head
    pos = draft.wpe.weight[start : start + T]
    l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, f2w, f2b = draft.block.step_params()
    keys, values, outs, inp = [], [], [], fin
    for d in range(depth):
        h = draft.fc(torch.cat([inp, e], -1)) + pos
        qkv = F.linear(F.layer_norm(h, (C,), l1w, l1b), aw, ab)
        q, k, v = qkv.view(B, T, 3, nh, C // nh).permute(2, 0, 3, 1, 4)  # [B, nh, T, hs]
        keys.append(k)
        values.append(v)
        y = _unrolled_attention(q, keys, values, d)
        h = h + F.linear(y.transpose(1, 2).reshape(B, T, C), pw, pb)
        h = h + F.linear(F.gelu(F.linear(F.layer_norm(h, (C,), l2w, l2b), fw, fb)), f2w, f2b)
        outs.append(h)
        inp = torch.cat([fin[:, :1], h[:, :-1]], 1)  # row t: the prediction of f_t
    return outs


def unrolled_loss(
    draft: EagleDraft,
    f: torch.Tensor,
    x: torch.Tensor,
    depth: int = 3,
    *,
    kl_weight: float = 1.0,
    decay: float = 0.8,
    noise: float = 0.0,
    start: int = 0,
    generator: torch.Generator | None = None,
    token_loss: str = "kl",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loss the shipped draft trains on: at every depth of :func:`unrolled_features`,
    SmoothL1 to the target's feature plus ``kl_weight`` times ``KL(p || q)``, ``p`` the
    target's next-token distribution there (``lm_head(f_{t+1})``) and ``q`` the draft's;
    depth ``d`` weighted ``decay ** d``. The token term distils the target's whole
    distribution (acceptance is ``sum(min(p, q))``, which a hard-label cross-entropy
    approximates less directly). ``noise`` adds EAGLE's uniform feature noise
    ``U(-noise, noise)`` to the target's features at the input. ``token_loss="tv"``
    replaces the KL term by ``1 - sum(min(p, q))``, one minus the acceptance itself (the
    draft model's last distillation stage trains on it too). Returns ``(loss, regression,
    token term)``, the last two averaged over depths."""
    if token_loss not in ("kl", "tv"):
        raise ValueError(f"token_loss must be 'kl' or 'tv'; got {token_loss!r}")
    fin = f
    if noise:
        u = torch.rand(f.shape, generator=generator, device=f.device, dtype=f.dtype)
        fin = f + (2 * u - 1) * noise
    outs = unrolled_features(draft, fin, x, depth, start)
    goal = f[:, 1:]
    lp = draft.logits(goal).log_softmax(-1)
    loss = reg_sum = kl_sum = 0.0
    for d, fh in enumerate(outs):
        reg = F.smooth_l1_loss(fh[:, d:], goal[:, d:])
        lq = draft.logits(fh[:, d:]).log_softmax(-1)
        if token_loss == "kl":
            kl = (lp[:, d:].exp() * (lp[:, d:] - lq)).sum(-1).mean()
        else:
            kl = 1.0 - lp[:, d:].exp().minimum(lq.exp()).sum(-1).mean()
        loss = loss + decay**d * (reg + kl_weight * kl)
        reg_sum, kl_sum = reg_sum + reg.detach(), kl_sum + kl.detach()
    return loss, reg_sum / depth, kl_sum / depth


@torch.inference_mode()
def eagle_alpha(draft: EagleDraft, f: torch.Tensor, x: torch.Tensor) -> float:
    """Mean ``sum(min(p, q))`` at temperature 1 over the windows' positions: ``p`` the target's
    next-token distribution (``lm_head(f_{t+1})``), ``q`` the draft's from the true features
    (the first draft of a proposal; later drafts read predicted features)."""
    f_hat = draft(f[:, :-1], x[:, 1:])
    q = draft.logits(f_hat).double().softmax(-1)
    p = draft.logits(f[:, 1:]).double().softmax(-1)
    return float(p.minimum(q).sum(-1).mean())


@torch.inference_mode()
def eagle_alpha_by_depth(draft: EagleDraft, f: torch.Tensor, x: torch.Tensor, depth: int = 6):
    """Mean ``sum(min(p, q))`` at temperature 1 for the draft's 1st, 2nd, ... ``depth``-th
    token of a proposal, on windows ``f``, ``x`` (target features and ids): depth ``d`` is
    :func:`unrolled_features`' (exactly what the draft's cache holds when it drafts there,
    with the text's own tokens as the earlier drafts), ``p`` the target's distribution at
    the same position. A list of ``depth`` floats; the first is :func:`eagle_alpha`."""
    outs = unrolled_features(draft, f, x, depth)
    p = draft.logits(f[:, 1:]).double().softmax(-1)
    res = []
    for d, fh in enumerate(outs):
        q = draft.logits(fh[:, d:]).double().softmax(-1)
        res.append(float(p[:, d:].minimum(q).sum(-1).mean()))
    return res


@dataclass
class EagleTrainResult:
    draft: EagleDraft
    history: dict = field(default_factory=dict)  # step, loss, reg, kl, lr
    seconds: float = 0.0


def train_eagle(
    target: CharGPT,
    train_ids: torch.Tensor,
    *,
    steps: int = 1000,
    batch_size: int = 32,
    crop: int = 128,
    lr: float = 3e-3,
    n_windows: int | None = None,
    depth: int = 3,
    noise: float = 0.1,
    kl_weight: float = 1.0,
    token_loss: str = "kl",
    init: EagleDraft | None = None,
    seed: int = 0,
    progress: bool = True,
) -> EagleTrainResult:
    """Train an ``EagleDraft`` on the frozen ``target`` with :func:`unrolled_loss`.

    Features of ``n_windows`` fixed windows of ``train_ids`` (None: all non-overlapping
    ones) are computed once; each of the ``steps`` steps takes ``batch_size`` random
    windows, cut to ``crop`` positions at one random offset, and trains every draft depth
    up to ``depth`` (AdamW, warm-up, cosine decay), from a fresh draft or from a copy of
    ``init`` (a later stage). Same seed and thread count, same draft.
    Returns an ``EagleTrainResult`` (draft in eval mode, history, wall seconds including the
    feature pass). Raises ValueError for bad sizes."""
    from tqdm import tqdm

    from ...train import TrainConfig, lr_at

    check_model(target, "target")
    for name, v in (("steps", steps), ("batch_size", batch_size), ("depth", depth)):
        check_int(v, name)
    # depth + 2 positions: the pairs a depth-d draft reads, its feature target, one more
    check_int(crop, "crop", minimum=depth + 2, maximum=target.config.block_size)
    t0 = time.perf_counter()
    target.eval()
    f, x = collect_features(target, train_ids, n_windows)
    f = f.clone()  # out of inference mode: a constant in autograd
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    draft = EagleDraft.from_target(target)
    if init is not None:
        draft.load_state_dict(check_eagle(init, target).state_dict())
    draft.train()
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    tc = TrainConfig(steps=steps, lr=lr, min_lr=lr / 10, warmup=min(100, steps // 10))
    hist: dict = {"step": [], "loss": [], "reg": [], "kl": [], "lr": []}
    bar = tqdm(range(steps), desc="eagle draft", disable=not progress, mininterval=2.0, ncols=90)
    for step in bar:
        cur = lr_at(step, tc)
        for g in opt.param_groups:
            g["lr"] = cur
        w = torch.randint(len(x), (batch_size,), generator=gen)
        s = int(torch.randint(x.shape[1] - crop + 1, (1,), generator=gen))
        loss, reg, kl = unrolled_loss(
            draft,
            f[w, s : s + crop],
            x[w, s : s + crop],
            depth,
            kl_weight=kl_weight,
            noise=noise,
            start=s,
            generator=gen,
            token_loss=token_loss,
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        for key, val in (("step", step), ("loss", loss), ("reg", reg), ("kl", kl), ("lr", cur)):
            hist[key].append(float(val.detach()) if torch.is_tensor(val) else float(val))
        if step % 100 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", kl=f"{kl.item():.3f}")
    bar.close()
    draft.eval()
    return EagleTrainResult(draft, hist, time.perf_counter() - t0)


def _fingerprint(target: CharGPT) -> float:
    # A draft only makes sense on the target it read; this number identifies that target
    # (the sum of its output matrix, which any retraining changes).
    return round(float(target.lm_head.weight.detach().double().sum()), 6)


def save_eagle(
    path: str | Path, draft: EagleDraft, target: CharGPT, meta: dict | None = None
) -> Path:
    """Write ``{"state_dict", "target_fingerprint", "meta"}`` to ``path``; returns the path.
    The shared embedding is the target's and is not stored."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "state_dict": {k: v.detach().cpu().clone() for k, v in draft.state_dict().items()},
            "target_fingerprint": _fingerprint(target),
            "meta": dict(meta or {}),
        },
        path,
    )
    return path


def load_eagle(path: str | Path | None = None, *, target: CharGPT) -> EagleDraft:
    """Load the EAGLE-style draft for ``target`` (default: the shipped
    ``data/checkpoints/eagle.pt``), in eval mode on the target's device; its training record
    is ``draft.meta``. Raises FileNotFoundError (with the rebuild command) for a missing file,
    ValueError for an unreadable one or a draft trained on another target."""
    check_model(target, "target")
    path = Path(path) if path is not None else checkpoints_dir() / "eagle.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"EAGLE draft {path} not found; rebuild it with: {rebuild_command('eagle')}"
        )
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        draft = EagleDraft(target)
        draft.load_state_dict(ck["state_dict"])
    except Exception as e:  # truncated file, wrong keys, wrong shapes
        raise ValueError(
            f"EAGLE draft {path} could not be read ({type(e).__name__}: {str(e)[:200]}); "
            f"delete it and rebuild it with: {rebuild_command('eagle')}"
        ) from None
    if not math.isclose(
        _fingerprint(target), float(ck["target_fingerprint"]), rel_tol=0, abs_tol=1e-3
    ):
        raise ValueError(
            f"EAGLE draft {path} was trained on another target; retrain it with: "
            f"{rebuild_command('eagle')}"
        )
    draft.to(target.lm_head.weight.device).eval()
    draft.meta = dict(ck.get("meta", {}))
    return draft


# The shipped draft's training (``specdec-course train --preset eagle``): two stages, as
# the draft model's distillation ends on 1 - alpha itself (data/README.md).
SHIPPED = (
    {"steps": 5540, "batch_size": 64, "crop": 128, "depth": 3, "noise": 0.1, "lr": 3e-3},
    {
        "steps": 1500,
        "batch_size": 64,
        "crop": 128,
        "depth": 3,
        "noise": 0.1,
        "lr": 1e-3,
        "token_loss": "tv",
    },
)


def shipped_meta(draft: EagleDraft, target: CharGPT, stages, seconds, seed: int = 0) -> dict:
    """The training record the shipped checkpoint holds: the stages' settings, seconds and
    positions, and on 16 validation windows the unrolled loss, ``alpha_vs_target``
    (:func:`eagle_alpha`) and ``alpha_by_depth`` (:func:`eagle_alpha_by_depth`)."""
    from ... import data as D

    _, val_ids = D.corpus_split(D.CharTokenizer(target.vocab))
    vf, vx = collect_features(target, val_ids, 16)
    depth = stages[-1]["depth"]
    with torch.inference_mode():
        loss, reg, kl = unrolled_loss(draft, vf, vx, depth)
    by_depth = eagle_alpha_by_depth(draft, vf, vx)
    return {
        "stages": [dict(st) for st in stages],
        "steps": sum(st["steps"] for st in stages),
        "depth": depth,
        "seed": seed,
        "threads": torch.get_num_threads(),
        "train_seconds": round(sum(seconds), 1),
        "stage_seconds": [round(x, 1) for x in seconds],
        "positions": sum(st["steps"] * st["batch_size"] * (st["crop"] - 1) for st in stages),
        "params": sum(p.numel() for p in draft.parameters()),
        "val_loss": float(loss),
        "val_regression": float(reg),
        "val_kl": float(kl),
        "alpha_vs_target": by_depth[0],
        "alpha_by_depth": by_depth,
        "command": REBUILD_COMMAND,
    }


def train_shipped_eagle(
    *, steps: int | None = None, seed: int = 0, out: str | Path | None = None, progress: bool = True
) -> tuple[Path, dict]:
    """Train the draft on the shipped target's training split with the shipped stages
    (``SHIPPED``; ``steps`` overrides the first stage's step count and skips the second)
    and save it (default ``data/checkpoints/eagle.pt``). Returns ``(path, meta)``
    (:func:`shipped_meta`). About an hour on one thread of the course's CPU."""
    from ... import data as D
    from ...model import load_pretrained

    stages = [dict(st) for st in SHIPPED]
    if steps is not None:
        check_int(steps, "steps")
        stages = [dict(stages[0], steps=steps)]
    out = Path(out) if out else checkpoints_dir() / "eagle.pt"
    target = load_pretrained("target")
    train_ids, _ = D.corpus_split(D.CharTokenizer(target.vocab))
    draft, seconds = None, []
    for st in stages:
        res = train_eagle(target, train_ids, seed=seed, progress=progress, init=draft, **st)
        draft = res.draft
        seconds.append(res.seconds)
    meta = shipped_meta(draft, target, stages, seconds, seed)
    save_eagle(out, draft, target, meta)
    return out, meta
