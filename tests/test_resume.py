"""Exact resume: an interrupted run, resumed with its checkpoint, ends bit-identical to one never stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from callbacks import ExactResume
from datamodules import FashionMNISTDataModule
from models import SimpleCNN
from tests.conftest import ROOT, run_cli
from tests.helpers import SignalAtBatch, StopAfterEpoch


def _run(directory: Path, *callbacks, ckpt_path: str | None = None) -> Trainer:
    seed_everything(3)
    datamodule = FashionMNISTDataModule(batch_size=32, augment=True)
    model = SimpleCNN(warmup_epochs=0.5)  # dropout + augmentation + shuffling all draw random numbers
    last = ModelCheckpoint(dirpath=directory, filename="last", enable_version_counter=False, save_on_exception=True)
    trainer = Trainer(
        max_epochs=3, limit_train_batches=8, limit_val_batches=2, logger=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True, callbacks=[last, ExactResume(), *callbacks],
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, fashion_mnist_dir) -> Trainer:
    return _run(tmp_path_factory.mktemp("full"))


def _assert_same_end(expected: Trainer, actual: Trainer) -> None:
    assert actual.global_step == expected.global_step == 24
    a, b = expected.lightning_module.state_dict(), actual.lightning_module.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert actual.callback_metrics["val_loss"].item() == expected.callback_metrics["val_loss"].item()


def test_stopped_after_an_epoch(tmp_path: Path, uninterrupted: Trainer) -> None:
    _run(tmp_path, StopAfterEpoch(1))
    _assert_same_end(uninterrupted, _run(tmp_path, ckpt_path=str(tmp_path / "last.ckpt")))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_mid_epoch_saves_a_checkpoint_that_resumes_exactly(tmp_path: Path, uninterrupted, signum) -> None:
    with pytest.raises(SystemExit):  # Lightning's graceful stop after the current batch
        _run(tmp_path, SignalAtBatch(epoch=1, batch=4, signum=signum))
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert checkpoint["global_step"] == 8 + 5  # saved mid-epoch, right after the interrupted batch
    _assert_same_end(uninterrupted, _run(tmp_path, ckpt_path=str(tmp_path / "last.ckpt")))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C handler restored


def test_interrupted_checkpoint_write_leaves_the_previous_file_intact(tmp_path: Path, fashion_mnist_dir) -> None:
    _run(tmp_path, StopAfterEpoch(0))
    before = (tmp_path / "last.ckpt").read_bytes()
    import fsspec.implementations.local as local

    original = local.LocalFileOpener.write

    def write_half_then_crash(self, data):
        original(self, data[: len(data) // 2])
        raise OSError("disk full")

    local.LocalFileOpener.write = write_half_then_crash
    try:
        with pytest.raises(OSError, match="disk full"):
            _run(tmp_path, ckpt_path=str(tmp_path / "last.ckpt"))
    finally:
        local.LocalFileOpener.write = original
    assert (tmp_path / "last.ckpt").read_bytes() == before  # written to a temporary file, renamed only when complete
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 8


@pytest.mark.slow
def test_hard_kill_between_checkpoints_resumes_exactly(tmp_path: Path, fashion_mnist_dir) -> None:
    """SIGKILL (no chance to save) somewhere after epoch 0's checkpoint; resume from last.ckpt."""
    args = [
        "fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), "--trainer.max_epochs=3",
        "--trainer.limit_train_batches=60", "--trainer.limit_val_batches=4", "--trainer.enable_progress_bar=false",
        "--trainer.deterministic=true", "--test_after_fit=false", "--data.augment=true",
    ]  # fmt: skip
    (tmp_path / "full").mkdir()
    run_cli(*args, cwd=tmp_path / "full")
    (tmp_path / "killed").mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path / "killed", env=env)
    last = tmp_path / "killed/logs/simple_cnn/version_0/checkpoints/last.ckpt"
    deadline = time.time() + 120
    while not last.exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # well into epoch 1
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert torch.load(last, weights_only=False)["global_step"] == 60
    run_cli(*args, "--ckpt_path=last", cwd=tmp_path / "killed")
    full = torch.load(tmp_path / "full/logs/simple_cnn/version_0/checkpoints/last.ckpt", weights_only=False)
    resumed = torch.load(last, weights_only=False)
    assert resumed["global_step"] == full["global_step"] == 180
    assert all(torch.equal(full["state_dict"][k], resumed["state_dict"][k]) for k in full["state_dict"])
