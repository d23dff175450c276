"""The LR finder preset: the sweep over the steps there are, and the run then trains at the suggested rate."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_template.engine.cli import ProjectCLI

from tests.conftest import ONE_EPOCH, ROOT


@pytest.mark.slow
def test_lr_finder_with_fewer_batches_than_sweep_steps_sweeps_those(
    tmp_path: Path, monkeypatch, caplog, fashion_mnist_dir
) -> None:
    monkeypatch.chdir(tmp_path)
    configs = [f"--config={ROOT / 'configs' / name}" for name in ("simple_cnn.yaml", "presets/lr_find.yaml")]
    flags = ["--trainer.callbacks.init_args.num_training_steps=40", "--trainer.limit_train_batches=20"]
    cli = ProjectCLI(args=["fit", *configs, *ONE_EPOCH, *flags, "--trainer.logger=false"])
    finder = next(c for c in cli.trainer.callbacks if type(c).__name__ == "LRFinder")
    assert len(finder.optimal_lr.results["lr"]) == 20
    log = caplog.text
    assert "diverging loss" not in log and "fewer than num_training_steps 40: the sweep takes 20" in log
