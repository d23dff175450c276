"""CIFAR-10: 32x32 RGB, 10 classes, 50k train / 10k test, held in memory as uint8.

Files: `data_dir/cifar-10-batches-py/` (torchvision's layout of the official python
version), else torchvision's download, else an error saying where to put them.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
import torchvision

from lightning_template.engine.errors import ConfigError
from lightning_template.tasks.classification.data.files import resolve_dataset_dir, torchvision_download
from lightning_template.tasks.classification.data.in_memory import Batch, InMemoryImageDataModule

TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_BATCH = "test_batch"


def _has_all_batches(folder: Path) -> bool:
    return all((folder / name).is_file() for name in [*TRAIN_BATCHES, TEST_BATCH])


def _read_batches(folder: Path, names: list[str]) -> Batch:
    images, labels = [], []
    for name in names:
        path = folder / name
        try:
            with open(path, "rb") as f:
                # The official python version of CIFAR-10 is a pickle; only load files you trust.
                entry = pickle.load(f, encoding="latin1")
            images.append(np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.append(np.asarray(entry["labels"], dtype=np.int64))
        except (OSError, pickle.UnpicklingError, EOFError, KeyError, ValueError) as err:
            raise ConfigError(f"{path}: not a CIFAR-10 batch file ({err}). Delete it and run again.") from err
    return torch.from_numpy(np.concatenate(images)), torch.from_numpy(np.concatenate(labels))


class CIFAR10DataModule(InMemoryImageDataModule):
    """CIFAR-10 with random-translation + flip augmentation on the device (`augment`, on by default)."""

    input_shape = (3, 32, 32)
    mean = (0.4914, 0.4822, 0.4465)
    std = (0.2470, 0.2435, 0.2616)
    all_class_names = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

    def __init__(
        self,
        data_dir: str = "data",
        augment: bool = True,
        crop_padding: int = 4,
        horizontal_flip: bool = True,
        **kwargs,
    ) -> None:
        """
        Args:
            data_dir: Folder holding (or receiving) `cifar-10-batches-py/`.
            augment: Random translation by up to `crop_padding` pixels and horizontal flips while training.
            crop_padding: Maximum translation in pixels.
            horizontal_flip: Also flip training images left-right when `augment` is on.
            **kwargs: Batch size, split and loader settings of `InMemoryImageDataModule`.
        """
        super().__init__(
            data_dir=data_dir, augment=augment, crop_padding=crop_padding, horizontal_flip=horizontal_flip, **kwargs
        )

    @property
    def local_dir(self) -> Path:
        return Path(self.data_dir) / "cifar-10-batches-py"

    def resolve_files(self) -> Path:
        return resolve_dataset_dir(
            self.local_dir,
            [],
            _has_all_batches,
            lambda: torchvision_download(torchvision.datasets.CIFAR10, Path(self.data_dir)),
            f"download cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html on a machine"
            f" with a network and extract it so that {self.local_dir}/data_batch_1 exists (or set --data.data_dir).",
        )

    def load_splits(self) -> tuple[Batch, Batch]:
        folder = self.resolve_files()
        return _read_batches(folder, TRAIN_BATCHES), _read_batches(folder, [TEST_BATCH])
