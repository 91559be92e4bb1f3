"""Training the EAGLE-style draft on the frozen target, measuring it, and its checkpoint.

EAGLE-1: the target's features over fixed training windows are computed once
(:func:`collect_features`); each step then takes random windows and minimises
``SmoothL1(f_hat, f) + 0.1 * CE(lm_head(f_hat), next token)`` (:func:`eagle_loss`).
``specdec-course train --preset eagle`` (:func:`train_shipped_eagle`) writes
``data/checkpoints/eagle.pt``; :func:`load_eagle` reads it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn import functional as F

from .._validate import check_int
from ..model import CharGPT, check_model
from ..paths import checkpoints_dir
from .draft import EagleDraft

__all__ = [
    "REBUILD_COMMAND",
    "collect_features",
    "eagle_loss",
    "eagle_alpha",
    "train_eagle",
    "save_eagle",
    "load_eagle",
    "train_shipped_eagle",
]

REBUILD_COMMAND = "specdec-course train --preset eagle"
CE_WEIGHT = 0.1  # EAGLE-1's weight of the token loss beside the feature regression


@torch.inference_mode()
def collect_features(
    target: CharGPT, ids: torch.Tensor, n_windows: int | None = None, batch_size: int = 32
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's last hidden states on fixed windows of ``ids``: ``(f [N, T, C], x [N, T])``
    (``data.eval_windows``; all non-overlapping windows when ``n_windows`` is None)."""
    from ..data import eval_windows

    check_model(target, "target")
    x, _ = eval_windows(ids, target.config.block_size, n_windows)
    fs = [target.hidden_states(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    return torch.cat(fs), x


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


@torch.inference_mode()
def eagle_alpha(draft: EagleDraft, f: torch.Tensor, x: torch.Tensor) -> float:
    """Mean ``sum(min(p, q))`` at temperature 1 over the windows' positions: ``p`` the target's
    next-token distribution (``lm_head(f_{t+1})``), ``q`` the draft's from the true features
    (the first draft of a proposal; later drafts read predicted features)."""
    f_hat = draft(f[:, :-1], x[:, 1:])
    q = draft.logits(f_hat).double().softmax(-1)
    p = draft.logits(f[:, 1:]).double().softmax(-1)
    return float(p.minimum(q).sum(-1).mean())


@dataclass
class EagleTrainResult:
    draft: EagleDraft
    history: dict = field(default_factory=dict)  # step, loss, reg, ce, lr
    seconds: float = 0.0


def train_eagle(
    target: CharGPT,
    train_ids: torch.Tensor,
    *,
    steps: int = 1000,
    batch_size: int = 8,
    crop: int = 128,
    lr: float = 3e-3,
    n_windows: int | None = 1024,
    seed: int = 0,
    progress: bool = True,
) -> EagleTrainResult:
    """Train an ``EagleDraft`` on the frozen ``target`` with :func:`eagle_loss`.

    Features of ``n_windows`` fixed windows of ``train_ids`` are computed once; each of the
    ``steps`` steps takes ``batch_size`` random windows, cut to ``crop`` positions at one
    random offset (a step then costs half a full window's; AdamW, warm-up, cosine decay).
    Same seed and thread count, same draft. Returns an ``EagleTrainResult`` (draft in eval
    mode, history, wall seconds including the feature pass). Raises ValueError for bad
    sizes."""
    from tqdm import tqdm

    from ..train import TrainConfig, lr_at

    check_model(target, "target")
    for name, v in (("steps", steps), ("batch_size", batch_size)):
        check_int(v, name)
    # three positions: one input pair, its feature target, and the token after it
    check_int(crop, "crop", minimum=3, maximum=target.config.block_size)
    t0 = time.perf_counter()
    target.eval()
    f, x = collect_features(target, train_ids, n_windows)
    f = f.clone()  # out of inference mode: a constant in autograd
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    draft = EagleDraft.from_target(target)
    draft.train()
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    tc = TrainConfig(steps=steps, lr=lr, min_lr=lr / 10, warmup=min(100, steps // 10))
    hist: dict = {"step": [], "loss": [], "reg": [], "ce": [], "lr": []}
    bar = tqdm(range(steps), desc="eagle draft", disable=not progress, mininterval=2.0, ncols=90)
    for step in bar:
        cur = lr_at(step, tc)
        for g in opt.param_groups:
            g["lr"] = cur
        w = torch.randint(len(x), (batch_size,), generator=gen)
        s = int(torch.randint(x.shape[1] - crop + 1, (1,), generator=gen))
        loss, reg, ce = eagle_loss(draft, f[w, s : s + crop], x[w, s : s + crop], start=s)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        for key, val in (("step", step), ("loss", loss), ("reg", reg), ("ce", ce), ("lr", cur)):
            hist[key].append(float(val.detach()) if torch.is_tensor(val) else float(val))
        if step % 100 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", ce=f"{ce.item():.3f}")
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
        raise FileNotFoundError(f"EAGLE draft {path} not found; rebuild it with: {REBUILD_COMMAND}")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        draft = EagleDraft(target)
        draft.load_state_dict(ck["state_dict"])
    except Exception as e:  # truncated file, wrong keys, wrong shapes
        raise ValueError(
            f"EAGLE draft {path} could not be read ({type(e).__name__}: {str(e)[:200]}); "
            f"delete it and rebuild it with: {REBUILD_COMMAND}"
        ) from None
    if not math.isclose(
        _fingerprint(target), float(ck["target_fingerprint"]), rel_tol=0, abs_tol=1e-3
    ):
        raise ValueError(
            f"EAGLE draft {path} was trained on another target; retrain it with: {REBUILD_COMMAND}"
        )
    draft.to(target.lm_head.weight.device).eval()
    draft.meta = dict(ck.get("meta", {}))
    return draft


def train_shipped_eagle(
    *, steps: int = 1000, seed: int = 0, out: str | Path | None = None, progress: bool = True
) -> tuple[Path, dict]:
    """Train the draft on the shipped target's training split, as the shipped ``eagle.pt``
    was, and save it (default ``data/checkpoints/eagle.pt``). Returns ``(path, meta)``:
    steps, seed, threads, seconds, validation loss and ``alpha_vs_target`` (:func:`eagle_alpha`
    on 4 validation windows)."""
    from .. import data as D
    from ..model import load_pretrained

    check_int(steps, "steps")
    out = Path(out) if out else checkpoints_dir() / "eagle.pt"
    target = load_pretrained("target")
    tok = D.CharTokenizer(target.vocab)
    train_ids, val_ids = D.corpus_split(tok)
    res = train_eagle(target, train_ids, steps=steps, seed=seed, progress=progress)
    vf, vx = collect_features(target, val_ids, 4)
    with torch.inference_mode():
        loss, reg, ce = eagle_loss(res.draft, vf, vx)
    meta = {
        "steps": steps,
        "seed": seed,
        "batch_size": 8,
        "crop": 128,
        "windows": 1024,
        "threads": torch.get_num_threads(),
        "train_seconds": round(res.seconds, 1),
        "params": sum(p.numel() for p in res.draft.parameters()),
        "val_loss": float(loss),
        "val_regression": float(reg),
        "val_ce": float(ce),
        "alpha_vs_target": eagle_alpha(res.draft, vf, vx),
        "command": REBUILD_COMMAND,
    }
    save_eagle(out, res.draft, target, meta)
    return out, meta
