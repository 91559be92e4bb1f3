"""Checkpoints: save, load (``weights_only=True``), and the shipped target and draft."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

import torch

from ..devices import DeviceLike
from ..devices import device as pick_device
from ..paths import checkpoints_dir
from .checks import check_model
from .config import PRESETS, GPTConfig
from .gpt import CharGPT


def rebuild_command(name: str) -> str:
    """The command that rebuilds the shipped file of ``specdec-course train --preset name``
    ("target", "draft", "medusa", "eagle", "fused", "recurrent", "ngram") in
    ``data/checkpoints/`` (``--record``: without it, ``train`` writes to the scratch folder).
    Every "rebuild it with" message of a shipped file quotes it."""
    if name == "draft":
        distill = (
            "specdec-course train --preset draft --record --init-from data/checkpoints/draft.pt "
            "--distill-from data/checkpoints/target.pt"
        )
        return (
            f"specdec-course train --preset draft --record && {distill} && "
            f"{distill} --distill-loss tv --lr 1e-3 --steps 2500"
        )
    return f"specdec-course train --preset {name} --record"


def save_checkpoint(path: str | Path, model: CharGPT, vocab: str, meta: dict | None = None) -> Path:
    """Write ``{"config", "state_dict", "vocab", "meta"}`` to ``path`` (parents created).

    ``vocab`` is the tokenizer's symbols in id order; ``meta`` holds plain numbers and strings
    (steps, seed, validation loss) so that ``torch.load(weights_only=True)`` can read it.
    """
    check_model(model)
    if not isinstance(vocab, str) or len(vocab) != model.config.vocab_size:
        raise ValueError(f"vocab must be a str of {model.config.vocab_size} symbols")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().cpu().clone()
        for k, v in model.state_dict().items()
        if k != "transformer.wte.weight"
    }  # tied to lm_head.weight: stored once
    torch.save(
        {
            "config": asdict(model.config),
            "state_dict": state,
            "vocab": vocab,
            "meta": dict(meta or {}),
        },
        path,
    )
    return path


def load_checkpoint(
    path: str | Path, *, rebuild: str | None = None, device: DeviceLike = "cpu"
) -> tuple[CharGPT, dict]:
    """Load a checkpoint written by ``save_checkpoint``: ``(model in eval mode, checkpoint)``.

    The model is on ``device`` (``"cpu"``, ``"cuda"``, or None for a GPU when there is one).
    The returned dict has ``config``, ``vocab`` and ``meta``. Raises FileNotFoundError for a
    missing file and ValueError for a file that is not a readable checkpoint (both say how
    to rebuild it; ``rebuild`` is the command to print) or a device this machine lacks.
    """
    dev = pick_device(device)
    path = Path(path)
    how = rebuild or "specdec-course train --preset target|draft --out PATH"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found; rebuild it with: {how}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        known = {f.name for f in fields(GPTConfig)}
        config = GPTConfig(**{k: v for k, v in ckpt["config"].items() if k in known})
        model = CharGPT(config)
        state = dict(ckpt["state_dict"])
        state.setdefault("transformer.wte.weight", state["lm_head.weight"])
        model.load_state_dict(state)
        vocab = ckpt["vocab"]
    except Exception as e:  # any corruption: truncated zip, wrong keys, wrong shapes
        raise ValueError(
            f"checkpoint {path} could not be read ({type(e).__name__}: {str(e)[:200]}); "
            f"delete it and rebuild it with: {how}"
        ) from None
    model.eval().to(dev)
    return model, {"config": config, "vocab": vocab, "meta": dict(ckpt.get("meta", {}))}


def load_pretrained(name: str, *, device: DeviceLike = "cpu") -> CharGPT:
    """The shipped ``"target"`` or ``"draft"`` model from ``data/checkpoints/``, in eval mode,
    on ``device`` (``"cpu"``, ``"cuda"``, or None for a GPU when there is one).

    The tokenizer is ``specdec_course.data.CharTokenizer(model.vocab)``; training metadata is
    ``model.meta``. Raises ValueError for another name or a device this machine lacks,
    FileNotFoundError (with the command that rebuilds it) for a missing file, ValueError for
    a corrupt one.
    """
    if name not in PRESETS:
        raise ValueError(
            f"name must be 'target' or 'draft'; got {name!r} (Medusa heads load from "
            "specdec_course.medusa.load_heads())"
        )
    model, ckpt = load_checkpoint(
        checkpoints_dir() / f"{name}.pt", rebuild=rebuild_command(name), device=device
    )
    model.vocab = ckpt["vocab"]
    model.meta = ckpt["meta"]
    return model
