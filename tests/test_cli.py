"""The CLI as a user runs it: configs, fit -> validate -> test, resume, TensorBoard output."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from datamodules import FashionMNISTDataModule
from datamodules.fortunes import build as build_fortunes
from models import SimpleCNN
from tests.conftest import ROOT, run_cli
from train import TemplateCLI

CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.yaml"))
PRESETS = sorted((ROOT / "configs" / "presets").glob("*.yaml"))
QUICK = [
    "--trainer.limit_train_batches=20",
    "--trainer.limit_val_batches=8",
    "--trainer.limit_test_batches=8",
    "--trainer.enable_progress_bar=false",
    "--trainer.log_every_n_steps=5",
]


# What a config needs from outside that this offline machine lacks: ImageNet weights, an image tree.
OFFLINE_OVERRIDES = {
    "resnet_finetune.yaml": ["--model.weights=null", "--data.root={tmp}"],
    "resnet_cifar10.yaml": ["--model.weights=null"],
}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_instantiates(config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("cat", "dog"):
        (tmp_path / "train" / name).mkdir(parents=True)
    if config.name == "transformer_text.yaml":
        build_fortunes(tmp_path / "data" / "fortunes")  # where the config looks, relative to the run
    overrides = [arg.format(tmp=tmp_path) for arg in OFFLINE_OVERRIDES.get(config.name, [])]
    cli = TemplateCLI(args=["--config", str(config), *overrides], run=False)
    assert cli.model.hparams.num_classes == cli.datamodule.num_classes  # linked, not typed twice
    for name in ("input_shape", "vocab_size", "pad_id", "max_length"):
        if hasattr(cli.datamodule, name) and name in cli.model.hparams:
            as_tuple = lambda value: tuple(value) if isinstance(value, (list, tuple)) else value  # noqa: E731
            assert as_tuple(cli.model.hparams[name]) == as_tuple(getattr(cli.datamodule, name)), name
    callback_types = {type(c) for c in cli.trainer.callbacks}
    assert {ModelCheckpoint, LearningRateMonitor} <= callback_types


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_preset_stacks_on_the_main_config(preset: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--config", str(ROOT / "configs" / "simple_cnn.yaml"), "--config", str(preset)]
    if "amp" in preset.name:  # GPU presets: check the precision they ask for, on the CPU
        args += ["--trainer.accelerator=cpu", "--trainer.precision=bf16-mixed"]
    cli = TemplateCLI(args=args, run=False)
    assert isinstance(cli.model, SimpleCNN) and isinstance(cli.datamodule, FashionMNISTDataModule)


def _scalars(event_file: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(event_file))
    accumulator.Reload()
    return accumulator


def _scalar_tags(log_dir: Path) -> set[str]:
    return {tag for f in log_dir.glob("events.out.tfevents.*") for tag in _scalars(f).Tags()["scalars"]}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory, fashion_mnist_dir) -> tuple[Path, str]:
    """One short real run of the main config (2 epochs x 20 batches), shared by the tests below."""
    workdir = tmp_path_factory.mktemp("run")
    result = run_cli(
        "fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), "--trainer.max_epochs=2", *QUICK, cwd=workdir
    )
    return workdir, result.stdout


def test_fit_reports_test_accuracy_checkpoint_and_logs(fitted: tuple[Path, str]) -> None:
    workdir, stdout = fitted
    run_dir = workdir / "logs" / "simple_cnn" / "version_0"
    assert re.search(r"test accuracy: 0\.\d{4}", stdout)
    assert "TensorBoard logs: tensorboard --logdir logs/simple_cnn/version_0" in stdout
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert (run_dir / "config.yaml").is_file()
    assert {"train_loss", "val_loss", "val_acc", "train_acc", "lr-AdamW/all"} <= _scalar_tags(run_dir)


def test_validate_reproduces_best_checkpoint_score(fitted: tuple[Path, str]) -> None:
    workdir, _ = fitted
    checkpoints = workdir / "logs" / "simple_cnn" / "version_0" / "checkpoints"
    best = next(p for p in checkpoints.glob("epoch=*.ckpt"))
    saved = torch.load(best, weights_only=False)
    callback_state = next(v for k, v in saved["callbacks"].items() if k.startswith("ModelCheckpoint"))
    result = run_cli(
        "validate", "--config", str(ROOT / "configs/simple_cnn.yaml"), f"--ckpt_path={best}", *QUICK, cwd=workdir
    )
    val_acc = float(re.search(r"val_acc\s+([0-9.]+)", result.stdout).group(1))
    assert val_acc == pytest.approx(callback_state["best_model_score"].item(), abs=1e-6)


def test_fit_resumes_from_last_at_the_next_epoch(fitted: tuple[Path, str]) -> None:
    workdir, _ = fitted
    run_dir = workdir / "logs" / "simple_cnn" / "version_0"
    before = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert before["global_step"] == 40
    old_event_files = set(run_dir.glob("events.out.tfevents.*"))
    old_versions = set(run_dir.parent.iterdir())
    result = run_cli(
        "fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), "--ckpt_path=last", "--trainer.max_epochs=3",
        "--test_after_fit=false", *QUICK, cwd=workdir,
    )  # fmt: skip
    assert "Restoring states from the checkpoint path at logs/simple_cnn/version_0/checkpoints/last.ckpt" in (
        result.stdout + result.stderr
    )
    after = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert after["global_step"] == 60
    assert set(run_dir.parent.iterdir()) == old_versions  # the same run folder continues
    # The resumed process trained only the third epoch: its logged steps start after step 40.
    new_event_files = set(run_dir.glob("events.out.tfevents.*")) - old_event_files
    accumulators = [_scalars(f) for f in new_event_files]
    steps = [e.step for a in accumulators if "train_loss" in a.Tags()["scalars"] for e in a.Scalars("train_loss")]
    assert steps and min(steps) > 40 and max(steps) < 60


def test_unknown_option_is_rejected_with_its_name(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        TemplateCLI(args=["--config", str(ROOT / "configs/simple_cnn.yaml"), "--model.init_args.lrr=0.1"], run=False)
    assert "lrr" in capsys.readouterr().err


def test_optimizer_flag_of_lightning_cli_is_refused(tmp_path: Path) -> None:
    # The model builds its optimizer (named param groups that TwoStageFinetuning extends); a
    # CLI-level --optimizer would silently replace it, so it is not accepted.
    config = str(ROOT / "configs/resnet_fmnist_transfer.yaml")
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "fit", "--config", config, "--optimizer=SGD"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and "unrecognized arguments: --optimizer=SGD" in result.stderr
