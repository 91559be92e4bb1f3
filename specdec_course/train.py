"""Training the character LM pair on the CPU, and measuring how far apart the pair is.

AdamW (Loshchilov & Hutter 2019) with linear warm-up and cosine decay, full 256-character
windows, a tqdm progress bar and periodic validation loss on fixed windows. The draft can be
distilled from the target: it then learns the target's soft labels (the full next-character
distribution), which is what raises the acceptance rate (DistillSpec, Zhou et al. 2023).

``specdec-course train --preset target|draft`` writes ``data/checkpoints/{preset}.pt``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch.nn import functional as F

from . import data as D
from ._validate import check_int
from .model import (
    CharGPT,
    GPTConfig,
    check_model,
    load_checkpoint,
    preset,
    rebuild_command,
    save_checkpoint,
)
from .paths import checkpoints_dir
from .sampling import process_logits

__all__ = [
    "TrainConfig",
    "TRAIN_PRESETS",
    "TrainResult",
    "lr_at",
    "estimate_loss",
    "train",
    "next_token_probs",
    "window_features",
    "PairStats",
    "pair_stats",
    "train_preset",
]


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings.

    ``distill_weight`` is the share of the soft-label loss (0..1). ``distill_loss`` picks it:
    ``"kl"``, cross-entropy to the teacher's distribution (its gradient is KL(p || q)'s), or
    ``"tv"``, the total variation 0.5 * sum |p - q| = 1 - sum min(p, q): one minus the
    acceptance rate itself, the quantity speculative decoding pays for (DistillSpec, Zhou et
    al. 2024, finds the best divergence depends on the task; for a draft it is this one).
    """

    steps: int = 1500
    batch_size: int = 32
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_windows: int = 32
    seed: int = 0
    distill_weight: float = 1.0
    distill_loss: str = "kl"

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_interval", "eval_windows"):
            check_int(getattr(self, name), f"TrainConfig.{name}")
        if not (self.lr > 0 and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"need lr > 0 and 0 <= min_lr <= lr; got {self.lr}, {self.min_lr}")
        if self.warmup < 0:
            raise ValueError(f"TrainConfig.warmup must be >= 0; got {self.warmup}")
        if not 0.0 <= self.distill_weight <= 1.0:
            raise ValueError(f"distill_weight must be in [0, 1]; got {self.distill_weight}")
        if self.distill_loss not in ("kl", "tv"):
            raise ValueError(f"distill_loss must be 'kl' or 'tv'; got {self.distill_loss!r}")


TRAIN_PRESETS = {
    "target": TrainConfig(steps=2000),
    "draft": TrainConfig(steps=1500),
}


def lr_at(step: int, tc: TrainConfig) -> float:
    """Learning rate at ``step``: linear warm-up to ``lr``, then cosine decay to ``min_lr``."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    frac = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    return tc.min_lr + 0.5 * (tc.lr - tc.min_lr) * (1 + math.cos(math.pi * min(1.0, frac)))


@torch.no_grad()
def estimate_loss(
    model: CharGPT, ids: torch.Tensor, n_windows: int | None = None, batch_size: int = 32
) -> float:
    """Mean cross-entropy (nats/char) over fixed, evenly spaced full windows of ``ids``.

    ``n_windows=None`` uses every non-overlapping window. Deterministic for a given model.
    """
    check_model(model)
    x, y = D.eval_windows(ids, model.config.block_size, n_windows)
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(x), batch_size):
        logits = model(x[i : i + batch_size])
        total += F.cross_entropy(
            logits.flatten(0, 1), y[i : i + batch_size].flatten(), reduction="sum"
        ).item()
    model.train(was_training)
    return total / y.numel()


@dataclass
class TrainResult:
    model: CharGPT
    history: dict  # lists: step, train_loss, val_step, val_loss, lr
    seconds: float


def _distill_loss(student_logits, teacher_logits, kind: str = "kl"):
    p = F.softmax(teacher_logits, dim=-1)
    if kind == "tv":  # 1 - acceptance rate, averaged over positions
        return 0.5 * (p - F.softmax(student_logits, dim=-1)).abs().sum(-1).mean()
    # Cross-entropy to the teacher's distribution; equals KL(teacher || student) plus the
    # teacher's entropy, a constant, so its gradient is the KL's.
    return -(p * F.log_softmax(student_logits, dim=-1)).sum(-1).mean()


def train(
    config: GPTConfig,
    tc: TrainConfig,
    train_ids: torch.Tensor,
    val_ids: torch.Tensor,
    *,
    teacher: CharGPT | None = None,
    init: CharGPT | None = None,
    progress: bool = True,
    desc: str = "train",
) -> TrainResult:
    """Train a ``CharGPT(config)`` (or continue ``init``) for ``tc.steps`` steps.

    Batches are random full windows of ``train_ids``; every ``tc.eval_interval`` steps (and at
    the end) the loss on ``tc.eval_windows`` fixed windows of ``val_ids`` is recorded. With
    ``teacher`` the loss is ``(1 - w) * CE(hard labels) + w * CE(teacher's soft labels)``,
    ``w = tc.distill_weight``. Same seed, same thread count -> same model. The model trains
    on ``train_ids``'s device (``val_ids`` and ``teacher`` must be there too).

    Returns a ``TrainResult`` (model in eval mode, history, wall seconds). Raises ValueError
    for mismatched vocabularies or an ``init`` of another shape.
    """
    if not isinstance(config, GPTConfig) or not isinstance(tc, TrainConfig):
        raise ValueError("config must be a GPTConfig and tc a TrainConfig")
    if teacher is not None and teacher.config.vocab_size != config.vocab_size:
        raise ValueError("teacher and student must share the vocabulary (vocab_size differs)")
    torch.manual_seed(tc.seed)
    gen = torch.Generator().manual_seed(tc.seed)
    model = CharGPT(config)
    if train_ids.device != model.lm_head.weight.device:  # train where the data lives
        model.to(train_ids.device)
    if init is not None:
        if init.config != config:
            raise ValueError(f"init has config {init.config}, not {config}")
        model.load_state_dict(init.state_dict())
    if teacher is not None:
        teacher.eval()
    # nanoGPT: decay matrices, not biases, norms or embeddings... except the tied embedding,
    # which is also the output matrix; decaying 2-D tensors only covers it.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": tc.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=tc.lr,
        betas=(0.9, 0.99),
    )
    hist = {"step": [], "train_loss": [], "val_step": [], "val_loss": [], "lr": []}
    from tqdm import tqdm

    t0 = time.perf_counter()
    bar = tqdm(range(tc.steps), desc=desc, disable=not progress, mininterval=2.0, ncols=90)
    model.train()
    for step in bar:
        lr = lr_at(step, tc)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = D.get_batch(train_ids, tc.batch_size, config.block_size, generator=gen)
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        if teacher is not None:
            with torch.no_grad():
                t_logits = teacher(x)
            w = tc.distill_weight
            soft = _distill_loss(logits.flatten(0, 1), t_logits.flatten(0, 1), tc.distill_loss)
            loss = (1 - w) * loss + w * soft
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        hist["step"].append(step)
        hist["train_loss"].append(loss.item())
        hist["lr"].append(lr)
        if (step + 1) % tc.eval_interval == 0 or step + 1 == tc.steps:
            vl = estimate_loss(model, val_ids, tc.eval_windows)
            hist["val_step"].append(step + 1)
            hist["val_loss"].append(vl)
            bar.set_postfix(loss=f"{loss.item():.3f}", val=f"{vl:.3f}")
    bar.close()
    model.eval()
    return TrainResult(model, hist, time.perf_counter() - t0)


@torch.no_grad()
def next_token_probs(
    model: CharGPT, x: torch.Tensor, temperature: float = 1.0, top_p: float | None = None
) -> torch.Tensor:
    """Next-character distributions ``[B, T, V]`` (float64) for every position of ``x``.

    ``temperature=0`` gives one-hot argmax distributions (greedy decoding); ``top_p``
    processes the logits as the decoding loops do (``sampling.process_logits``).
    """
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0; got {temperature!r}")
    if top_p is not None:
        return process_logits(model(x), temperature, top_p=top_p).double()
    logits = model(x).double()
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).double()
    return F.softmax(logits / temperature, dim=-1)


def window_features(
    target: CharGPT,
    ids: torch.Tensor,
    n_windows: int | None = None,
    batch_size: int = 32,
    features=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A frozen target's features on fixed windows of ``ids``, computed once for a draft's
    or heads' training: ``(f [N, T, ...], x [N, T])``. Windows are ``data.eval_windows``
    (all non-overlapping ones when ``n_windows`` is None), run ``batch_size`` at a time
    through ``features(target, x)`` (default: ``target.hidden_states``)."""
    check_model(target, "target")
    check_int(batch_size, "batch_size")
    x, _ = D.eval_windows(ids, target.config.block_size, n_windows)
    if features is None:
        features = type(target).hidden_states
    fs = [features(target, x[i : i + batch_size]) for i in range(0, len(x), batch_size)]
    return torch.cat(fs), x


@dataclass(frozen=True)
class PairStats:
    """How far apart two models are over ``n_positions`` validation positions."""

    alpha: float  # mean over positions of sum(min(p, q)) = 1 - mean TV
    tv_mean: float
    tv_worst: float
    worst_index: tuple  # (window, position) of the largest TV
    n_positions: int
    temperature: float
    tv: torch.Tensor | None = field(default=None, repr=False, compare=False)  # per position
    top_p: float | None = None


def pair_stats(
    target: CharGPT,
    draft: CharGPT,
    ids: torch.Tensor,
    *,
    n_windows: int = 4,
    temperature: float = 1.0,
    top_p: float | None = None,
) -> PairStats:
    """TV distance and acceptance rate between ``target`` and ``draft`` on ``ids``, their
    logits processed alike (``temperature``, ``top_p``).

    Both models read the same ``n_windows`` fixed windows (``data.eval_windows``); every
    position of every window is one comparison, so there are ``n_windows * block_size``
    (``tv``: each one's distance, ``[n_windows, block_size]``). Raises ValueError if the
    models' vocabularies or block sizes differ.
    """
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError("target and draft must share the vocabulary (vocab_size differs)")
    if target.config.block_size != draft.config.block_size:
        raise ValueError("target and draft must have the same block_size")
    x, _ = D.eval_windows(ids, target.config.block_size, n_windows)
    p = next_token_probs(target, x, temperature, top_p)
    q = next_token_probs(draft, x, temperature, top_p)
    tv = 0.5 * (p - q).abs().sum(-1)  # (n_windows, T)
    w = int(tv.argmax())
    T = tv.shape[1]
    return PairStats(
        alpha=float(p.minimum(q).sum(-1).mean()),
        tv_mean=float(tv.mean()),
        tv_worst=float(tv.max()),
        worst_index=(w // T, w % T),
        n_positions=tv.numel(),
        temperature=float(temperature),
        tv=tv,
        top_p=top_p,
    )


def train_preset(
    name: str,
    *,
    steps: int | None = None,
    seed: int = 0,
    out: str | Path | None = None,
    init_from: str | Path | None = None,
    distill_from: str | Path | None = None,
    distill_loss: str = "kl",
    lr: float | None = None,
) -> tuple[Path, dict]:
    """Train the preset ``name`` ("target" or "draft") on the corpus and save its checkpoint.

    ``steps`` overrides the preset's step count; ``init_from`` starts from a checkpoint's
    weights; ``distill_from`` trains against a teacher checkpoint's distributions (the
    shipped draft is distilled from the shipped target), with ``distill_loss`` ``"kl"`` or
    ``"tv"`` (see ``TrainConfig``); ``lr`` overrides the peak learning rate (a fine-tuning
    stage wants a lower one, with the minimum a tenth of it). The checkpoint goes to ``out``
    (default ``data/checkpoints/NAME.pt``) with its training record in ``meta``. Returns
    ``(path, meta)``. Raises ValueError for a bad preset, step count or a checkpoint of
    another vocabulary, FileNotFoundError for a missing checkpoint.
    """
    if name not in TRAIN_PRESETS:
        raise ValueError(f"preset must be one of {sorted(TRAIN_PRESETS)}; got {name!r}")
    if steps is not None:
        check_int(steps, "steps")
    tok = D.CharTokenizer()
    train_ids, val_ids = D.corpus_split(tok)
    config = preset(name, tok.vocab_size)
    tc = TRAIN_PRESETS[name]
    tc = replace(tc, seed=seed, steps=steps if steps is not None else tc.steps)
    tc = replace(tc, distill_loss=distill_loss)
    if lr is not None:
        tc = replace(tc, lr=lr, min_lr=lr / 10)
    tc = replace(tc, eval_interval=min(tc.eval_interval, tc.steps))
    out = Path(out) if out else checkpoints_dir() / f"{name}.pt"

    init = teacher = None
    meta: dict = {}
    if init_from:
        init, ck = load_checkpoint(init_from, rebuild=rebuild_command(name))
        if ck["vocab"] != tok.vocab:
            raise ValueError(f"init_from {init_from} has another vocabulary")
        meta["init_from"] = str(init_from)
        # Carry the earlier training's record, so the shipped file tells its whole story.
        meta["init_meta"] = {k: v for k, v in ck["meta"].items() if k != "history"}
    if distill_from:
        teacher, ck = load_checkpoint(distill_from, rebuild=rebuild_command("target"))
        if ck["vocab"] != tok.vocab:
            raise ValueError(f"distill_from {distill_from} has another vocabulary")
        meta["distilled_from"] = str(distill_from)
        if init is not None:
            before = pair_stats(teacher, init, val_ids, n_windows=4)
            meta["alpha_before_distill"] = before.alpha
            meta["tv_mean_before_distill"] = before.tv_mean

    res = train(
        config,
        tc,
        train_ids,
        val_ids,
        teacher=teacher,
        init=init,
        desc=f"{name}{' (distill)' if teacher is not None else ''}",
    )
    val = estimate_loss(res.model, val_ids)
    meta.update(
        preset=name,
        params=res.model.num_parameters(),
        train=asdict(tc),
        threads=torch.get_num_threads(),
        train_seconds=round(res.seconds, 1),
        val_loss=val,
        history={"val_step": res.history["val_step"], "val_loss": res.history["val_loss"]},
    )
    if teacher is not None:
        after = pair_stats(teacher, res.model, val_ids, n_windows=4)
        meta["alpha_vs_teacher"] = after.alpha
        meta["tv_mean_vs_teacher"] = after.tv_mean
    save_checkpoint(out, res.model, tok.vocab, meta)
    return out, meta
