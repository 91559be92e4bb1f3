"""``specdec-course train --preset NAME``: rebuild a shipped file (target, draft, medusa, eagle,
fused, recurrent, ngram)."""

from __future__ import annotations

from pathlib import Path

from . import set_threads


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a preset (target, draft, medusa, eagle, fused, recurrent, ngram)",
        description="Rebuild a shipped checkpoint on the CPU: the 4-layer target, the 1-layer "
        "draft (then distilled from the target with --init-from and --distill-from), or the "
        "Medusa heads or the EAGLE-style draft on the frozen shipped target, the fused draft's "
        "head on the frozen draft model and target, the recurrent EAGLE-style draft on the "
        "frozen target, or the n-gram "
        "table distilled from it (one forward pass over the training split). data/README.md "
        "gives the commands, their wall times and the figures they reach.",
    )
    p.add_argument(
        "--preset",
        required=True,
        choices=["target", "draft", "medusa", "eagle", "fused", "recurrent", "ngram"],
        help="what to train",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimiser steps, >= 1 (default: the preset's; 2000 for medusa's Medusa-1 heads, "
        "its Hydra heads take 10000 whatever --steps says; for eagle, overriding its first "
        "stage's skips its second)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="random seed of the initialisation and batches"
    )
    p.add_argument(
        "--out",
        default=None,
        help="checkpoint path (default: bench-results/checkpoints/, the git-ignored scratch "
        "folder; see --record)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="replace the shipped file in data/checkpoints/, which generate, the lessons and "
        "the tests load",
    )
    p.add_argument(
        "--distill-from", default=None, help="teacher checkpoint for the draft (not medusa)"
    )
    p.add_argument(
        "--init-from", default=None, help="start from this checkpoint's weights (not medusa)"
    )
    p.add_argument(
        "--distill-loss",
        choices=["kl", "tv"],
        default="kl",
        help="soft-label loss with --distill-from: kl, or tv (1 - acceptance rate)",
    )
    p.add_argument(
        "--lr", type=float, default=None, help="peak learning rate (default: the preset's)"
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    p.set_defaults(run=run)


def run(args) -> int:
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1; got {args.threads}")
        set_threads(args.threads)
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be >= 1; got {args.steps}")
    if args.preset in ("medusa", "eagle", "fused", "recurrent", "ngram"):
        _no_model_options(args)
    if args.record and args.out is not None:
        raise ValueError("--record writes to data/checkpoints/; --out elsewhere: give one of them")
    if not args.record and args.out is None:  # never the shipped file by accident
        args.out = str(_scratch_file(args.preset))
    for flag, value in (("--init-from", args.init_from), ("--distill-from", args.distill_from)):
        if value is not None and not Path(value).is_file():  # a typo, not a missing preset
            raise FileNotFoundError(
                f"{flag} {value}: no such file; check the path (the shipped checkpoints are "
                f"data/checkpoints/target.pt and draft.pt)"
            )
    if args.preset == "ngram":
        return _distil_ngram(args)
    if args.preset == "medusa":
        return _train_medusa(args)
    if args.preset == "eagle":
        return _train_eagle(args)
    if args.preset == "fused":
        return _train_fused(args)
    if args.preset == "recurrent":
        return _train_recurrent(args)
    from ..train import train_preset

    out, meta = train_preset(
        args.preset,
        steps=args.steps,
        seed=args.seed,
        out=args.out,
        init_from=args.init_from,
        distill_from=args.distill_from,
        distill_loss=args.distill_loss,
        lr=args.lr,
    )
    tc = meta["train"]
    print(
        f"{args.preset}: {meta['params']:,} parameters, {tc['steps']} steps in "
        f"{meta['train_seconds']:.1f} s, validation loss {meta['val_loss']:.4f} nats/char -> {out}"
    )
    if "alpha_vs_teacher" in meta:
        print(
            f"alpha vs teacher: {meta.get('alpha_before_distill', float('nan')):.4f} before, "
            f"{meta['alpha_vs_teacher']:.4f} after distillation"
        )
    return 0


def _scratch_file(preset: str) -> Path:
    """Where ``train --preset PRESET`` writes without ``--record`` or ``--out``."""
    from ..drafts.distilled import DISTILLED_FILE
    from ..paths import scratch_dir

    name = DISTILLED_FILE if preset == "ngram" else f"{preset}.pt"
    folder = scratch_dir() / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def _no_model_options(args) -> None:
    given = (
        ("--init-from", args.init_from),
        ("--distill-from", args.distill_from),
        ("--distill-loss", None if args.distill_loss == "kl" else args.distill_loss),
        ("--lr", args.lr),
    )
    for flag, value in given:
        if value is not None:
            raise ValueError(
                f"{flag} does not apply to --preset {args.preset}: it is built on the frozen "
                "shipped target (Medusa's heads start from its lm_head); drop the option"
            )


def _train_eagle(args) -> int:
    from ..drafts.eagle import train_shipped_eagle

    out, meta = train_shipped_eagle(steps=args.steps, seed=args.seed, out=args.out)
    print(
        f"eagle: {meta['params']:,} parameters, {meta['steps']} steps in "
        f"{meta['train_seconds']:.1f} s, "
        f"validation loss {meta['val_loss']:.4f}, alpha vs target {meta['alpha_vs_target']:.4f}"
        f" -> {out}"
    )
    return 0


def _train_medusa(args) -> int:
    from ..medusa import load_heads, train_shipped_heads

    steps = 2000 if args.steps is None else args.steps
    out, meta, acc = train_shipped_heads(steps=steps, seed=args.seed, out=args.out)
    print(
        f"medusa: {meta['n_heads']} heads, {meta['params']:,} parameters, {steps} steps "
        f"in {meta['train_seconds']:.1f} s -> {out}"
    )
    for k, a in enumerate(acc["heads"], start=1):
        print(f"  head {k} (t+{k + 1}): top-1 {a[1]:.4f}, top-5 {a[5]:.4f} on validation")
    hm = load_heads(out, kind="hydra").meta
    print(
        f"hydra: {hm['n_heads']} heads, {hm['params']:,} parameters, {hm['steps']} steps "
        f"in {hm['train_seconds']:.1f} s (same file)"
    )
    for k, (a, g) in enumerate(zip(hm["alpha"], hm["acceptance_greedy"]), start=1):
        print(f"  head {k}: sampled-draft acceptance {a:.4f}, top-1 = target argmax {g[0]:.4f}")
    return 0


def _distil_ngram(args) -> int:
    if args.steps is not None:
        raise ValueError("--steps does not apply to --preset ngram: it is one forward pass")
    from ..drafts.distilled import DISTILLED_FILE, DistilledNgramDraft
    from ..model import load_pretrained
    from ..paths import checkpoints_dir

    target = load_pretrained("target")
    draft = DistilledNgramDraft.from_target(target)
    out = draft.save(args.out or checkpoints_dir() / DISTILLED_FILE)
    m = draft.meta
    print(
        f"ngram: order {draft.order}, {m['contexts']:,} contexts distilled from "
        f"{m['positions']:,} training positions in {m['distil_seconds']:.1f} s -> {out}"
    )
    return 0


def _train_fused(args) -> int:
    from ..drafts.eagle import train_shipped_fused

    out, meta = train_shipped_fused(steps=args.steps, seed=args.seed, out=args.out)
    print(
        f"fused: {meta['params']:,} parameters, {meta['settings']['steps']} steps in "
        f"{meta['train_seconds']:.1f} s, alpha vs target {meta['alpha_vs_target']:.4f} "
        f"(the draft model alone: {meta['draft_alpha_by_depth'][0]:.4f}) -> {out}"
    )
    return 0


def _train_recurrent(args) -> int:
    from ..drafts.eagle import train_shipped_recurrent

    out, meta = train_shipped_recurrent(steps=args.steps, seed=args.seed, out=args.out)
    print(
        f"recurrent: {meta['params']:,} parameters, {meta['settings']['steps']} steps in "
        f"{meta['train_seconds']:.1f} s, alpha of the 1st / 4th / 8th draft "
        f"{meta['alpha_by_depth'][0]:.4f} / {meta['alpha_by_depth'][3]:.4f} / "
        f"{meta['alpha_by_depth'][7]:.4f} (the draft model on the same positions: "
        f"{meta['draft_alpha_by_depth'][0]:.4f} / {meta['draft_alpha_by_depth'][3]:.4f} / "
        f"{meta['draft_alpha_by_depth'][7]:.4f}) -> {out}"
    )
    return 0
