"""Tools around training: presets, predict to CSV, TensorBoard images and hparams."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from PIL import Image

from lightning_template.engine.cli import ProjectCLI
from lightning_template.tasks.classification import FashionMNISTDataModule, ResNetClassifier

from tests.conftest import ONE_EPOCH, ROOT, best_checkpoint, run_cli, save_random_weights
from tests.helpers import event_tags
from tests.test_layers import EXTRAS

# transfer.yaml needs weights (tests/test_finetuning.py); an extra's presets are its own tests'.
OWN_TESTS = {"configs/presets/transfer.yaml", "configs/presets/csv_logger.yaml"}
EXTRAS_FILES = {path for paths in EXTRAS.values() for path in paths}
PRESETS = [
    p for p in sorted((ROOT / "configs" / "presets").glob("*.yaml"))
    if p.relative_to(ROOT).as_posix() not in OWN_TESTS | EXTRAS_FILES
]  # fmt: skip


# ddp.yaml runs one process here, but still meets itself on a local port (the process group's rendezvous).
@pytest.mark.slow
@pytest.mark.parametrize(
    "preset",
    [pytest.param(p, marks=pytest.mark.processes if p.name == "ddp.yaml" else ()) for p in PRESETS],
    ids=lambda p: p.name,
)
def test_every_preset_runs_a_few_steps(preset: Path, tmp_path: Path, monkeypatch, fashion_mnist_dir) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), "--config", str(preset), *ONE_EPOCH]
    if preset.name.startswith("amp"):  # GPU presets: the same precision machinery, on the CPU
        args += ["--trainer.accelerator=cpu", "--trainer.precision=bf16-mixed"]
    if preset.name == "ddp.yaml":  # one process here; tests/test_ddp.py starts real ones
        args += ["--trainer.accelerator=cpu", "--trainer.devices=1"]
    if preset.name == "overfit.yaml":
        args += ["--trainer.max_epochs=2"]
    cli = ProjectCLI(args=args)
    assert cli.trainer.global_step > 0
    if preset.name == "profile_torch.yaml":
        assert list((tmp_path / "logs" / "profile").glob("*trace*"))


@pytest.mark.slow
def test_overfit_preset_drives_the_training_loss_to_zero(tmp_path: Path, monkeypatch, fashion_mnist_dir) -> None:
    monkeypatch.chdir(tmp_path)
    presets = ROOT / "configs" / "presets"
    configs = ["--config", str(ROOT / "configs/simple_cnn.yaml"), "--config", str(presets / "overfit.yaml")]
    flags = ["--trainer.overfit_batches=2", "--data.batch_size=32", "--trainer.enable_progress_bar=false"]
    flags += ["--test_after_fit=false"]
    cli = ProjectCLI(args=["fit", *configs, *flags])
    assert cli.trainer.callback_metrics["train_loss"].item() < 0.01  # stopped by the threshold, not early stopping
    assert cli.trainer.current_epoch < 200


@pytest.mark.slow
def test_fit_writes_images_hparams_and_scalars_tensorboard_can_list(main_run: Path) -> None:
    run_dir = main_run / "logs/simple_cnn/version_0"
    assert {"train/augmented_batch", "val/confusion_matrix"} <= event_tags(run_dir, "images")
    assert {"train_loss", "val_loss", "val_acc", "lr-AdamW/head", "final/val_acc"} <= event_tags(run_dir)
    assert "val/confusion_matrix/text_summary" in event_tags(run_dir, "tensors")  # the table with class names
    assert "_hparams_/experiment" in event_tags(run_dir, "hparams")  # the HPARAMS tab


@pytest.mark.slow
def test_predict_with_the_main_config_writes_a_csv(main_run: Path, main_predictions) -> None:
    assert "predictions written to predictions.csv" in main_predictions.stdout
    with open(main_run / "predictions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    names = FashionMNISTDataModule.all_class_names
    assert len(rows) == 256 and rows[0]["input"] == "test[0]" and {r["prediction"] for r in rows} <= set(names)
    assert list(rows[0])[3:] == [f"p_{name}" for name in names]


@pytest.mark.slow
def test_predict_on_an_image_folder_writes_names_and_probabilities(tmp_path: Path, image_tree: Path) -> None:
    weights = save_random_weights(ResNetClassifier, tmp_path / "resnet18.pth")
    images = sorted((image_tree / "val" / "sneaker").glob("*.png"))[:5]
    (tmp_path / "new").mkdir()
    for i, path in enumerate(images):
        Image.open(path).save(tmp_path / "new" / f"photo{i}.png")
    common = [
        "--config", str(ROOT / "configs/resnet_finetune.yaml"), f"--model.weights={weights}",
        f"--data.root={image_tree}", "--data.image_size=32", "--data.num_workers=0", "--data.batch_size=8",
    ]  # fmt: skip
    run_cli("fit", *common, *ONE_EPOCH, cwd=tmp_path)
    run_cli(
        "predict", *common, f"--ckpt_path={best_checkpoint(tmp_path, 'resnet_finetune')}",
        f"--data.predict_dir={tmp_path / 'new'}", f"--predictions.output_file={tmp_path / 'out.csv'}", cwd=tmp_path,
    )  # fmt: skip
    with open(tmp_path / "out.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [Path(r["input"]).name for r in rows] == [f"photo{i}.png" for i in range(5)]
    assert list(rows[0]) == ["input", "prediction", "probability", "p_sneaker", "p_trouser", "p_tshirt"]
    assert all(abs(sum(float(r[f"p_{c}"]) for c in ("sneaker", "trouser", "tshirt")) - 1) < 1e-3 for r in rows)


@pytest.mark.slow
def test_predict_opens_no_run_folder_and_restores_no_checkpoint_callbacks(main_run: Path, main_predictions) -> None:
    assert [p.name for p in (main_run / "logs/simple_cnn").iterdir()] == ["version_0"]  # the fit's only
    assert "dirpath has changed" not in main_predictions.stderr
    assert not (main_run / "config.yaml").exists()
