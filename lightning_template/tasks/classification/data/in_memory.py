"""A LightningDataModule for image datasets that fit in memory as uint8 tensors.

Why not torchvision's per-sample transforms: converting 60k tiny images one at a
time through PIL costs more than training the model on them. Here the data stays
uint8 (4x smaller than float), whole batches are indexed at once, and conversion,
augmentation and normalization run in batches on the device the model runs on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning import LightningDataModule
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset

from lightning_template.engine.errors import ConfigError
from lightning_template.tasks.classification.data.folds import check_fold, fold_split
from lightning_template.tasks.classification.input_spec import center_crop_box, normalization
from lightning_template.tasks.loaders import SplitLoaders, make_loader

Batch = tuple[torch.Tensor, torch.Tensor]


class TensorPairDataset(Dataset):
    """(images, labels) tensors; `__getitems__` lets the DataLoader fetch a batch with one index op."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> Batch:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: list[int]) -> Batch:
        index = torch.as_tensor(indices)
        return self.images[index], self.labels[index]


def collate_batch(batch: Batch) -> Batch:
    """`__getitems__` already returns a stacked batch (a module function so workers can pickle it)."""
    return batch


def random_crop_flip(images: torch.Tensor, padding: int, flip: bool, size: int | None = None) -> torch.Tensor:
    """Per-image random crop of `size` (default: the input's size) from the images zero-padded by
    `padding` pixels, and horizontal flip; batched, on the images' device."""
    n, _, h, w = images.shape
    size_h, size_w = (h, w) if size is None else (size, size)
    if padding > 0 or (size_h, size_w) != (h, w):
        padded = torch.nn.functional.pad(images, (padding,) * 4) if padding > 0 else images
        offsets = torch.stack(
            [torch.randint(0, extent + 2 * padding - size + 1, (n,), device=images.device)
             for extent, size in ((h, size_h), (w, size_w))]
        )  # fmt: skip
        rows = (torch.arange(size_h, device=images.device) + offsets[0, :, None])[:, None, :, None]
        cols = (torch.arange(size_w, device=images.device) + offsets[1, :, None])[:, None, None, :]
        batch_index = torch.arange(n, device=images.device)[:, None, None, None]
        channel_index = torch.arange(images.shape[1], device=images.device)[None, :, None, None]
        images = padded[batch_index, channel_index, rows, cols]
    if flip:
        flipped = torch.rand(n, device=images.device) < 0.5
        images = torch.where(flipped[:, None, None, None], images.flip(-1), images)
    return images


def center_crop(images: torch.Tensor, size: int) -> torch.Tensor:
    left, top, right, bottom = center_crop_box(images.shape[-1], images.shape[-2], size)
    return images[..., top:bottom, left:right]


def affine_normalize(images: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """uint8 [N, C, H, W] -> float `images * scale + shift` (`input_spec.normalization`'s scale and shift).

    Channel by channel, straight from uint8: the same numbers as `addcmul(shift, images.float(), scale)`
    at 0.6x its time for large images on a CPU (no float copy, no broadcast over channels)."""
    out = torch.empty(images.shape, dtype=torch.float32, device=images.device)
    for channel in range(images.shape[1]):
        torch.addcmul(shift[0, channel], images[:, channel], scale[0, channel], out=out[:, channel])
    return out


class DeviceImageTransforms:
    """uint8 image batches -> (augmented while training) normalized float, on the device the model runs on.

    Shared by the datamodules that deliver uint8 batches (in memory, streamed). `crop_size`: the
    stored images are larger than the network's input; training crops at random, evaluation centrally.
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: bool
    crop_padding: int
    horizontal_flip: bool
    crop_size: int | None = None
    trainer: Any

    def on_after_batch_transfer(self, batch: Batch | torch.Tensor, dataloader_idx: int) -> Batch | torch.Tensor:
        """uint8 -> normalized float on the device; augmentation only while training."""
        if isinstance(batch, torch.Tensor):  # inputs alone: the model's example_input_array, for its summary
            return batch
        images, labels = batch
        training = self.trainer is not None and self.trainer.training
        if training and (self.augment or self.crop_size is not None):
            padding = self.crop_padding if self.augment else 0
            images = random_crop_flip(images, padding, self.augment and self.horizontal_flip, self.crop_size)
        elif self.crop_size is not None:
            images = center_crop(images, self.crop_size)
        return self.normalize(images), labels

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 -> float, (x / 255 - mean) / std per channel, as one multiply-add."""
        return affine_normalize(images, *self._affine(images.device))

    def _affine(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # Built once per device: creating them per batch would copy to the GPU every step. Kept on
        # the instance (not in a functools.cache, which would keep every datamodule alive).
        cache = self.__dict__.setdefault("_affine_cache", {})
        if device not in cache:
            scale, shift = normalization(self.mean, self.std)
            cache[device] = torch.from_numpy(scale).to(device), torch.from_numpy(shift).to(device)
        return cache[device]


class InMemoryImageDataModule(DeviceImageTransforms, SplitLoaders, LightningDataModule):
    """Base for datasets held as uint8 [N, C, H, W] tensors. Subclasses implement `load_splits`."""

    mean: tuple[float, ...] = (0.5,)
    std: tuple[float, ...] = (0.5,)
    input_shape: tuple[int, int, int]
    model_facts = ("num_classes", "input_shape")  # handed to the model's arguments of these names (train.py)
    all_class_names: tuple[str, ...]

    def __init__(
        self,
        data_dir: str = "data",
        batch_size: int = 128,
        val_size: int = 5000,
        split_seed: int = 1234,
        num_folds: int | None = None,
        fold: int = 0,
        augment: bool = False,
        crop_padding: int = 2,
        horizontal_flip: bool = False,
        classes: list[int] | None = None,
        train_samples_per_class: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
    ) -> None:
        """
        Args:
            data_dir: Folder where the dataset is looked for and downloaded to.
            batch_size: Samples per batch on each device (the global batch is this x devices x accumulation).
            val_size: Images held out from the official training split for validation.
            split_seed: Seed of the train/validation split; fixed so every run validates on the same images.
            num_folds: k-fold cross-validation: split the official training images into this many
                stratified folds and validate on fold `fold` (replaces `val_size`; test split untouched).
            fold: Which fold validates (0..num_folds-1); the other folds train.
            augment: Random translation (and flip) of training batches, applied on the device.
            crop_padding: Maximum translation in pixels when `augment` is on.
            horizontal_flip: Also flip training images left-right when `augment` is on (not for digits or text).
            classes: Keep only these class ids (relabelled 0..k-1 in this order), e.g. [5, 6, 7, 8, 9].
            train_samples_per_class: Keep only this many training images per class (a fixed,
                seeded choice), to study learning from a small labelled set.
            num_workers: DataLoader worker processes. 0 is fastest for in-memory data on few cores.
            pin_memory: Page-locked host memory for faster copies to a GPU.
        """
        super().__init__()
        self.save_hyperparameters()
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.val_size = val_size
        self.split_seed = split_seed
        check_fold(num_folds, fold)
        self.num_folds, self.fold = num_folds, fold
        self.augment = augment
        self.crop_padding = crop_padding
        self.horizontal_flip = horizontal_flip
        self.classes = list(range(len(self.all_class_names))) if classes is None else list(classes)
        self.train_samples_per_class = train_samples_per_class
        unknown = [c for c in self.classes if not 0 <= c < len(self.all_class_names)]
        if unknown:
            raise ConfigError(
                f"data.classes: {unknown} are not class ids of {type(self).__name__}"
                f" (0..{len(self.all_class_names) - 1})."
            )
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.splits: dict[str, TensorPairDataset] = {}

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(self.all_class_names[c] for c in self.classes)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def resolve_files(self) -> Path:
        """The folder holding the dataset's files, downloading them if needed."""
        raise NotImplementedError

    def load_splits(self) -> tuple[Batch, Batch]:
        """Return ((train_images, train_labels), (test_images, test_labels))."""
        raise NotImplementedError

    def prepare_data(self) -> None:
        rank_zero_info(f"{type(self).__name__}: using {self.resolve_files()}")

    def setup(self, stage: str) -> None:
        if self.splits:
            return
        (train_x, train_y), (test_x, test_y) = self.load_splits()
        self._check(train_x, train_y, "train")
        self._check(test_x, test_y, "test")
        if self.num_folds is not None:
            train_idx, val_idx = fold_split(train_y, self.num_folds, self.fold, self.split_seed)
        elif not 0 < self.val_size < len(train_y):
            raise ConfigError(f"data.val_size={self.val_size} must be between 1 and {len(train_y) - 1}.")
        else:
            generator = torch.Generator().manual_seed(self.split_seed)
            order = torch.randperm(len(train_y), generator=generator)
            val_idx, train_idx = order[: self.val_size], order[self.val_size :]
        if self.train_samples_per_class is not None:
            train_idx = torch.cat(
                [train_idx[train_y[train_idx] == c][: self.train_samples_per_class] for c in self.classes]
            )
        self.splits = {
            "train": self._select_classes(train_x[train_idx], train_y[train_idx]),
            "val": self._select_classes(train_x[val_idx], train_y[val_idx]),
            "test": self._select_classes(test_x, test_y),
        }

    def _select_classes(self, images: torch.Tensor, labels: torch.Tensor) -> TensorPairDataset:
        """Keep `self.classes` and renumber them 0..k-1."""
        new_label = torch.full((len(self.all_class_names),), -1, dtype=torch.long)
        new_label[self.classes] = torch.arange(len(self.classes))
        keep = new_label[labels] >= 0
        return TensorPairDataset(images[keep], new_label[labels[keep]])

    def _check(self, images: torch.Tensor, labels: torch.Tensor, split: str) -> None:
        if images.dtype != torch.uint8 or tuple(images.shape[1:]) != self.input_shape:
            expected = ", ".join(map(str, self.input_shape))
            raise ConfigError(
                f"{type(self).__name__} {split} images: expected uint8 [N, {expected}],"
                f" got {images.dtype} {list(images.shape)}."
            )
        bad = (labels < 0) | (labels >= len(self.all_class_names))
        if bad.any():
            raise ConfigError(
                f"{type(self).__name__} {split} labels: {int(bad.sum())} outside [0, {len(self.all_class_names)}),"
                f" e.g. {labels[bad][:5].tolist()}. Fix the label files or the class count."
            )

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        dataset = self.splits["test" if split == "predict" else split]  # predict runs on the test split
        return make_loader(
            dataset, self.trainer, shuffle, self.batch_size, collate_batch, self.num_workers, self.pin_memory
        )

    def predict_inputs(self, indices: list[int]) -> list[str]:
        """Names of predicted samples (`predict` runs on the test split), for CSV output."""
        return [f"test[{i}]" for i in indices]

    def serving_spec(self) -> dict[str, Any]:
        """How a served model reads an image file: this size and channel count, no resize, this normalization."""
        channels, height, width = self.input_shape
        return {
            "kind": "image", "class_names": list(self.class_names), "channels": channels, "size": [height, width],
            "mean": list(self.mean), "std": list(self.std),
        }  # fmt: skip
