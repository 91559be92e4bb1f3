"""Training: schedule, reproducibility, the CLI, distillation, and the shipped pair."""

import math
from dataclasses import replace

import pytest
import torch

from specdec_course import data as D
from specdec_course.cli import main
from specdec_course.model import CharGPT, GPTConfig, load_checkpoint, load_pretrained, preset
from specdec_course.paths import checkpoints_dir
from specdec_course.train import (
    TrainConfig,
    estimate_loss,
    lr_at,
    pair_stats,
    train,
)

TINY = GPTConfig(vocab_size=65, block_size=32, n_layer=1, n_head=2, n_embd=16)
QUICK = TrainConfig(steps=6, batch_size=4, warmup=2, eval_interval=3, eval_windows=4)


def test_lr_warms_up_linearly_then_decays_to_min_lr():
    tc = TrainConfig(steps=100, lr=1e-2, min_lr=1e-3, warmup=10)
    lrs = [lr_at(s, tc) for s in range(tc.steps)]
    assert lrs[0] == pytest.approx(1e-3) and lrs[9] == pytest.approx(1e-2)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lr_at(100, tc) == pytest.approx(1e-3)


def test_train_config_rejects_nonsense():
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="min_lr"):
        TrainConfig(lr=1e-3, min_lr=1e-2)
    with pytest.raises(ValueError, match="distill_weight"):
        TrainConfig(distill_weight=1.5)


def test_training_with_the_same_seed_gives_the_same_model(split):
    a = train(TINY, QUICK, *split, progress=False).model
    b = train(TINY, QUICK, *split, progress=False).model
    c = train(TINY, replace(QUICK, seed=1), *split, progress=False).model
    assert all(torch.equal(u, v) for u, v in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_training_records_validation_loss_at_each_interval(split):
    res = train(TINY, QUICK, *split, progress=False)
    assert res.history["val_step"] == [3, 6]
    assert len(res.history["train_loss"]) == QUICK.steps
    assert all(math.isfinite(v) for v in res.history["val_loss"])


def test_untrained_model_loss_is_near_uniform(split):
    torch.manual_seed(0)
    loss = estimate_loss(CharGPT(TINY), split[1], 8)
    assert abs(loss - math.log(65)) < 0.1


def test_pair_stats_of_a_model_with_itself_is_full_agreement(split):
    torch.manual_seed(0)
    m = CharGPT(TINY).eval()
    s = pair_stats(m, m, split[1], n_windows=2)
    assert s.n_positions == 2 * TINY.block_size
    assert s.alpha == pytest.approx(1.0) and s.tv_worst == pytest.approx(0.0, abs=1e-12)
    s0 = pair_stats(m, m, split[1], n_windows=2, temperature=0)
    assert s0.alpha == 1.0


def test_pair_stats_alpha_is_one_minus_mean_tv(split):
    torch.manual_seed(0)
    a, b = CharGPT(TINY).eval(), CharGPT(TINY).eval()
    s = pair_stats(a, b, split[1], n_windows=2)
    assert s.alpha == pytest.approx(1 - s.tv_mean)
    assert s.tv_mean <= s.tv_worst <= 1


def test_pair_stats_per_position_distances_and_top_p(split):
    # The per-position TVs are the positions' own; top_p processes both models' logits as
    # the loops do (sampling.process_logits), and a nucleus keeps fewer tokens, so the two
    # models' distributions move (alpha changes) and stay distributions.
    from specdec_course.sampling import process_logits

    torch.manual_seed(0)
    a, b = CharGPT(TINY).eval(), CharGPT(TINY).eval()
    s = pair_stats(a, b, split[1], n_windows=2, top_p=0.5)
    x, _ = D.eval_windows(split[1], TINY.block_size, 2)
    with torch.no_grad():
        p = process_logits(a(x), 1.0, top_p=0.5).double()
        q = process_logits(b(x), 1.0, top_p=0.5).double()
    assert s.tv.shape == (2, TINY.block_size) and s.top_p == 0.5
    assert torch.allclose(s.tv, 0.5 * (p - q).abs().sum(-1), atol=1e-12)
    assert s.alpha == pytest.approx(float(p.minimum(q).sum(-1).mean()))
    assert s.tv_mean == pytest.approx(float(s.tv.mean()))
    assert s.alpha != pytest.approx(pair_stats(a, b, split[1], n_windows=2).alpha)


def test_pair_stats_rejects_models_with_different_vocabularies(split):
    a = CharGPT(TINY)
    b = CharGPT(replace(TINY, vocab_size=66))
    with pytest.raises(ValueError, match="vocab"):
        pair_stats(a, b, split[1])


def test_short_cli_training_lowers_loss_and_writes_a_loadable_checkpoint(tmp_path, split):
    out = tmp_path / "draft.pt"
    assert (
        main(["train", "--preset", "draft", "--steps", "40", "--out", str(out), "--threads", "1"])
        == 0
    )
    model, ck = load_checkpoint(out)
    assert ck["vocab"] == D.VOCAB and ck["meta"]["train"]["steps"] == 40
    torch.manual_seed(0)
    before = estimate_loss(CharGPT(model.config), split[1], 8)
    after = estimate_loss(model, split[1], 8)
    assert after < before - 0.3, (before, after)
    assert ck["meta"]["val_loss"] < before


def test_cli_distillation_records_alpha_before_and_after(tmp_path):
    student, teacher = tmp_path / "s.pt", tmp_path / "t.pt"
    assert main(["train", "--preset", "draft", "--steps", "5", "--out", str(student)]) == 0
    assert (
        main(["train", "--preset", "draft", "--steps", "10", "--seed", "1", "--out", str(teacher)])
        == 0
    )
    assert (
        main(
            [
                "train",
                "--preset",
                "draft",
                "--steps",
                "5",
                "--out",
                str(student),
                "--init-from",
                str(student),
                "--distill-from",
                str(teacher),
            ]
        )
        == 0
    )
    meta = load_checkpoint(student)[1]["meta"]
    assert 0 < meta["alpha_before_distill"] <= 1 and 0 < meta["alpha_vs_teacher"] <= 1
    assert meta["distilled_from"] == str(teacher)
    assert meta["init_meta"]["train"]["steps"] == 5


def test_tv_distillation_lowers_the_total_variation_to_the_teacher(split):
    # The "tv" soft loss is 1 - alpha itself: training on it must raise alpha to the teacher.
    teacher = train(
        preset("draft", 65), TrainConfig(steps=30, eval_interval=30), *split, progress=False
    ).model
    student = CharGPT(preset("draft", 65))
    before = pair_stats(teacher, student, split[1], n_windows=2).alpha
    tc = TrainConfig(steps=30, eval_interval=30, distill_loss="tv", lr=1e-2, seed=1)
    res = train(preset("draft", 65), tc, *split, teacher=teacher, init=student, progress=False)
    after = pair_stats(teacher, res.model, split[1], n_windows=2).alpha
    assert after > before + 0.1, (before, after)
    with pytest.raises(ValueError, match="distill_loss"):
        TrainConfig(distill_loss="js")


def test_cli_reports_a_missing_init_checkpoint(tmp_path, capsys):
    assert (
        main(
            [
                "train",
                "--preset",
                "draft",
                "--steps",
                "1",
                "--out",
                str(tmp_path / "x.pt"),
                "--init-from",
                str(tmp_path / "none.pt"),
            ]
        )
        == 2
    )
    # A typo in a path, not a missing shipped checkpoint: the file named, no retrain command.
    err = capsys.readouterr().err
    assert f"--init-from {tmp_path / 'none.pt'}: no such file; check the path" in err
    assert "specdec-course train --preset" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.pt").exists()


def test_cli_rejects_zero_steps(tmp_path):
    assert (
        main(["train", "--preset", "draft", "--steps", "0", "--out", str(tmp_path / "x.pt")]) == 2
    )


# ----------------------------------------------------------------------------- shipped pair
# The thresholds are the course's promises (target <= 1.65 nats/char, draft <= 2.00, alpha at
# temperature 1 >= 0.80); a fixed subset of the validation split keeps this quick.

SUBSET = 32  # validation windows of 256 characters: 8,192 positions


@pytest.fixture(scope="module")
def shipped():
    return load_pretrained("target"), load_pretrained("draft")


def test_shipped_checkpoints_load_in_eval_mode_with_the_corpus_vocabulary(shipped):
    for m in shipped:
        assert not m.training and m.vocab == D.VOCAB
    assert [m.config.n_layer for m in shipped] == [4, 1]


def test_shipped_target_reaches_its_validation_loss(shipped, split):
    assert estimate_loss(shipped[0], split[1], SUBSET) <= 1.65


def test_shipped_draft_reaches_its_validation_loss(shipped, split):
    assert estimate_loss(shipped[1], split[1], SUBSET) <= 2.00


def test_shipped_pair_accepts_at_least_80_percent_at_temperature_1(shipped, split):
    s = pair_stats(*shipped, split[1], n_windows=2)
    assert s.n_positions >= 400
    assert s.alpha >= 0.80


def test_shipped_draft_was_distilled_from_the_shipped_target(shipped):
    meta = shipped[1].meta
    assert meta["distilled_from"].endswith("target.pt")
    assert meta["alpha_before_distill"] < meta["alpha_vs_teacher"]


def test_shipped_checkpoint_files_are_at_most_3_mb():
    for name in ("target", "draft"):
        assert (checkpoints_dir() / f"{name}.pt").stat().st_size <= 3_000_000


def test_train_writes_to_the_scratch_folder_unless_told_to_replace_a_shipped_file(
    tmp_path, monkeypatch, capsys
):
    # A documented command leaves `git status` clean: without --record (or --out) the
    # checkpoint goes to the git-ignored scratch folder, never over data/checkpoints/.
    from specdec_course.paths import checkpoints_dir

    shipped = checkpoints_dir() / "draft.pt"
    before = shipped.stat().st_mtime_ns, shipped.read_bytes()
    monkeypatch.setenv("SPECDEC_SCRATCH", str(tmp_path))
    assert main(["train", "--preset", "draft", "--steps", "2", "--threads", "1"]) == 0
    assert (tmp_path / "checkpoints" / "draft.pt").is_file()
    assert str(tmp_path / "checkpoints" / "draft.pt") in capsys.readouterr().out
    assert (shipped.stat().st_mtime_ns, shipped.read_bytes()) == before
    assert main(["train", "--preset", "draft", "--record", "--out", str(tmp_path / "x.pt")]) == 2
    err = capsys.readouterr().err
    assert "--record" in err and "--out" in err and len(err.strip().splitlines()) == 1
