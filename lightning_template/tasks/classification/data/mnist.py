"""MNIST and Fashion-MNIST: 28x28 grayscale, 10 classes, 60k train / 10k test, IDX files.

Where the files come from, in order:
1. `data_dir/<Name>/raw/` already holds them (torchvision's layout, so an earlier
   torchvision download is reused);
2. the folder an environment variable names (`FASHION_MNIST_DIR`, `MNIST_DIR`): a copy shared by projects;
3. a system-wide copy, e.g. Debian's `dataset-fashion-mnist` package;
4. torchvision's download (needs a network);
5. otherwise a `DatasetNotFoundError` saying what to install or where to put the files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torchvision

from lightning_template.tasks.classification.data.files import (
    find_dataset_dir,
    resolve_dataset_dir,
    torchvision_download,
)
from lightning_template.tasks.classification.data.idx import ALL_FILES, has_all_files, load_split
from lightning_template.tasks.classification.data.in_memory import Batch, InMemoryImageDataModule


class MNISTDataModule(InMemoryImageDataModule):
    """Handwritten digits (MNIST)."""

    torchvision_dataset = torchvision.datasets.MNIST
    env_dir = "MNIST_DIR"  # the environment variable naming a folder of the four files
    system_dirs: tuple[str, ...] = ("/usr/share/datasets/mnist",)
    system_package_hint = "no system package ships MNIST on Debian"
    input_shape = (1, 28, 28)
    mean = (0.1307,)
    std = (0.3081,)
    all_class_names = tuple(str(digit) for digit in range(10))

    @property
    def local_dir(self) -> Path:
        return Path(self.data_dir) / self.torchvision_dataset.__name__ / "raw"

    @property
    def shared_dirs(self) -> list[Path]:
        """Where the files are looked for after `local_dir`: the folder `env_dir` names, the system copies."""
        named = os.environ.get(self.env_dir)
        return [Path(d) for d in ([named] if named else []) + list(self.system_dirs)]

    def find_files(self) -> Path | None:
        """The folder holding the four IDX files, without downloading; None where there is none."""
        return find_dataset_dir(self.local_dir, self.shared_dirs, has_all_files)

    def resolve_files(self) -> Path:
        """The folder holding the four IDX files, downloading them if needed (see module docstring)."""
        return resolve_dataset_dir(
            self.local_dir,
            self.shared_dirs,
            has_all_files,
            lambda: torchvision_download(self.torchvision_dataset, Path(self.data_dir)),
            f"put {', '.join(f + '.gz' for f in ALL_FILES)} into {self.local_dir}/ (or set --data.data_dir),"
            f" or set {self.env_dir} to a folder holding them, or {self.system_package_hint}.",
        )

    def load_splits(self) -> tuple[Batch, Batch]:
        folder = self.resolve_files()
        return load_split(folder, "train"), load_split(folder, "test")


class FashionMNISTDataModule(MNISTDataModule):
    """Zalando's Fashion-MNIST: a harder drop-in for MNIST (clothing, 10 classes)."""

    def __init__(self, horizontal_flip: bool = True, **kwargs: Any) -> None:
        """
        Args:
            horizontal_flip: Also flip training images left-right when `augment` is on (clothes are symmetric).
            **kwargs: Batch size, split, augmentation and loader settings of `InMemoryImageDataModule`.
        """
        super().__init__(horizontal_flip=horizontal_flip, **kwargs)

    torchvision_dataset = torchvision.datasets.FashionMNIST
    env_dir = "FASHION_MNIST_DIR"
    system_dirs = ("/usr/share/datasets/fashion-mnist",)
    system_package_hint = "install Debian's package: `apt-get install dataset-fashion-mnist`"
    mean = (0.2860,)
    std = (0.3530,)
    all_class_names = (
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    )


if __name__ == "__main__":  # `make data`: find (or download) Fashion-MNIST; a missing copy is one line with the fix
    from lightning_template.engine.cli import exit_on_error

    exit_on_error(lambda: FashionMNISTDataModule().prepare_data())
