"""A real 2-process DDP run on CPU (gloo) through the ddp preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli


@pytest.mark.slow
def test_ddp_preset_runs_two_processes_and_rank_zero_reports(tmp_path: Path, fashion_mnist_dir) -> None:
    result = run_cli(
        "fit",
        "--config", str(ROOT / "configs/simple_cnn.yaml"),
        "--config", str(ROOT / "configs/presets/ddp.yaml"),
        "--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=10", "--trainer.limit_val_batches=4", "--trainer.limit_test_batches=4",
        "--trainer.enable_progress_bar=false",
        cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in output
    assert result.stdout.count("test accuracy:") == 1  # the summary comes from rank 0 only
    assert [p.name for p in (tmp_path / "logs" / "simple_cnn").iterdir()] == ["version_0"]
    assert (tmp_path / "logs" / "simple_cnn" / "version_0" / "checkpoints" / "last.ckpt").is_file()
