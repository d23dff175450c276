"""Bad input and failing runs: each gives an error that names the file or option and the fix."""

from __future__ import annotations

import gzip
import shutil
import struct
from pathlib import Path

import pytest
import torch
from lightning import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from callbacks import FiniteLossGuard, NonFiniteLossError
from datamodules import FashionMNISTDataModule
from datamodules.idx import ALL_FILES
from models import ResNetClassifier, SimpleCNN
from tests.conftest import ROOT
from train import TemplateCLI


def _trainer(**kwargs) -> Trainer:
    defaults = dict(max_epochs=1, limit_train_batches=30, limit_val_batches=1, logger=False, enable_progress_bar=False)
    return Trainer(**{**defaults, "enable_model_summary": False, **kwargs})


def test_nan_loss_stops_the_run_naming_step_and_causes(tmp_path: Path, fashion_mnist_dir) -> None:
    seed_everything(0)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = _trainer(callbacks=[FiniteLossGuard(), checkpoint])
    model = SimpleCNN(optimizer="sgd", lr=1e3, schedule="constant")  # diverges within a few steps
    with pytest.raises(NonFiniteLossError) as err:
        trainer.fit(model, datamodule=FashionMNISTDataModule())
    message = str(err.value)
    assert "Loss became nan in epoch 0, batch" in message
    assert "--model.lr" in message and "normalized" in message and "labels outside" in message
    assert trainer.global_step < 30  # stopped at once, not at the end of the epoch
    assert not list(tmp_path.glob("*.ckpt"))  # no checkpoint of NaN weights was written


def test_label_outside_the_classes_names_split_and_examples(tmp_path: Path, fashion_mnist_dir: Path) -> None:
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ALL_FILES:
        shutil.copy(fashion_mnist_dir / f"{name}.gz", raw / f"{name}.gz")
    labels = bytearray(gzip.decompress((raw / "t10k-labels-idx1-ubyte.gz").read_bytes()))
    labels[8 + 17] = 12  # IDX header is 8 bytes; class 12 does not exist
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes(labels)))
    with pytest.raises(ValueError, match=r"test labels: 1 outside \[0, 10\), e\.g\. \[12\]"):
        FashionMNISTDataModule(data_dir=str(tmp_path)).setup("fit")


def test_data_dir_without_the_dataset_offline(tmp_path: Path, monkeypatch) -> None:
    import torchvision

    monkeypatch.setattr(torchvision.datasets.FashionMNIST, "mirrors", ["http://127.0.0.1:9/"])
    monkeypatch.setattr(FashionMNISTDataModule, "system_dirs", ())
    with pytest.raises(FileNotFoundError, match=r"Fix: put train-images-idx3-ubyte\.gz"):
        FashionMNISTDataModule(data_dir=str(tmp_path / "missing")).prepare_data()


def test_idx_header_that_lies_about_its_size(tmp_path: Path) -> None:
    from datamodules.idx import read_idx

    (tmp_path / "x-idx1-ubyte").write_bytes(struct.pack(">BBBBI", 0, 0, 8, 1, 1000) + b"\x01" * 10)
    with pytest.raises(ValueError, match=r"x-idx1-ubyte: truncated or corrupt \(18 bytes, header says 1008\)"):
        read_idx(tmp_path / "x-idx1-ubyte")


@pytest.fixture(scope="module")
def simple_cnn_checkpoint(tmp_path_factory, fashion_mnist_dir) -> Path:
    directory = tmp_path_factory.mktemp("ckpt")
    _trainer(limit_train_batches=2, callbacks=[ModelCheckpoint(dirpath=directory)]).fit(
        SimpleCNN(), datamodule=FashionMNISTDataModule()
    )
    return next(directory.glob("*.ckpt"))


def test_checkpoint_of_another_model_lists_the_mismatched_keys(simple_cnn_checkpoint: Path) -> None:
    trainer = _trainer()
    model = ResNetClassifier(num_classes=10, input_shape=(1, 28, 28))
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"net\.backbone\.conv1\.weight\""):
        trainer.validate(model, datamodule=FashionMNISTDataModule(), ckpt_path=simple_cnn_checkpoint)


def test_checkpoint_with_other_class_count_names_the_layer(simple_cnn_checkpoint: Path) -> None:
    datamodule = FashionMNISTDataModule(classes=[5, 6, 7, 8, 9])
    model = SimpleCNN(num_classes=datamodule.num_classes)
    with pytest.raises(RuntimeError, match=r"size mismatch for net\.head\.3\.weight"):
        _trainer().validate(model, datamodule=datamodule, ckpt_path=simple_cnn_checkpoint)


def test_corrupt_checkpoint_is_refused_before_anything_runs(simple_cnn_checkpoint: Path, tmp_path: Path) -> None:
    truncated = tmp_path / "cut.ckpt"
    truncated.write_bytes(simple_cnn_checkpoint.read_bytes()[:5000])
    args = ["validate", "--config", str(ROOT / "configs/simple_cnn.yaml")]
    with pytest.raises(ValueError, match=r"cut\.ckpt: not a readable PyTorch checkpoint \(truncated or corrupt\)"):
        TemplateCLI(args=[*args, f"--ckpt_path={truncated}"])
    with pytest.raises(FileNotFoundError, match=r"nope\.ckpt: no such file"):
        TemplateCLI(args=[*args, f"--ckpt_path={tmp_path / 'nope.ckpt'}"])


def test_weights_only_loading_of_outside_files(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self):
            return (print, ("code ran while loading",))

    torch.save({"conv1.weight": Payload()}, tmp_path / "evil.pth")
    from models.resnet import WeightsError

    with pytest.raises(WeightsError, match=r"evil\.pth: not a readable torch file"):
        ResNetClassifier(input_shape=(3, 32, 32), weights=str(tmp_path / "evil.pth"))
