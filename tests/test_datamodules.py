from __future__ import annotations

import gc
import gzip
import itertools
import json
import math
import os
import shutil
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision
from lightning import seed_everything

import lightning_template.tasks.classification
from lightning_template.engine.errors import ConfigError
from lightning_template.tasks.classification import (
    CIFAR10DataModule,
    FashionMNISTDataModule,
    ImageFolderDataModule,
    MNISTDataModule,
    SimpleCNN,
    TextClassificationDataModule,
)
from lightning_template.tasks.classification.data.contract import ClassificationData, ImageData, TextData
from lightning_template.tasks.classification.data.files import DatasetNotFoundError
from lightning_template.tasks.classification.data.idx import ALL_FILES, _decoded, read_idx
from lightning_template.tasks.classification.data.in_memory import random_crop_flip
from lightning_template.tasks.classification.data.text import BucketSampler


@pytest.fixture(scope="module")
def datamodule(fashion_mnist_dir: Path) -> FashionMNISTDataModule:
    dm = FashionMNISTDataModule(data_dir="/nonexistent", batch_size=64)
    dm.setup("fit")
    return dm


def test_splits_shapes_and_dtypes(datamodule: FashionMNISTDataModule) -> None:
    train, val, test = (datamodule.splits[s] for s in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (55_000, 5_000, 10_000)
    for split in (train, val, test):
        assert split.images.dtype == torch.uint8 and split.images.shape[1:] == (1, 28, 28)
        assert split.labels.dtype == torch.int64 and set(split.labels.unique().tolist()) == set(range(10))
    images, labels = next(iter(datamodule.train_dataloader()))
    assert images.shape == (64, 1, 28, 28) and images.dtype == torch.uint8 and labels.shape == (64,)


@pytest.mark.slow
def test_validation_is_a_fixed_holdout_disjoint_from_train(
    datamodule: FashionMNISTDataModule, whole_fashion_mnist: Path
) -> None:
    def fingerprints(split) -> set[int]:
        return set(hash(row.numpy().tobytes()) for row in split.images.flatten(1))

    train, val = fingerprints(datamodule.splits["train"]), fingerprints(datamodule.splits["val"])
    # Fashion-MNIST has a few exact duplicate images; allow those but no systematic overlap.
    assert len(train & val) < 20
    again = FashionMNISTDataModule(data_dir="/nonexistent")
    again.setup("fit")
    assert torch.equal(again.splits["val"].labels, datamodule.splits["val"].labels)


def test_official_test_split_is_the_test_split(datamodule: FashionMNISTDataModule, fashion_mnist_dir: Path) -> None:
    official = read_idx(fashion_mnist_dir / "t10k-labels-idx1-ubyte.gz").long()
    assert torch.equal(datamodule.splits["test"].labels, official)


def test_batches_are_normalized_on_transfer(datamodule: FashionMNISTDataModule) -> None:
    images, _ = datamodule.on_after_batch_transfer(next(iter(datamodule.val_dataloader())), 0)
    assert images.dtype == torch.float32
    full = datamodule.normalize(datamodule.splits["train"].images[:5000])
    assert abs(full.mean().item()) < 0.05 and abs(full.std().item() - 1) < 0.05


def test_augmentation_translates_and_flips_whole_images() -> None:
    torch.manual_seed(0)
    images = torch.zeros(256, 1, 28, 28, dtype=torch.uint8)
    images[:, :, 10:18, 4:8] = 255  # a bar left of centre
    out = random_crop_flip(images, padding=2, flip=True)
    assert out.shape == images.shape and out.dtype == torch.uint8
    assert torch.equal(out.sum(dim=(1, 2, 3)), images.sum(dim=(1, 2, 3)))  # bar stays inside the frame
    columns = out[:, 0].amax(dim=1).float().argmax(dim=1)  # first lit column per image
    assert columns.min() >= 2 and columns.max() >= 20  # translated, and some flipped to the right
    assert len(columns.unique()) > 4


def _copy_dataset(source: Path, target: Path) -> None:
    target.mkdir(parents=True)
    for name in ALL_FILES:
        shutil.copy(source / f"{name}.gz", target / f"{name}.gz")


class TestResolutionOrder:
    @pytest.fixture
    def offline(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # A port nobody listens on: the real torchvision download code runs and fails
        # immediately, exactly as on a machine without a network (and never touches one).
        monkeypatch.setattr(torchvision.datasets.FashionMNIST, "mirrors", ["http://127.0.0.1:9/"])

    def test_data_dir_wins_over_system_copy(self, tmp_path: Path, fashion_mnist_dir: Path, monkeypatch) -> None:
        _copy_dataset(fashion_mnist_dir, tmp_path / "FashionMNIST" / "raw")
        monkeypatch.setattr(FashionMNISTDataModule, "system_dirs", (str(tmp_path / "nowhere"),))
        dm = FashionMNISTDataModule(data_dir=str(tmp_path))
        assert dm.resolve_files() == tmp_path / "FashionMNIST" / "raw"

    def test_the_folder_fashion_mnist_dir_names_comes_after_data_dir_and_before_the_system_copy(
        self, tmp_path: Path, fashion_mnist_dir: Path, monkeypatch, offline
    ) -> None:
        shared, system = tmp_path / "shared", tmp_path / "system"
        _copy_dataset(fashion_mnist_dir, shared)
        _copy_dataset(fashion_mnist_dir, system)
        monkeypatch.setattr(FashionMNISTDataModule, "system_dirs", (str(system),))
        monkeypatch.setenv("FASHION_MNIST_DIR", str(shared))
        assert FashionMNISTDataModule(data_dir=str(tmp_path / "empty")).resolve_files() == shared
        _copy_dataset(fashion_mnist_dir, tmp_path / "FashionMNIST" / "raw")
        assert FashionMNISTDataModule(data_dir=str(tmp_path)).resolve_files() == tmp_path / "FashionMNIST" / "raw"
        monkeypatch.setenv("FASHION_MNIST_DIR", str(tmp_path / "nowhere"))
        assert FashionMNISTDataModule(data_dir=str(tmp_path / "empty")).find_files() == system

    def test_uncompressed_files_are_accepted(self, tmp_path: Path, fashion_mnist_dir: Path) -> None:
        raw = tmp_path / "FashionMNIST" / "raw"
        raw.mkdir(parents=True)
        for name in ALL_FILES:  # the test split's files uncompressed, the training split's as they come
            compressed = fashion_mnist_dir / f"{name}.gz"
            if name.startswith("t10k"):
                (raw / name).write_bytes(gzip.decompress(compressed.read_bytes()))
            else:
                (raw / compressed.name).symlink_to(compressed)
        dm = FashionMNISTDataModule(data_dir=str(tmp_path))
        assert dm.resolve_files() == raw
        dm.setup("fit")
        images, labels = dm.splits["test"].images, dm.splits["test"].labels
        assert torch.equal(labels, read_idx(fashion_mnist_dir / "t10k-labels-idx1-ubyte.gz").long())
        assert torch.equal(images[:, 0], read_idx(fashion_mnist_dir / "t10k-images-idx3-ubyte.gz"))

    def test_a_file_is_decoded_once_per_version_and_each_reader_gets_its_own_copy(self, tmp_path: Path) -> None:
        header, values = bytes([0, 0, 8, 1, 0, 0, 0, 50]), bytes(range(10)) * 5
        first, second = tmp_path / "first", tmp_path / "second"  # two versions of one file, of the same size
        first.write_bytes(header + values)
        second.write_bytes(header + bytes(9 - v for v in values))
        os.utime(second, ns=(first.stat().st_atime_ns, first.stat().st_mtime_ns))
        labels = tmp_path / "t10k-labels-idx1-ubyte"
        shutil.copy2(first, labels)
        read = read_idx(labels)
        read[:] = 0  # a reader's edit stays its own
        assert read_idx(labels).tolist() == list(values)
        shutil.copy2(second, labels)  # a new copy with the same size and modification time (`cp -p`)
        assert read_idx(labels).tolist() == [9 - v for v in values]
        link = tmp_path / "link-idx1-ubyte"  # a link to it: the same file, decoded already
        link.symlink_to(labels)
        decoded = _decoded.cache_info().misses
        assert read_idx(link).tolist() == [9 - v for v in values] and _decoded.cache_info().misses == decoded
        labels.write_bytes(labels.read_bytes()[:-1])
        with pytest.raises(ConfigError, match="t10k-labels-idx1-ubyte: truncated or corrupt"):
            read_idx(labels)

    def test_a_link_is_read_as_its_name_says_and_named_in_errors(self, tmp_path: Path) -> None:
        """A cache of blobs without suffixes (Hugging Face's, DVC's) linked under the dataset's names."""
        blob, values = tmp_path / "blob", bytes(range(7))
        blob.write_bytes(gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 7]) + values))
        link = tmp_path / "t10k-labels-idx1-ubyte.gz"
        link.symlink_to(blob)
        assert read_idx(link).tolist() == list(values)
        blob.write_bytes(gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 9]) + values))
        with pytest.raises(ConfigError, match=r"t10k-labels-idx1-ubyte\.gz: truncated or corrupt \(15 bytes"):
            read_idx(link)

    def test_system_copy_when_data_dir_is_empty(self, tmp_path: Path, fashion_mnist_dir: Path, offline) -> None:
        dm = FashionMNISTDataModule(data_dir=str(tmp_path))
        assert dm.resolve_files() == fashion_mnist_dir

    def test_clear_error_when_nothing_is_found_offline(self, tmp_path: Path, monkeypatch, offline) -> None:
        monkeypatch.setattr(FashionMNISTDataModule, "system_dirs", (str(tmp_path / "nowhere"),))
        monkeypatch.delenv("FASHION_MNIST_DIR")
        dm = FashionMNISTDataModule(data_dir=str(tmp_path / "data"))
        with pytest.raises(DatasetNotFoundError) as err:
            dm.prepare_data()
        message = str(err.value)
        assert "download failed" in message
        assert str(tmp_path / "data" / "FashionMNIST" / "raw") in message
        assert "apt-get install dataset-fashion-mnist" in message and "FASHION_MNIST_DIR" in message
        assert "train-images-idx3-ubyte.gz" in message

    def test_corrupt_file_names_the_file(self, tmp_path: Path, fashion_mnist_dir: Path) -> None:
        raw = tmp_path / "FashionMNIST" / "raw"
        _copy_dataset(fashion_mnist_dir, raw)
        data = gzip.decompress((raw / "train-labels-idx1-ubyte.gz").read_bytes())
        (raw / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(data[:-100]))
        dm = FashionMNISTDataModule(data_dir=str(tmp_path))
        with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte\.gz: truncated or corrupt"):
            dm.setup("fit")


def test_digits_are_not_mirrored_but_clothes_may_be() -> None:
    assert not MNISTDataModule(augment=True).horizontal_flip
    assert FashionMNISTDataModule(augment=True).horizontal_flip


@pytest.mark.slow
def test_a_finished_run_releases_its_datamodule(quick_trainer, fashion_mnist_dir) -> None:
    """Several fits in one process (a sweep) must not keep every run's dataset alive."""

    def fit_once() -> weakref.ref:
        datamodule = FashionMNISTDataModule()
        quick_trainer(limit_train_batches=1).fit(SimpleCNN(), datamodule=datamodule)
        return weakref.ref(datamodule)

    alive = fit_once()
    gc.collect()
    assert alive() is None


def test_bucket_batches_are_full_but_the_last_and_never_repeat_a_sample() -> None:
    lengths = list(range(1, 34))  # 33 samples, batch 32: one full batch and a batch of one
    for world_size in (1, 2):
        per_rank = [list(BucketSampler(lengths, 32, 4, shard=(world_size, rank))) for rank in range(world_size)]
        assert len({math.ceil(len(order) / 32) for order in per_rank}) == 1  # the same number of steps per rank
        for order in per_rank:
            batches = [order[i : i + 32] for i in range(0, len(order), 32)]
            assert all(len(set(batch)) == len(batch) for batch in batches)  # no sample twice in one step
            assert all(len(batch) == 32 for batch in batches[:-1])
        assert set().union(*map(set, per_rank)) == set(range(33))


def test_vocabulary_comes_from_the_training_part_only(tmp_path: Path) -> None:
    records = [{"text": f"common word{i}", "label": "a" if i % 2 else "b"} for i in range(40)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    dm = TextClassificationDataModule(train_file=str(tmp_path / "train.jsonl"), val_fraction=0.25, min_freq=1)
    dm.setup("fit")
    held_out_words = {dm.tokenizer.split(text)[1] for text, _ in dm.held_out_records}
    assert len(dm.splits["val"]) == 10 and len(held_out_words) == 10
    assert not held_out_words & set(dm.tokenizer.vocab)  # they are <unk> for the model, as new text would be
    assert {"common"} <= set(dm.tokenizer.vocab)


def test_worker_augmentation_follows_the_seed_not_the_workers(image_tree: Path) -> None:
    def first_batches(seed: int, workers: int) -> list[torch.Tensor]:
        seed_everything(seed)
        dm = ImageFolderDataModule(root=str(image_tree), image_size=24, batch_size=8, num_workers=workers)
        dm.setup("fit")
        return [images for images, _ in itertools.islice(dm.train_dataloader(), 3)]

    with_workers, without = first_batches(5, workers=2), first_batches(5, workers=0)
    assert all(torch.equal(a, b) for a, b in zip(with_workers, without, strict=True))
    assert not torch.equal(first_batches(6, workers=2)[0], with_workers[0])


def test_every_datamodule_meets_the_contract(image_tree: Path, fortunes_dir: Path, tmp_path: Path) -> None:
    """What train.py links into the model and the predictions CSV reads, available right after __init__."""
    text = TextClassificationDataModule(train_file=str(fortunes_dir / "train.jsonl"))
    built = {
        "FashionMNISTDataModule": FashionMNISTDataModule(),
        "MNISTDataModule": MNISTDataModule(),
        "CIFAR10DataModule": CIFAR10DataModule(),
        "ImageFolderDataModule": ImageFolderDataModule(root=str(image_tree)),
        "TextClassificationDataModule": text,
    }
    exported = set(lightning_template.tasks.classification.__all__)
    assert {name for name in exported if name.endswith("DataModule")} - {"InMemoryImageDataModule"} == set(built)
    assert_contract(built)


def assert_contract(built: dict[str, Any]) -> None:
    for name, datamodule in built.items():
        assert isinstance(datamodule, ClassificationData), name
        assert isinstance(datamodule, ImageData) != isinstance(datamodule, TextData), name
        assert len(datamodule.class_names) == datamodule.num_classes > 1, name
