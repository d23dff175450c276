"""Tools around training: export, predict to CSV, presets, TensorBoard images and hparams."""

from __future__ import annotations

import contextlib
import csv
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from datamodules.fortunes import build as build_fortunes
from datamodules.idx import read_idx
from tests.conftest import ROOT, run_cli
from train import TemplateCLI

QUICK = [
    "--trainer.max_epochs=1", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2",
    "--trainer.limit_test_batches=2", "--trainer.enable_progress_bar=false", "--test_after_fit=false",
]  # fmt: skip
PRESETS = sorted((ROOT / "configs" / "presets").glob("*.yaml"))


def _checkpoint(workdir: Path, name: str) -> Path:
    return next((workdir / "logs" / name / "version_0" / "checkpoints").glob("epoch=*.ckpt"))


FAMILIES = {
    "simple_cnn": [],
    "resnet_fmnist_scratch": [],
    "vit_fashion_mnist": ["--model.depth=1"],
    "transformer_text": ["--model.depth=1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_export_round_trips_for_each_model_family(name: str, tmp_path: Path, fashion_mnist_dir) -> None:
    if name == "transformer_text":
        build_fortunes(tmp_path / "data" / "fortunes", topics=("computers", "food", "startrek"))
    config = ["--config", str(ROOT / f"configs/{name}.yaml"), *FAMILIES[name]]
    run_cli("fit", *config, *QUICK, cwd=tmp_path)
    result = subprocess.run(
        [sys.executable, str(ROOT / "export.py"), *config, f"--ckpt_path={_checkpoint(tmp_path, name)}", "--out=out"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    for kind, file in (("torchscript", "net.ts"), ("onnx", "net.onnx"), ("state_dict", "net_state_dict.pt")):
        assert f"{kind:<11} out/{file}  max |logit difference| = " in result.stdout
        assert (tmp_path / "out" / file).is_file()
    assert "FAILED" not in result.stdout
    print(result.stdout)  # the measured differences, visible with pytest -s


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_preset_runs_a_few_steps(preset: Path, tmp_path: Path, monkeypatch, fashion_mnist_dir) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), "--config", str(preset), *QUICK]
    if preset.name.startswith("amp"):  # GPU presets: the same precision machinery, on the CPU
        args += ["--trainer.accelerator=cpu", "--trainer.precision=bf16-mixed"]
    if preset.name == "overfit.yaml":
        args += ["--trainer.max_epochs=2"]
    if preset.name == "lr_find.yaml":  # the sweep needs its 100 steps
        args += ["--trainer.limit_train_batches=100"]
    cli = TemplateCLI(args=args)
    assert cli.trainer.global_step > 0
    if preset.name == "lr_find.yaml":
        assert cli.model.hparams.lr != 0.002  # the suggestion replaced the configured lr
    if preset.name == "profile_torch.yaml":
        assert list((tmp_path / "logs" / "profile").glob("*trace*"))


def test_fit_writes_images_hparams_and_scalars_tensorboard_can_list(tmp_path: Path, fashion_mnist_dir) -> None:
    args = [
        "--config",
        str(ROOT / "configs/simple_cnn.yaml"),
        *QUICK,
        "--data.augment=true",
        "--trainer.log_every_n_steps=1",
    ]
    run_cli("fit", *args, cwd=tmp_path)
    tags: dict[str, set[str]] = {"images": set(), "scalars": set(), "tensors": set(), "hparams": set()}
    for event_file in (tmp_path / "logs/simple_cnn/version_0").glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(event_file))
        accumulator.Reload()
        for kind in ("images", "scalars", "tensors"):
            tags[kind] |= set(accumulator.Tags()[kind])
        with contextlib.suppress(KeyError):  # only the file with the hparams summary has the plugin
            tags["hparams"] |= set(accumulator.PluginTagToContent("hparams"))
    assert {"train/augmented_batch", "val/confusion_matrix"} <= tags["images"]
    assert {"train_loss", "val_loss", "val_acc", "lr-AdamW/all", "final/val_acc"} <= tags["scalars"]
    assert "val/confusion_matrix/text_summary" in tags["tensors"]  # the table with class names
    assert "_hparams_/experiment" in tags["hparams"]  # the HPARAMS tab


def test_predict_on_an_image_folder_writes_names_and_probabilities(tmp_path: Path, fashion_mnist_dir: Path) -> None:
    images = read_idx(fashion_mnist_dir / "t10k-images-idx3-ubyte.gz")[:40]
    labels = read_idx(fashion_mnist_dir / "t10k-labels-idx1-ubyte.gz")[:40].tolist()
    for split in ("train", "val"):
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            folder = tmp_path / "images" / split / ("shoes" if label in (5, 7, 9) else "other")
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image.numpy()).save(folder / f"{i}.png")
    (tmp_path / "new").mkdir()
    for i in range(5):
        Image.fromarray(images[i].numpy()).save(tmp_path / "new" / f"photo{i}.png")
    common = [
        "--config", str(ROOT / "configs/resnet_finetune.yaml"), "--model.weights=null",
        f"--data.root={tmp_path / 'images'}", "--data.image_size=32", "--data.num_workers=0", "--data.batch_size=8",
    ]  # fmt: skip
    run_cli("fit", *common, *QUICK, cwd=tmp_path)
    run_cli(
        "predict", *common, f"--ckpt_path={_checkpoint(tmp_path, 'resnet_finetune')}",
        f"--data.predict_dir={tmp_path / 'new'}", "--trainer.callbacks+=callbacks.CSVPredictionWriter",
        f"--trainer.callbacks.output_file={tmp_path / 'predictions.csv'}", cwd=tmp_path,
    )  # fmt: skip
    with open(tmp_path / "predictions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [Path(r["input"]).name for r in rows] == [f"photo{i}.png" for i in range(5)]
    assert list(rows[0]) == ["input", "prediction", "probability", "p_other", "p_shoes"]
    assert all(r["prediction"] in {"other", "shoes"} for r in rows)
    assert all(abs(float(r["p_other"]) + float(r["p_shoes"]) - 1) < 1e-3 for r in rows)
