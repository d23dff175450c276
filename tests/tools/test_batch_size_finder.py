"""The batch-size finder preset: the batch grows for fit, and a resumed run keeps it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_template.engine.cli import ProjectCLI

from tests.conftest import QUICK, ROOT

JOB = ["--config", str(ROOT / "configs/simple_cnn.yaml")]


@pytest.mark.slow
def test_batch_size_finder_grows_the_batch_for_fit_and_a_resumed_run_keeps_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    preset = ["--config", str(ROOT / "configs/presets/batch_size_finder.yaml")]
    flags = [*QUICK, "--trainer.callbacks.init_args.max_trials=2", "--data.batch_size=16", "--test_after_fit=true"]
    flags += ["--trainer.limit_train_batches=1.0", "--data.train_samples_per_class=16"]  # 10 batches of 16, 5 of 32
    cli = ProjectCLI(args=["fit", *JOB, *preset, *flags, "--trainer.max_epochs=1"])
    assert cli.datamodule.batch_size == 32
    # The cosine schedule was rebuilt for 5 steps an epoch, not the 10 of the configured size: it ends at 0.
    assert cli.trainer.global_step == 5
    assert cli.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0, abs=1e-9)
    assert "test_acc" in cli.trainer.callback_metrics  # the test stage ran without searching again
    last = tmp_path / "logs/simple_cnn/version_0/checkpoints/last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["callbacks"]["FitBatchSizeFinder"] == {"found": 32}
    assert checkpoint["callbacks"]["ResumableBatches"]["batch_size"] == 32  # what training ran with
    resumed = ProjectCLI(args=["fit", *JOB, *preset, *flags, "--trainer.max_epochs=2", f"--ckpt_path={last}"])
    assert resumed.trainer.current_epoch == 2 and resumed.trainer.global_step == 10
    resumed_last = Path(resumed.trainer.checkpoint_callbacks[-1].dirpath) / "last.ckpt"
    assert resumed_last != last and resumed_last.is_file()
    assert torch.load(resumed_last, weights_only=True)["callbacks"]["ResumableBatches"]["batch_size"] == 32
