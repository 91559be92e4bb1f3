"""Training Medusa heads on the frozen target, measuring them, and their checkpoint.

Medusa-1: the target's hidden states over fixed windows are computed once
(:func:`collect_hidden`), then the heads alone are trained on random positions with
``medusa_loss``. :func:`head_accuracy` gives each head's per-rank accuracy, the input of
``greedy_tree``. ``specdec-course train --preset medusa`` (:func:`train_shipped_heads`)
writes ``data/checkpoints/medusa.pt``; :func:`load_heads` reads it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .._validate import check_int
from ..model import CharGPT, check_model, rebuild_command
from ..paths import checkpoints_dir
from ..train import window_features
from .heads import DEFAULT_HEADS, MedusaHeads, check_heads, medusa_loss
from .hydra import HydraHeads, hydra_acceptance, train_hydra

REBUILD_COMMAND = "specdec-course train --preset medusa"


@torch.inference_mode()
def collect_hidden(
    target: CharGPT, ids: torch.Tensor, n_windows: int | None = None, batch_size: int = 32
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's last hidden states on fixed windows of ``ids``: ``(h [N, T, C], x [N, T])``.

    Windows are ``data.eval_windows`` (non-overlapping when ``n_windows`` is None). The target
    is frozen during head training, so its hidden states are computed once and reused.
    """
    return window_features(target, ids, n_windows, batch_size)


@torch.inference_mode()
def head_accuracy(
    target: CharGPT,
    heads: MedusaHeads,
    ids: torch.Tensor,
    *,
    n_windows: int = 16,
    top: Sequence[int] = (1, 5),
    hidden: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict:
    """Top-k accuracy of each head (and of the base ``lm_head``) on windows of ``ids``.

    Returns ``{"base": {k: acc}, "heads": [{k: acc} per head], "rank": [K, R] tensor}`` where
    ``rank[k, r]`` is how often head ``k + 1``'s rank-``r`` guess is right (``R = max(top)``),
    the input of :func:`greedy_tree`. ``hidden`` may pass ``collect_hidden``'s result.
    """
    check_heads(heads)
    top = tuple(int(t) for t in top)
    if not top or min(top) < 1:
        raise ValueError(f"top must list positive ranks; got {top!r}")
    h, x = hidden if hidden is not None else collect_hidden(target, ids, n_windows)
    R = max(top)
    K = heads.n_heads

    def ranks_of(logits, labels):
        order = logits.topk(R, dim=-1).indices  # [..., R]
        return (order == labels[..., None]).float().reshape(-1, R).mean(0)  # hit per rank

    base = ranks_of(target.lm_head(h[:, :-1]), x[:, 1:])
    rank = torch.zeros(K, R)
    for k in range(1, K + 1):
        s = 1 + k
        rank[k - 1] = ranks_of(heads.heads[k - 1](h[:, :-s]), x[:, s:])
    return {
        "base": {t: float(base[:t].sum()) for t in top},
        "heads": [{t: float(rank[k, :t].sum()) for t in top} for k in range(K)],
        "rank": rank,
    }


@dataclass
class HeadsTrainResult:
    heads: MedusaHeads
    history: dict = field(default_factory=dict)  # step, loss, ce (per head), lr
    seconds: float = 0.0


def train_heads(
    target: CharGPT,
    train_ids: torch.Tensor,
    *,
    n_heads: int = DEFAULT_HEADS,
    steps: int = 2000,
    batch_size: int = 4096,
    lr: float = 3e-3,
    n_windows: int | None = None,
    seed: int = 0,
    progress: bool = True,
    hidden: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> HeadsTrainResult:
    """Medusa-1: train ``n_heads`` heads on the frozen ``target``.

    The target's hidden states over fixed windows of ``train_ids`` are computed once
    (``collect_hidden``; ``n_windows`` of them, all when None, or pass ``hidden``); each step
    then samples ``batch_size`` random positions and minimises ``medusa_loss`` (weights
    ``0.8^k``) with AdamW, linear warm-up and cosine decay. Same seed and thread count, same
    heads. Returns a ``HeadsTrainResult`` (heads in eval mode, history, wall seconds
    including the hidden-state pass). Raises ValueError for bad sizes.
    """
    from tqdm import tqdm

    from ..train import TrainConfig, lr_at

    check_model(target, "target")
    for name, v in (("steps", steps), ("batch_size", batch_size)):
        check_int(v, name)
    t0 = time.perf_counter()
    target.eval()
    for prm in target.parameters():
        prm.requires_grad_(False)
    try:
        h, x = hidden if hidden is not None else collect_hidden(target, train_ids, n_windows)
    finally:
        for prm in target.parameters():
            prm.requires_grad_(True)
    h = h.clone()  # out of inference mode: usable in autograd as a constant
    N, T, C = h.shape
    span = T - 1 - n_heads  # positions whose every head label lies inside the window
    if span < 1:
        raise ValueError(f"windows of {T} tokens are too short for {n_heads} heads")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    heads = MedusaHeads.from_target(target, n_heads)
    heads.train()
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    tc = TrainConfig(steps=steps, lr=lr, min_lr=lr / 10, warmup=min(100, steps // 10))
    offs = torch.arange(2, n_heads + 2)
    hist: dict = {"step": [], "loss": [], "ce": [], "lr": []}
    bar = tqdm(range(steps), desc="medusa heads", disable=not progress, mininterval=2.0, ncols=90)
    for step in bar:
        cur = lr_at(step, tc)
        for g in opt.param_groups:
            g["lr"] = cur
        w = torch.randint(N, (batch_size,), generator=gen)
        t = torch.randint(span, (batch_size,), generator=gen)
        logits = heads(h[w, t])  # [K, B, V]
        labels = x[w[None, :], t[None, :] + offs[:, None]]  # [K, B]: x[t + 1 + k]
        loss, ce = medusa_loss(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        hist["step"].append(step)
        hist["loss"].append(loss.item())
        hist["ce"].append(ce.detach().tolist())
        hist["lr"].append(cur)
        if step % 100 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    heads.eval()
    return HeadsTrainResult(heads, hist, time.perf_counter() - t0)


def _fingerprint(target: CharGPT) -> float:
    # Heads only make sense on the target they were trained on; this number identifies it
    # (the sum of its output matrix, which any retraining changes).
    return round(float(target.lm_head.weight.detach().double().sum()), 6)


def save_heads(
    path: str | Path,
    heads: MedusaHeads,
    target: CharGPT,
    meta: dict | None = None,
    hydra: tuple[HydraHeads, dict] | None = None,
) -> Path:
    """Write ``{"config", "state_dict", "target_fingerprint", "meta"}`` to ``path``; with
    ``hydra=(heads, meta)`` also ``"hydra": {"config", "state_dict", "meta"}`` (one file holds
    both kinds of heads for the same target)."""
    check_heads(heads)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ck = {
        "config": {
            "n_embd": heads.n_embd,
            "vocab_size": heads.vocab_size,
            "n_heads": heads.n_heads,
        },
        "state_dict": _state(heads),
        "target_fingerprint": _fingerprint(target),
        "meta": dict(meta or {}),
    }
    if hydra is not None:
        hh, hmeta = hydra
        if not isinstance(hh, HydraHeads):
            raise ValueError(f"hydra must be (HydraHeads, meta); got {type(hh).__name__}")
        ck["hydra"] = {
            "config": {
                "n_embd": hh.n_embd,
                "vocab_size": hh.vocab_size,
                "n_heads": hh.n_heads,
                "hidden": hh.hidden,
            },
            "state_dict": _state(hh),
            "meta": dict(hmeta or {}),
        }
    torch.save(ck, path)
    return path


def _state(module) -> dict:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def load_heads(
    path: str | Path | None = None, *, target: CharGPT | None = None, kind: str = "medusa"
) -> MedusaHeads | HydraHeads:
    """Load Medusa heads (default: the shipped ``data/checkpoints/medusa.pt``), in eval mode.

    ``kind="hydra"`` loads the file's Hydra heads instead (``hydra.HydraHeads``).

    With ``target``, checks that the heads were trained on that model and puts them on its
    device. Training metadata is ``heads.meta``. Raises FileNotFoundError (with the command
    that rebuilds it) for a missing file, ValueError for an unreadable one or heads trained
    on another target.
    """
    path = Path(path) if path is not None else checkpoints_dir() / "medusa.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"Medusa heads {path} not found; rebuild them with: {rebuild_command('medusa')}"
        )
    if kind not in ("medusa", "hydra"):
        raise ValueError(f"kind must be 'medusa' or 'hydra'; got {kind!r}")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        part = ck if kind == "medusa" else ck["hydra"]
        cfg = part["config"]
        shape = (int(cfg["n_embd"]), int(cfg["vocab_size"]), int(cfg["n_heads"]))
        if kind == "medusa":
            heads = MedusaHeads(*shape)
        else:
            heads = HydraHeads(*shape, int(cfg["hidden"]))
        heads.load_state_dict(part["state_dict"])
    except Exception as e:  # truncated file, wrong keys, wrong shapes
        raise ValueError(
            f"Medusa heads {path} could not be read ({type(e).__name__}: "
            f"{str(e)[:200]}); delete it and rebuild it with: {rebuild_command('medusa')}"
        ) from None
    if target is not None and not math.isclose(
        _fingerprint(target), float(ck["target_fingerprint"]), rel_tol=0, abs_tol=1e-3
    ):
        raise ValueError(
            f"Medusa heads {path} were trained on another target model; "
            f"retrain them with: {rebuild_command('medusa')}"
        )
    heads.eval()
    if target is not None:
        heads.to(target.lm_head.weight.device)
    heads.meta = dict(part.get("meta", {}))
    return heads


HYDRA_STEPS = 10_000
HYDRA_HEADS = 5
HYDRA_HIDDEN = 512
HYDRA_TV_WEIGHT = 5.0


def train_shipped_hydra(
    *, steps: int = HYDRA_STEPS, seed: int = 0, log_every: int = 0, progress: bool = True
) -> tuple[HydraHeads, dict]:
    """Hydra heads on the shipped target, trained as the shipped ones were.

    Self-distillation (``hydra.train_hydra``) on the target's hidden states over every
    window of the training split; the measured acceptance (``hydra_acceptance`` on 32
    validation windows) goes into the returned ``meta``, from which ``trees.shipped_trees``
    builds the benchmark's trees."""
    from .. import data as D
    from ..model import load_pretrained

    check_int(steps, "steps")
    target = load_pretrained("target")
    tok = D.CharTokenizer(target.vocab)
    train_ids, val_ids = D.corpus_split(tok)
    t0 = time.perf_counter()
    hidden = collect_hidden(target, train_ids)
    heads, _, seconds = train_hydra(
        target,
        hidden,
        n_heads=HYDRA_HEADS,
        hidden=HYDRA_HIDDEN,
        tv_weight=HYDRA_TV_WEIGHT,
        steps=steps,
        seed=seed,
        log_every=log_every,
        progress=progress,
    )
    del hidden
    acc = hydra_acceptance(target, heads, collect_hidden(target, val_ids, 32))
    meta = {
        "n_heads": heads.n_heads,
        "hidden": heads.hidden,
        "steps": steps,
        "seed": seed,
        "batch_size": 2048,
        "tv_weight": HYDRA_TV_WEIGHT,
        "threads": torch.get_num_threads(),
        "train_seconds": round(time.perf_counter() - t0, 1),
        "params": sum(p.numel() for p in heads.parameters()),
        "acceptance_greedy": acc["greedy"].tolist(),
        "acceptance_sampled": acc["sampled"].tolist(),
        "alpha": acc["alpha"].tolist(),
        "command": REBUILD_COMMAND,
    }
    return heads, meta


def train_shipped_heads(
    *, steps: int = 2000, seed: int = 0, out: str | Path | None = None
) -> tuple[Path, dict, dict]:
    """Train heads on the shipped target, as the shipped ``medusa.pt`` was, and save them.

    Both kinds: Medusa-1 heads (``steps`` steps) and Hydra heads (:func:`train_shipped_hydra`,
    ``HYDRA_STEPS`` steps). Returns ``(path, meta, accuracy)``: ``meta`` is what the
    checkpoint records for the Medusa heads (steps, seed, validation top-1/top-5 per head;
    the Hydra heads' is ``load_heads(kind="hydra").meta``), ``accuracy`` is
    ``head_accuracy`` on 32 validation windows. ``out`` defaults to
    ``data/checkpoints/medusa.pt``.
    """
    from .. import data as D
    from ..model import load_pretrained

    check_int(steps, "steps")
    out = Path(out) if out else checkpoints_dir() / "medusa.pt"
    target = load_pretrained("target")
    tok = D.CharTokenizer(target.vocab)
    train_ids, val_ids = D.corpus_split(tok)
    res = train_heads(target, train_ids, steps=steps, seed=seed)
    acc = head_accuracy(target, res.heads, val_ids, n_windows=32)
    hydra = train_shipped_hydra(seed=seed, progress=False)
    meta = {
        "n_heads": res.heads.n_heads,
        "steps": steps,
        "seed": seed,
        "batch_size": 4096,
        "threads": torch.get_num_threads(),
        "train_seconds": round(res.seconds, 1),
        "params": sum(p.numel() for p in res.heads.parameters()),
        "val_top1": [a[1] for a in acc["heads"]],
        "val_top5": [a[5] for a in acc["heads"]],
        "val_base_top1": acc["base"][1],
        "command": REBUILD_COMMAND,
    }
    save_heads(out, res.heads, target, meta, hydra=hydra)
    return out, meta, acc
