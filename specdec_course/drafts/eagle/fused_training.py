"""Training the fused EAGLE-style draft's head, measuring it, and its checkpoint.

The draft model and the target are frozen, so everything the head reads is computed once
(:func:`fused_data`): on fixed windows of the text, the target's features ``f`` and the
draft model's hidden states ``h`` (after its final LayerNorm). The ``d``-th draft of a
proposal at position ``t`` reads ``h_t`` and the feature ``d`` positions back,
``f_{t-d}`` (the newest one the target had computed when the proposal began), and is
scored against the target's distribution there, ``p_t = softmax(lm_head(f_t))``. Each step
takes random (window, position, depth) triples and minimises ``1 - sum(min(p, q))``, one
minus the acceptance rate itself (the loss the draft model's last distillation stage ends
on). The draft's depth-``d`` tokens are the text's own here, as in ``eagle_alpha_by_depth``.

``specdec-course train --preset fused`` (:func:`train_shipped_fused`) writes
``data/checkpoints/fused.pt``; :func:`load_fused` reads it.
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
from .fused import FusedHead, check_fused

__all__ = [
    "FUSED_COMMAND",
    "FUSED_SHIPPED",
    "fused_data",
    "fused_alpha_by_depth",
    "train_fused",
    "save_fused",
    "load_fused",
    "train_shipped_fused",
]

FUSED_COMMAND = "specdec-course train --preset fused"
FUSED_SHIPPED = {
    "steps": 30_000,
    "batch_size": 1024,
    "lr": 2e-3,
    "rank": 128,
    "hidden": 512,
    "depth_decay": 0.7,
}


@torch.inference_mode()
def fused_data(
    target: CharGPT, draft: CharGPT, ids: torch.Tensor, n_windows: int | None = None
) -> dict:
    """What the head reads and is scored against on fixed windows of ``ids``:
    ``{"f": target features [N, T, Ct], "h": draft hidden states [N, T, Cd], "x": ids}``."""
    check_model(draft, "draft")
    f, x = collect_features(target, ids, n_windows)
    h = torch.cat([draft.hidden_states(x[i : i + 32]) for i in range(0, len(x), 32)])
    return {"f": f, "h": h, "x": x}


def _probs(target: CharGPT, draft: CharGPT, head: FusedHead, f_at, f_back, h, depth_index):
    # p and q at one batch of positions: f_at the target's feature there, f_back the one
    # the draft reads, h the draft's hidden state, depth_index 0-based depths.
    p = target.lm_head(f_at).softmax(-1)
    t = head.terms(f_back, depth_index)  # [B, V + r]
    q = (draft.lm_head(h) + head.delta(h, t)).softmax(-1)
    return p, q


@torch.inference_mode()
def fused_alpha_by_depth(
    head: FusedHead, target: CharGPT, draft: CharGPT, data: dict, depth: int = 8
) -> list[float]:
    """Mean ``sum(min(p, q))`` at temperature 1 for the 1st .. ``depth``-th draft of a
    proposal over the windows of ``data`` (:func:`fused_data`): the ``d``-th reads the
    feature ``d`` positions back (module docstring). A list of ``depth`` floats."""
    f, h = data["f"], data["h"]
    res = []
    for d in range(1, depth + 1):
        idx = torch.full((f.shape[0] * (f.shape[1] - d),), d - 1)
        p, q = _probs(
            target,
            draft,
            head,
            f[:, d:].flatten(0, 1),
            f[:, :-d].flatten(0, 1),
            h[:, d:].flatten(0, 1),
            idx.clamp(max=head.sizes["depths"] - 1),
        )
        res.append(float(p.double().minimum(q.double()).sum(-1).mean()))
    return res


def train_fused(
    target: CharGPT,
    draft: CharGPT,
    train_ids: torch.Tensor,
    *,
    steps: int = 1000,
    batch_size: int = 1024,
    lr: float = 2e-3,
    rank: int = 128,
    hidden: int = 512,
    depths: int = 8,
    depth_decay: float = 0.7,
    seed: int = 0,
    data: dict | None = None,
    progress: bool = True,
) -> tuple[FusedHead, float]:
    """Train a ``FusedHead`` for the frozen ``draft`` and ``target`` (module docstring):
    AdamW, warm-up, cosine decay, ``batch_size`` random (window, position, depth) triples a
    step, depth ``d`` drawn with weight ``depth_decay ** (d - 1)``: a proposal reaches its
    ``d``-th draft only when the ones before it were accepted, and every draft's
    acceptance multiplies the value of all that follow, so the first drafts weigh most.
    ``data`` reuses :func:`fused_data`'s tensors (default: all windows of ``train_ids``).
    Same seed and thread count, same head. Returns ``(head in eval mode, wall seconds
    including the data pass)``."""
    from tqdm import tqdm

    from ...train import TrainConfig, lr_at

    for name, v in (("steps", steps), ("batch_size", batch_size), ("rank", rank)):
        check_int(v, name)
    check_int(depths, "depths", maximum=target.config.block_size - 1)
    check_real(depth_decay, "depth_decay", low=0.0, high=1.0)
    t0 = time.perf_counter()
    target.eval()
    draft.eval()
    if data is None:
        data = fused_data(target, draft, train_ids)
    f, h = data["f"].clone(), data["h"].clone()  # out of inference mode
    N, T = f.shape[:2]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    head = FusedHead.for_models(draft, target, rank=rank, hidden=hidden, depths=depths)
    frozen = [(p, p.requires_grad) for p in (*target.parameters(), *draft.parameters())]
    for p, _ in frozen:
        p.requires_grad_(False)
    weights = depth_decay ** torch.arange(depths, dtype=torch.float64)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    tc = TrainConfig(steps=steps, lr=lr, min_lr=lr / 10, warmup=min(100, steps // 10))
    bar = tqdm(range(steps), desc="fused head", disable=not progress, mininterval=2.0, ncols=90)
    try:
        for step in bar:
            for g in opt.param_groups:
                g["lr"] = lr_at(step, tc)
            d = 1 + torch.multinomial(weights, batch_size, replacement=True, generator=gen)
            w = torch.randint(N, (batch_size,), generator=gen)
            t = d + (torch.rand(batch_size, generator=gen) * (T - d)).long()  # d <= t < T
            p, q = _probs(target, draft, head, f[w, t], f[w, t - d], h[w, t], d - 1)
            loss = 1.0 - p.minimum(q).sum(-1).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % 200 == 0:
                bar.set_postfix(alpha=f"{1 - loss.item():.4f}")
    finally:
        for p, was in frozen:  # as they were
            p.requires_grad_(was)
    bar.close()
    return head.eval(), time.perf_counter() - t0


def _fingerprint(model: CharGPT) -> float:
    # Which model a head was trained on: the sum of its output matrix (retraining changes it).
    return round(float(model.lm_head.weight.detach().double().sum()), 6)


def save_fused(
    path: str | Path, head: FusedHead, draft: CharGPT, target: CharGPT, meta: dict | None = None
) -> Path:
    """Write ``{"state_dict", "sizes", "draft_fingerprint", "target_fingerprint", "meta"}``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "state_dict": {k: v.detach().cpu().clone() for k, v in head.state_dict().items()},
            "sizes": dict(head.sizes),
            "draft_fingerprint": _fingerprint(draft),
            "target_fingerprint": _fingerprint(target),
            "meta": dict(meta or {}),
        },
        path,
    )
    return path


def load_fused(path: str | Path | None = None, *, draft: CharGPT, target: CharGPT) -> FusedHead:
    """Load the fused draft's head for ``draft`` and ``target`` (default: the shipped
    ``data/checkpoints/fused.pt``), in eval mode on the target's device; its training
    record is ``head.meta``. Raises FileNotFoundError (with the rebuild command) for a
    missing file, ValueError for an unreadable one or a head trained on other models."""
    check_model(draft, "draft")
    check_model(target, "target")
    path = Path(path) if path is not None else checkpoints_dir() / "fused.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"fused head {path} not found; rebuild it with: {rebuild_command('fused')}"
        )
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        head = FusedHead(**ck["sizes"])
        head.load_state_dict(ck["state_dict"])
        check_fused(head, draft, target)
        fps = (float(ck["draft_fingerprint"]), float(ck["target_fingerprint"]))
    except Exception as e:  # truncated file, wrong keys, wrong shapes
        raise ValueError(
            f"fused head {path} could not be read for these models ({type(e).__name__}: "
            f"{str(e)[:200]}); delete it and rebuild it with: {rebuild_command('fused')}"
        ) from None
    for (name, model), fp in zip((("draft", draft), ("target", target)), fps):
        if not math.isclose(_fingerprint(model), fp, rel_tol=0, abs_tol=1e-3):
            raise ValueError(
                f"fused head {path} was trained on another {name}; retrain it with: "
                f"{rebuild_command('fused')}"
            )
    head.to(target.lm_head.weight.device).eval()
    head.meta = dict(ck.get("meta", {}))
    return head


def train_shipped_fused(
    *, steps: int | None = None, seed: int = 0, out: str | Path | None = None, progress: bool = True
) -> tuple[Path, dict]:
    """Train the head on the shipped draft model and target with ``FUSED_SHIPPED``
    (``steps`` overrides its step count) and save it (default ``data/checkpoints/fused.pt``)
    with its record: settings, seconds, positions, and ``alpha_by_depth`` on 16 validation
    windows beside the draft model's own on the same windows. Returns ``(path, meta)``."""
    from ... import data as D
    from ...model import load_pretrained

    cfg = dict(FUSED_SHIPPED)
    if steps is not None:
        cfg["steps"] = steps
    out = Path(out) if out else checkpoints_dir() / "fused.pt"
    target, draft = load_pretrained("target"), load_pretrained("draft")
    train_ids, val_ids = D.corpus_split(D.CharTokenizer(target.vocab))
    head, seconds = train_fused(target, draft, train_ids, seed=seed, progress=progress, **cfg)
    val = fused_data(target, draft, val_ids, 16)
    by_depth = fused_alpha_by_depth(head, target, draft, val)
    untrained = FusedHead.for_models(draft, target, rank=cfg["rank"], hidden=cfg["hidden"])
    meta = {
        "settings": cfg,
        "seed": seed,
        "threads": torch.get_num_threads(),
        "train_seconds": round(seconds, 1),
        "positions": cfg["steps"] * cfg["batch_size"],
        "params": sum(p.numel() for p in head.parameters()),
        "alpha_vs_target": by_depth[0],
        "alpha_by_depth": by_depth,
        "draft_alpha_by_depth": fused_alpha_by_depth(untrained, target, draft, val),
        "command": FUSED_COMMAND,
    }
    save_fused(out, head, draft, target, meta)
    return out, meta
