"""ImageFolder and CIFAR-10 datamodules on real Fashion-MNIST images written in their file formats."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from lightning_template.engine.cli import ProjectCLI, project_error
from lightning_template.tasks.classification import CIFAR10DataModule, ImageFolderDataModule, SimpleCNN
from lightning_template.tasks.classification.data.files import DatasetNotFoundError
from lightning_template.tasks.classification.data.idx import read_idx
from lightning_template.tasks.classification.data.image_folder import CorruptImageError, compute_mean_std

from tests.conftest import ROOT

CLASSES = {0: "tshirt", 1: "trouser", 7: "sneaker"}


@pytest.fixture(scope="module")
def fmnist(fashion_mnist_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    images = read_idx(fashion_mnist_dir / "t10k-images-idx3-ubyte.gz")[:600]
    labels = read_idx(fashion_mnist_dir / "t10k-labels-idx1-ubyte.gz")[:600].long()
    return images, labels


@pytest.fixture
def image_root(tmp_path: Path, fmnist) -> Path:
    """train/ and val/ with PNG and JPEG files of real clothing images, one corrupt file, one empty class."""
    images, labels = fmnist
    for split, start in (("train", 0), ("val", 300)):
        for label, name in CLASSES.items():
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            picks = (labels[start:] == label).nonzero().flatten()[:6] + start
            for i, index in enumerate(picks.tolist()):
                suffix = ".png" if i % 2 else ".jpg"
                Image.fromarray(images[index].numpy()).convert("RGB").save(folder / f"{index}{suffix}")
    (tmp_path / "train" / "tshirt" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    (tmp_path / "train" / "zz_empty").mkdir()
    (tmp_path / "val" / "zz_empty").mkdir()
    return tmp_path


def test_classes_come_from_train_and_include_an_empty_one(image_root: Path, caplog) -> None:
    dm = ImageFolderDataModule(root=str(image_root), image_size=32, batch_size=4, num_workers=0)
    assert dm.class_names == ["sneaker", "trouser", "tshirt", "zz_empty"] and dm.num_classes == 4
    with caplog.at_level(logging.WARNING):
        dm.setup("fit")
    assert f"{image_root / 'train' / 'zz_empty'} has no images" in caplog.text
    assert dm.splits["val"].class_to_idx == dm.splits["train"].class_to_idx


def test_corrupt_file_is_skipped_and_named(image_root: Path, caplog) -> None:
    dm = ImageFolderDataModule(root=str(image_root), image_size=32, batch_size=64, num_workers=0)
    dm.setup("fit")
    with caplog.at_level(logging.WARNING):
        (images, labels) = next(iter(dm.train_dataloader()))
    assert images.shape == (18, 3, 32, 32) and images.dtype == torch.float32  # 19 files, one skipped
    assert sorted(labels.bincount().tolist()) == [6, 6, 6]
    assert "broken.jpg: cannot be decoded as an image" in caplog.text


@pytest.mark.slow  # torch takes 5 s to shut a loader's workers down after one of them raised
def test_corrupt_file_stops_the_run_when_asked_also_from_a_worker(image_root: Path) -> None:
    dm = ImageFolderDataModule(root=str(image_root), image_size=8, batch_size=64, num_workers=2, on_corrupt="error")
    dm.setup("fit")
    with pytest.raises(CorruptImageError, match=r"broken\.jpg: cannot be decoded"):
        next(iter(dm.train_dataloader()))


@pytest.mark.slow
def test_eval_transform_is_deterministic_and_train_is_random(image_root: Path) -> None:
    dm = ImageFolderDataModule(root=str(image_root), image_size=24, batch_size=4, num_workers=0)
    dm.setup("fit")
    first, second = dm.splits["val"][0][0], dm.splits["val"][0][0]
    assert torch.equal(first, second) and first.shape == (3, 24, 24)
    samples = [dm.splits["train"][1][0] for _ in range(5)]
    assert any(not torch.equal(samples[0], s) for s in samples[1:])


@pytest.mark.slow
def test_augmentation_of_image_folders_is_set_by_flags(image_root: Path, monkeypatch, capsys) -> None:
    base = {"root": str(image_root), "image_size": 28, "num_workers": 0}
    off = ImageFolderDataModule(**base, augment=False)
    assert off.train_transform is off.eval_transform
    whole = {"crop_scale": (1.0, 1.0), "crop_ratio": (1.0, 1.0)}  # the whole 28x28 image: only the flips change it
    dm = ImageFolderDataModule(**base, **whole, horizontal_flip=False, vertical_flip=True)
    dm.setup("fit")
    image = dm.splits["train"].loader(dm.splits["train"].samples[1][0])
    reference = torchvision.transforms.v2.functional.pil_to_tensor(image)
    drawn = [dm.train_transform(image) for _ in range(16)]
    assert {torch.equal(d, reference) for d in drawn} == {True, False}  # flipped at random...
    assert all(torch.equal(d, reference) or torch.equal(d, reference.flip(1)) for d in drawn)  # ...upside down only
    with pytest.raises(ValueError, match=r"--data.crop_scale \[0.5, 0.2\]"):
        ImageFolderDataModule(**base, crop_scale=(0.5, 0.2))
    monkeypatch.chdir(image_root)
    with pytest.raises(SystemExit):  # the options of train.py
        ProjectCLI(args=["fit", "--config", str(ROOT / "configs/resnet_finetune.yaml"), "--data.crop_scale=[0.3, 1]",
                          "--data.horizontal_flip=false", "--data.augment=true", "--print_config"])  # fmt: skip
    printed = capsys.readouterr().out
    assert "  crop_scale:\n    - 0.3\n    - 1.0\n" in printed and "  horizontal_flip: false\n" in printed


def test_val_class_unknown_to_train_is_an_error(image_root: Path) -> None:
    (image_root / "val" / "hat").mkdir()
    dm = ImageFolderDataModule(root=str(image_root), num_workers=0)
    with pytest.raises(ValueError, match=r"class folders \['hat'\] do not exist in the train split"):
        dm.setup("fit")


def test_missing_root_names_the_expected_layout(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"expects <root>/train/<class>/<images>"):
        ImageFolderDataModule(root=str(tmp_path / "nothing")).setup("fit")


@pytest.mark.parametrize("split", ["train", "val"])
def test_class_folders_without_images_stop_fit_before_it_trains(image_root: Path, quick_trainer, split: str) -> None:
    for path in (image_root / split).rglob("*.*"):
        path.rename(path.with_suffix(".txt"))  # files, but none of them an image
    dm = ImageFolderDataModule(root=str(image_root), image_size=28, batch_size=4, num_workers=0)
    model = SimpleCNN(num_classes=dm.num_classes, input_shape=(3, 28, 28))
    with pytest.raises(FileNotFoundError, match=rf"{image_root / split}: no images in it or its class folders") as err:
        quick_trainer().fit(model, dm)
    assert project_error(err.value) is err.value  # printed by train.py as its message alone
    assert model.global_step == 0


def test_mean_std_utility_matches_the_pixels(image_root: Path, fmnist) -> None:
    (image_root / "train" / "tshirt" / "broken.jpg").unlink()
    mean, std = compute_mean_std(image_root / "train" / "trouser", image_size=28)
    pixels = torch.stack(
        [torch.from_numpy(np.array(Image.open(p))) for p in (image_root / "train/trouser").glob("*.png")]
    )
    assert mean[0] == mean[1] == mean[2]  # gray images stored as RGB
    assert 0.05 < mean[0] < 0.6 and 0.05 < std[0] < 0.5
    assert abs(mean[0] - pixels.float().mean().item() / 255) < 0.05  # jpeg and png halves agree roughly


def _write_cifar_batch(path: Path, images: torch.Tensor, labels: torch.Tensor) -> None:
    rgb = torch.nn.functional.pad(images, (2, 2, 2, 2)).unsqueeze(1).repeat(1, 3, 1, 1)  # 28x28 gray -> 32x32 RGB
    with open(path, "wb") as f:
        pickle.dump({"data": rgb.reshape(len(rgb), -1).numpy(), "labels": labels.tolist()}, f)


def test_cifar10_reads_the_official_python_batches(tmp_path: Path, fmnist) -> None:
    images, labels = fmnist
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for i in range(1, 6):
        _write_cifar_batch(folder / f"data_batch_{i}", images[i * 100 : (i + 1) * 100], labels[i * 100 : (i + 1) * 100])
    _write_cifar_batch(folder / "test_batch", images[:100], labels[:100])
    dm = CIFAR10DataModule(data_dir=str(tmp_path), val_size=50)
    dm.setup("fit")
    assert (len(dm.splits["train"]), len(dm.splits["val"]), len(dm.splits["test"])) == (450, 50, 100)
    test_images = dm.splits["test"].images
    assert test_images.shape == (100, 3, 32, 32) and test_images.dtype == torch.uint8
    assert torch.equal(test_images[:, 1, 2:30, 2:30], images[:100]) and torch.equal(
        dm.splits["test"].labels, labels[:100]
    )


def test_cifar10_offline_without_files_says_where_to_put_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "url", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    with pytest.raises(DatasetNotFoundError, match=r"cifar-10-batches-py/data_batch_1 exists"):
        CIFAR10DataModule(data_dir=str(tmp_path)).prepare_data()


def test_workers_do_not_change_the_batches_and_gpu_and_cpu_runs_normalize_alike(image_root: Path) -> None:
    """Per-sample seeds make the random crops a function of (seed, epoch, sample): 0 or 2 workers, the same
    batches. A CPU run's workers normalize each image; a GPU run's hand over uint8, normalized on the GPU by
    `on_after_batch_transfer`: both give (x / 255 - mean) / std."""
    batches = {}
    for workers in (0, 2):
        dm = ImageFolderDataModule(root=str(image_root), image_size=24, batch_size=6, num_workers=workers)
        dm.setup("fit")
        batches[workers] = list(dm.train_dataloader())  # no trainer: a CPU run
    assert len(batches[0]) == len(batches[2]) == 4  # 19 files (one corrupt, skipped) in batches of 6
    for (images, labels), (other, other_labels) in zip(batches[0], batches[2], strict=True):
        assert images.dtype == torch.float32 and torch.equal(images, other) and torch.equal(labels, other_labels)
    dataset = dm.splits["train"]
    on_cpu, label = dataset[(3, 1234)]
    dataset.normalize = None  # what a GPU run's workers do
    pixels, same_label = dataset[(3, 1234)]
    on_gpu, _ = dm.on_after_batch_transfer((pixels[None], torch.tensor([same_label])), 0)
    mean, std = torch.tensor(dm.hparams.mean)[:, None, None], torch.tensor(dm.hparams.std)[:, None, None]
    assert pixels.dtype == torch.uint8 and label == same_label and torch.equal(on_gpu[0], on_cpu)
    torch.testing.assert_close(on_cpu, (pixels.float() / 255 - mean) / std)
