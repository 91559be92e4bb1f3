"""Training the recurrent EAGLE-style draft, measuring it, and its checkpoint.

The target is frozen, so its features on fixed windows of the text are computed once
(``collect_features``). A proposal at position ``t`` (the committed text ends with
``x_t``, the newest feature is ``f_{t-1}``) unrolls ``depths`` drafts: the ``d``-th is fed
``x_{t+d-1}`` and scored against the target's distribution there, ``p = softmax(lm_head(
f_{t+d-1}))``. The fed tokens are the text's own (teacher forcing, as the fused draft and
EAGLE train); at temperature 1 the text is a sample of what the target drafts against.
Each step takes ``batch_size`` random (window, position) starts and minimises, summed over
the depths with weight ``depth_decay ** (d - 1)`` (a proposal reaches its ``d``-th draft
only when the ones before were accepted), ``1 - sum(min(p, q))`` (one minus the acceptance
rate itself) plus ``kl_weight`` times ``KL(p || q)``, whose gradient does not vanish where
``q`` has no mass yet.

``specdec-course train --preset recurrent`` (:func:`train_shipped_recurrent`) writes
``data/checkpoints/recurrent.pt``; :func:`load_recurrent` reads it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from ..._validate import check_int, check_real
from ...model import CharGPT, check_model, rebuild_command
from ...paths import checkpoints_dir
from .eagle_training import collect_features
from .fused_training import _fingerprint
from .recurrent import RecurrentDraft, check_recurrent

__all__ = [
    "RECURRENT_COMMAND",
    "RECURRENT_SHIPPED",
    "recurrent_alpha_by_depth",
    "draft_model_alpha_by_depth",
    "train_recurrent",
    "save_recurrent",
    "load_recurrent",
    "train_shipped_recurrent",
]

RECURRENT_COMMAND = "specdec-course train --preset recurrent"
RECURRENT_SHIPPED = {
    "steps": 30_000,
    "batch_size": 512,
    "lr": 2e-3,
    "state": 192,
    "hidden": 768,
    "init_hidden": 256,
    "depths": 8,
    "depth_decay": 0.9,
    "kl_weight": 0.2,
    "feature_layers": 4,
}


def _loss_terms(draft: RecurrentDraft, target: CharGPT, f, x, w, t, depths: int):
    # (p, q) per depth, [B, depths, V] each, for starts (w, t): f_{t-1} and x_t .. x_{t+d-1}.
    ar = torch.arange(depths)
    tok = x[w[:, None], t[:, None] + ar]  # [B, depths]
    q = draft.unroll(f[w, t - 1], tok).softmax(-1)
    C = target.config.n_embd  # lm_head reads the last C columns of a wide feature
    p = target.lm_head(f[w[:, None], t[:, None] + ar, -C:]).softmax(-1)
    return p, q


@torch.inference_mode()
def recurrent_alpha_by_depth(
    draft: RecurrentDraft, target: CharGPT, f: torch.Tensor, x: torch.Tensor, depth: int = 8
) -> list[float]:
    """Mean ``sum(min(p, q))`` at temperature 1 of the 1st .. ``depth``-th draft of a
    proposal at every position of the windows ``f [N, T, C]`` (target features) and ``x [N,
    T]`` (ids) where ``depth`` drafts fit (module docstring): a list of ``depth`` floats.
    ``f`` is as wide as the draft reads (``collect_features(..., layers=draft.
    feature_layers)``)."""
    check_recurrent(draft, target)
    width = draft.feature_layers * target.config.n_embd
    if f.dim() != 3 or f.shape[-1] != width:
        raise ValueError(
            f"f must be [N, T, {width}] (the draft reads {draft.feature_layers} of the target's "
            f"blocks: collect_features(..., layers={draft.feature_layers})); got {tuple(f.shape)}"
        )
    N, T = x.shape
    check_int(depth, "depth", maximum=T - 1)
    w = torch.arange(N).repeat_interleave(T - depth)
    t = torch.arange(1, T - depth + 1).repeat(N)
    p, q = _loss_terms(draft, target, f, x, w, t, depth)
    return p.double().minimum(q.double()).sum(-1).mean(0).tolist()


def train_recurrent(
    target: CharGPT,
    train_ids: torch.Tensor,
    *,
    steps: int = 1000,
    batch_size: int = 512,
    lr: float = 2e-3,
    state: int = 128,
    hidden: int = 512,
    init_hidden: int = 256,
    depths: int = 6,
    depth_decay: float = 0.8,
    kl_weight: float = 0.2,
    feature_layers: int = 1,
    seed: int = 0,
    n_windows: int | None = None,
    progress: bool = True,
) -> tuple[RecurrentDraft, float]:
    """Train a ``RecurrentDraft`` for the frozen ``target`` on ``train_ids`` (module
    docstring): AdamW, warm-up, cosine decay, ``n_windows`` windows of the text (default:
    all). Same seed and thread count, same draft. Returns ``(draft in eval mode, wall
    seconds including the feature pass)``."""
    from tqdm import tqdm

    from ...train import TrainConfig, lr_at

    check_model(target, "target")
    for name, v in (("steps", steps), ("batch_size", batch_size)):
        check_int(v, name)
    check_int(depths, "depths", maximum=target.config.block_size - 2)
    check_int(feature_layers, "feature_layers", maximum=target.config.n_layer)
    check_real(depth_decay, "depth_decay", low=0.0, high=1.0)
    check_real(kl_weight, "kl_weight", low=0.0)
    t0 = time.perf_counter()
    target.eval()
    with torch.inference_mode():
        f, x = collect_features(target, train_ids, n_windows, layers=feature_layers)
    f, x = f.clone(), x.clone()  # out of inference mode
    N, T = x.shape
    if T < depths + 1:
        raise ValueError(f"windows of {T} tokens are too short for {depths} drafts")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    draft = RecurrentDraft.for_target(
        target, state=state, hidden=hidden, init_hidden=init_hidden, feature_layers=feature_layers
    ).train()
    frozen = [(p, p.requires_grad) for p in target.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    weights = depth_decay ** torch.arange(depths, dtype=torch.float32)
    opt = torch.optim.AdamW(draft.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    tc = TrainConfig(steps=steps, lr=lr, min_lr=lr / 10, warmup=min(200, steps // 10))
    bar = tqdm(
        range(steps), desc="recurrent draft", disable=not progress, mininterval=2.0, ncols=90
    )
    try:
        for step in bar:
            for g in opt.param_groups:
                g["lr"] = lr_at(step, tc)
            w = torch.randint(N, (batch_size,), generator=gen)
            t = torch.randint(1, T - depths + 1, (batch_size,), generator=gen)
            p, q = _loss_terms(draft, target, f, x, w, t, depths)
            tv = 1.0 - p.minimum(q).sum(-1).mean(0)  # [depths]
            kl = (p * (p.clamp_min(1e-12).log() - q.clamp_min(1e-12).log())).sum(-1).mean(0)
            loss = (weights * (tv + kl_weight * kl)).sum() / weights.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % 200 == 0:
                bar.set_postfix(alpha1=f"{1 - tv[0].item():.4f}")
    finally:
        for p, was in frozen:  # as they were
            p.requires_grad_(was)
    bar.close()
    return draft.eval(), time.perf_counter() - t0


def save_recurrent(
    path: str | Path, draft: RecurrentDraft, target: CharGPT, meta: dict | None = None
) -> Path:
    """Write ``{"state_dict", "sizes", "target_fingerprint", "meta"}``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "state_dict": {k: v.detach().cpu().clone() for k, v in draft.state_dict().items()},
            "sizes": dict(draft.sizes),
            "target_fingerprint": _fingerprint(target),
            "meta": dict(meta or {}),
        },
        path,
    )
    return path


def load_recurrent(path: str | Path | None = None, *, target: CharGPT) -> RecurrentDraft:
    """Load the recurrent draft for ``target`` (default: the shipped
    ``data/checkpoints/recurrent.pt``), in eval mode on the target's device; its training
    record is ``draft.meta``. Raises FileNotFoundError (with the rebuild command) for a
    missing file, ValueError for an unreadable one or a draft trained on another target."""
    check_model(target, "target")
    path = Path(path) if path is not None else checkpoints_dir() / "recurrent.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"recurrent draft {path} not found; rebuild it with: {rebuild_command('recurrent')}"
        )
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        draft = RecurrentDraft(**ck["sizes"])
        draft.load_state_dict(ck["state_dict"])
        check_recurrent(draft, target)
        fp = float(ck["target_fingerprint"])
    except Exception as e:  # truncated file, wrong keys, wrong shapes
        raise ValueError(
            f"recurrent draft {path} could not be read for this target ({type(e).__name__}: "
            f"{str(e)[:200]}); delete it and rebuild it with: {rebuild_command('recurrent')}"
        ) from None
    if not math.isclose(_fingerprint(target), fp, rel_tol=0, abs_tol=1e-3):
        raise ValueError(
            f"recurrent draft {path} was trained on another target; retrain it with: "
            f"{rebuild_command('recurrent')}"
        )
    draft.to(target.lm_head.weight.device).eval()
    draft.meta = dict(ck.get("meta", {}))
    return draft


def train_shipped_recurrent(
    *, steps: int | None = None, seed: int = 0, out: str | Path | None = None, progress: bool = True
) -> tuple[Path, dict]:
    """Train the recurrent draft on the shipped target with ``RECURRENT_SHIPPED`` (``steps``
    overrides its step count) and save it (default ``data/checkpoints/recurrent.pt``) with
    its record: settings, seconds, positions, and ``alpha_by_depth`` on 16 validation
    windows beside the draft model's on the same positions (``draft_alpha_by_depth``).
    Returns ``(path, meta)``."""
    from ... import data as D
    from ...model import load_pretrained

    cfg = dict(RECURRENT_SHIPPED)
    if steps is not None:
        cfg["steps"] = steps
    out = Path(out) if out else checkpoints_dir() / "recurrent.pt"
    target = load_pretrained("target")
    train_ids, val_ids = D.corpus_split(D.CharTokenizer(target.vocab))
    draft, seconds = train_recurrent(target, train_ids, seed=seed, progress=progress, **cfg)
    with torch.inference_mode():
        f, x = collect_features(target, val_ids, 16, layers=draft.feature_layers)
    by_depth = recurrent_alpha_by_depth(draft, target, f, x)
    meta = {
        "settings": cfg,
        "seed": seed,
        "threads": torch.get_num_threads(),
        "train_seconds": round(seconds, 1),
        "positions": cfg["steps"] * cfg["batch_size"] * cfg["depths"],
        "params": sum(p.numel() for p in draft.parameters()),
        "alpha_by_depth": by_depth,
        "draft_alpha_by_depth": draft_model_alpha_by_depth(load_pretrained("draft"), target, x),
        "command": RECURRENT_COMMAND,
    }
    save_recurrent(out, draft, target, meta)
    return out, meta


@torch.inference_mode()
def draft_model_alpha_by_depth(
    draft: CharGPT, target: CharGPT, x: torch.Tensor, depth: int = 8
) -> list[float]:
    """The draft model's mean ``sum(min(p, q))`` on the windows ``x [N, T]`` at exactly the
    positions :func:`recurrent_alpha_by_depth` scores the recurrent draft's 1st ..
    ``depth``-th drafts at (the draft model reads the text itself, so its drafts have no
    depth: the lists differ only in their positions). A list of ``depth`` floats."""
    check_model(draft, "draft")
    check_model(target, "target")
    T = x.shape[1]
    check_int(depth, "depth", maximum=T - 1)
    ov = target(x).softmax(-1).double().minimum(draft(x).softmax(-1).double()).sum(-1)
    # draft j = d + 1 from the starts t = 1 .. T - depth is scored at positions t + d
    return [float(ov[:, d + 1 : T - depth + d + 1].mean()) for d in range(depth)]
