"""The tools' presets on the main job, a few steps each through train.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_template.engine.cli import ProjectCLI

from tests.conftest import ONE_EPOCH, ROOT


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["ema", "swa"])
def test_an_averaging_preset_checkpoints_the_average_beside_the_live_weights(preset: str, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = [
        "--config",
        str(ROOT / "configs/simple_cnn.yaml"),
        "--config",
        str(ROOT / f"configs/presets/{preset}.yaml"),
    ]
    assert ProjectCLI(args=["fit", *config, *ONE_EPOCH]).trainer.global_step > 0
    last = torch.load(tmp_path / "logs/simple_cnn/version_0/checkpoints/last.ckpt", weights_only=True)
    assert "current_model_state" in last and "averaging_state" in last


@pytest.mark.slow
def test_the_lr_finder_preset_trains_the_whole_run_at_its_suggestion(tmp_path: Path, monkeypatch) -> None:
    """Every group's peak lr is scaled to the suggestion, and the lr in use is the schedule's value for that peak
    (not the configured 0.002's)."""
    monkeypatch.chdir(tmp_path)
    config = ["--config", str(ROOT / "configs/simple_cnn.yaml"), "--config", str(ROOT / "configs/presets/lr_find.yaml")]
    sweep = ["--trainer.callbacks.init_args.num_training_steps=20", "--trainer.limit_train_batches=20"]
    cli = ProjectCLI(args=["fit", *config, *ONE_EPOCH, *sweep])
    suggestion = next(c for c in cli.trainer.callbacks if type(c).__name__ == "LRFinder").optimal_lr.suggestion()
    groups = cli.trainer.optimizers[0].param_groups
    assert suggestion != 0.002 and all(g["initial_lr"] == pytest.approx(suggestion) for g in groups)
    scheduler = cli.trainer.lr_scheduler_configs[0].scheduler
    assert groups[0]["lr"] == pytest.approx(suggestion * scheduler.get_lr()[0] / groups[0]["initial_lr"])
