"""Images in class folders: `root/train/<class>/*.jpg`, `root/val/<class>/...`, optional `root/test/`.

File data is decoded, cropped and flipped per sample in worker processes (`num_workers`,
`persistent_workers`, `pin_memory`), unlike the in-memory datasets. For a GPU the workers hand over
uint8 batches (a quarter of float32's bytes), normalized on the GPU; on a CPU they normalize each
image themselves, in parallel with the training step rather than before it. Class ids come from the
train folder and are reused for val/test, so a class missing from one split cannot shift the labels.

Normalization statistics: ImageNet's by default (right for ImageNet-pretrained
weights); for a network trained from scratch compute your own with
`python -m lightning_template.tasks.classification.data.image_folder stats <root>/train`
and pass them as --data.mean/--data.std.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from jsonargparse import ArgumentParser
from lightning import LightningDataModule
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader, default_collate
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.transforms import v2

from lightning_template.engine.errors import ConfigError, DataError, MissingFileError
from lightning_template.script_args import script_parser
from lightning_template.tasks.classification.data.folds import check_fold, fold_split
from lightning_template.tasks.classification.data.in_memory import DeviceImageTransforms, affine_normalize
from lightning_template.tasks.classification.input_spec import eight_bit
from lightning_template.tasks.loaders import SplitLoaders, make_loader, seeded_sample

log = logging.getLogger(__name__)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class CorruptImageError(DataError):
    """An image file that cannot be decoded."""


def class_folders(split_dir: Path) -> list[str]:
    if not split_dir.is_dir():
        raise MissingFileError(
            f"{split_dir} not found. ImageFolderDataModule expects <root>/train/<class>/<images>"
            " and <root>/val/<class>/<images> (set --data.root)."
        )
    classes = sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())
    if not classes:
        raise MissingFileError(f"{split_dir} has no class sub-folders; expected {split_dir}/<class>/<images>.")
    return classes


def load_rgb(path: str) -> Image.Image:
    try:
        with Image.open(path) as image:
            return eight_bit(image).convert("RGB")
    except (OSError, UnidentifiedImageError, SyntaxError) as err:
        raise CorruptImageError(f"{path}: cannot be decoded as an image ({err}). Delete or replace the file.") from err
    except ValueError as err:
        raise CorruptImageError(f"{path}: {err}.") from err


class ClassFolderDataset(ImageFolder):
    """An ImageFolder whose classes are given (the train split's), that skips or reports corrupt files."""

    def __init__(self, root: Path, classes: list[str], transform: Any, on_corrupt: Literal["skip", "error"]) -> None:
        self.fixed_classes = classes
        self.on_corrupt = on_corrupt
        super().__init__(str(root), transform=transform, loader=load_rgb, allow_empty=True)

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        unknown = sorted(set(class_folders(Path(directory))) - set(self.fixed_classes))
        if unknown:
            raise ConfigError(f"{directory}: class folders {unknown} do not exist in the train split.")
        return self.fixed_classes, {name: i for i, name in enumerate(self.fixed_classes)}

    normalize: Callable[[torch.Tensor], torch.Tensor] | None = None  # uint8 batch -> float, in the workers

    def __getitem__(self, index: int | tuple[int, int]) -> tuple[torch.Tensor, int] | None:
        try:
            image, label = seeded_sample(super().__getitem__, index)  # random crops depend on (seed, epoch, sample)
            return (image if self.normalize is None else self.normalize(image[None])[0]), label
        except CorruptImageError as err:
            if self.on_corrupt == "error":
                raise
            log.warning("skipping %s", err)
            return None


class FileListDataset(ClassFolderDataset):
    """Unlabelled image files (label -1), e.g. for `predict`."""

    def __init__(self, paths: list[str], transform: Any, on_corrupt: Literal["skip", "error"]) -> None:
        self.samples = [(path, -1) for path in paths]
        self.targets = [-1] * len(paths)
        self.transform, self.target_transform, self.loader, self.on_corrupt = transform, None, load_rgb, on_corrupt


def keep_samples(dataset: ClassFolderDataset, indices: list[int]) -> None:
    """Restrict an ImageFolder to the given sample indices (a fold)."""
    dataset.samples = [dataset.samples[i] for i in indices]
    dataset.imgs = dataset.samples
    dataset.targets = [dataset.targets[i] for i in indices]


def collate_skipping_none(batch: list[Any]) -> Any:
    """Drop samples that were skipped as corrupt (a batch may come out one short)."""
    return default_collate([sample for sample in batch if sample is not None])


class ImageFolderDataModule(DeviceImageTransforms, SplitLoaders, LightningDataModule):
    model_facts = ("num_classes", "input_shape")  # handed to the model's arguments of these names (train.py)

    def __init__(
        self,
        root: str = "data/images",
        image_size: int = 224,
        resize_size: int | None = None,
        batch_size: int = 64,
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
        augment: bool = True,
        crop_scale: tuple[float, float] = (0.08, 1.0),
        crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
        horizontal_flip: bool = True,
        vertical_flip: bool = False,
        predict_dir: str | None = None,
        on_corrupt: Literal["skip", "error"] = "skip",
        num_folds: int | None = None,
        fold: int = 0,
        split_seed: int = 1234,
        num_workers: int = min(4, os.cpu_count() or 1),
        pin_memory: bool | None = None,
    ) -> None:
        """
        Args:
            root: Folder holding train/, val/ and optionally test/, each with one sub-folder per class.
            image_size: Side of the square crop fed to the network.
            resize_size: Evaluation resizes the short side to this, then center-crops `image_size`
                (default image_size / 0.875, the usual ImageNet ratio).
            batch_size: Samples per batch on each device.
            mean: Per-channel normalization mean (RGB, 0..1 scale).
            std: Per-channel normalization standard deviation.
            augment: Random crops and flips of training images; false: they get the evaluation transform.
            crop_scale: Area fraction of the image a training crop covers, (smallest, largest); RandomResizedCrop's
                `scale` (ImageNet recipes: 0.08 to 1; small or fine-grained images: 0.3 or more).
            crop_ratio: Aspect ratio (width / height) of a training crop, (smallest, largest), before its resize.
            horizontal_flip: Flip training images left-right at random (not for text or digits).
            vertical_flip: Flip training images upside down at random (aerial or microscope images).
            predict_dir: Images to classify with `predict` (any folder layout, searched recursively).
            on_corrupt: `skip` logs the unreadable file and drops it from its batch; `error` stops the run.
            num_folds: k-fold cross-validation over train/ (stratified by class): validate on fold `fold`,
                train on the others; val/ is then not used, test/ is untouched.
            fold: Which fold validates (0..num_folds-1).
            split_seed: Seed of the folds.
            num_workers: Decoding processes; files need several, unlike in-memory data.
            pin_memory: Page-locked host memory for faster copies to a GPU (default: when CUDA is available).
        """
        super().__init__()
        self.save_hyperparameters()
        self.root = Path(root)
        self.predict_dir = Path(predict_dir) if predict_dir else None
        self.batch_size = batch_size
        self.on_corrupt = on_corrupt
        check_fold(num_folds, fold)
        self.num_folds, self.fold, self.split_seed = num_folds, fold, split_seed
        self.num_workers = num_workers
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.mean, self.std = tuple(mean), tuple(std)  # DeviceImageTransforms.normalize's
        if not 0 < crop_scale[0] <= crop_scale[1] <= 1 or not 0 < crop_ratio[0] <= crop_ratio[1]:
            raise ConfigError(
                f"--data.crop_scale {list(crop_scale)} / --data.crop_ratio {list(crop_ratio)}: (smallest, largest),"
                " a scale within 0 < smallest <= largest <= 1, a ratio above 0."
            )
        self.resize_size = resize_size or round(image_size / 0.875)
        self.eval_transform = v2.Compose(
            [v2.Resize(self.resize_size, antialias=True), v2.CenterCrop(image_size), v2.PILToTensor()]
        )
        flips = [v2.RandomHorizontalFlip()] * horizontal_flip + [v2.RandomVerticalFlip()] * vertical_flip
        crop = v2.RandomResizedCrop(image_size, scale=tuple(crop_scale), ratio=tuple(crop_ratio), antialias=True)
        self.train_transform = v2.Compose([crop, *flips, v2.PILToTensor()]) if augment else self.eval_transform
        self.input_shape = (3, image_size, image_size)
        self.splits: dict[str, ClassFolderDataset] = {}

    @property
    def class_names(self) -> list[str]:
        return class_folders(self.root / "train")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def setup(self, stage: str) -> None:
        if stage == "predict":
            if self.predict_dir is None or not self.predict_dir.is_dir():
                raise MissingFileError(
                    f"predict needs --data.predict_dir (a folder of images); got {self.predict_dir}."
                )
            paths = sorted(str(p) for p in self.predict_dir.rglob("*") if p.suffix.lower() in IMG_EXTENSIONS)
            # A skipped file would misalign the CSV rows: in predict an unreadable image is an error.
            self.splits["predict"] = FileListDataset(paths, self.eval_transform, on_corrupt="error")
            return
        if "train" in self.splits:
            return
        classes = self.class_names
        self.splits["train"] = ClassFolderDataset(self.root / "train", classes, self.train_transform, self.on_corrupt)
        if self.num_folds is not None:  # validate on a fold of train/, with the evaluation transform
            self.splits["val"] = ClassFolderDataset(self.root / "train", classes, self.eval_transform, self.on_corrupt)
            targets = torch.tensor(self.splits["train"].targets)
            train_idx, val_idx = fold_split(targets, self.num_folds, self.fold, self.split_seed)
            keep_samples(self.splits["train"], train_idx.tolist())
            keep_samples(self.splits["val"], val_idx.tolist())
        for split in ("val", "test"):
            if split not in self.splits and (self.root / split).is_dir():
                self.splits[split] = ClassFolderDataset(
                    self.root / split, classes, self.eval_transform, self.on_corrupt
                )
        if "val" not in self.splits:
            class_folders(self.root / "val")  # raises the missing-folder error
        counts = torch.bincount(torch.tensor(self.splits["train"].targets, dtype=torch.long), minlength=len(classes))
        for name, count in zip(classes, counts.tolist(), strict=True):
            if count == 0 and counts.any():  # no images at all is the train loader's error, not a warning per class
                log.warning("%s has no images: class '%s' cannot be learned.", self.root / "train" / name, name)

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        if split not in self.splits:
            raise MissingFileError(f"{self.root / split} not found; it is needed for this stage.")
        if not self.splits[split].samples:  # Lightning would only warn, skip the stage and report success
            folder = self.predict_dir if split == "predict" else self.root / split
            raise MissingFileError(
                f"{folder}: no images in it or its class folders (image files end in {', '.join(IMG_EXTENSIONS)})."
            )
        on_gpu = self.trainer is not None and self.trainer.strategy.root_device.type != "cpu"
        scale, shift = self._affine(torch.device("cpu"))  # picklable: what a spawned worker receives
        self.splits[split].normalize = None if on_gpu else functools.partial(affine_normalize, scale=scale, shift=shift)
        return make_loader(
            self.splits[split], self.trainer, shuffle, self.batch_size, collate_skipping_none, self.num_workers,
            self.pin_memory, sample_seeds=True,
        )  # fmt: skip

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, torch.Tensor):  # inputs alone: the model's example_input_array, for its summary
            return batch
        images, labels = batch
        return (self.normalize(images) if images.dtype == torch.uint8 else images), labels

    def predict_inputs(self, indices: list[int]) -> list[str]:
        return [self.splits["predict"].samples[i][0] for i in indices]

    def serving_spec(self) -> dict[str, Any]:
        """How a served model reads an image file: the evaluation transform (RGB, resize, center crop, normalize)."""
        return {
            "kind": "image", "class_names": self.class_names, "channels": 3, "convert": "RGB",
            "resize": self.resize_size, "crop": self.input_shape[1],
            "mean": list(self.hparams.mean), "std": list(self.hparams.std),
        }  # fmt: skip


def compute_mean_std(folder: Path, image_size: int = 224, max_images: int = 5000) -> tuple[list[float], list[float]]:
    """Per-channel mean and std (0..1 scale) of up to `max_images` images of a class-folder tree."""
    transform = v2.Compose([v2.Resize(image_size, antialias=True), v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    paths = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMG_EXTENSIONS)[:max_images]
    if not paths:
        raise MissingFileError(f"{folder}: no images found.")
    total, total_sq, pixels = torch.zeros(3), torch.zeros(3), 0
    for path in paths:
        image = transform(load_rgb(str(path)))
        total += image.sum(dim=(1, 2))
        total_sq += (image**2).sum(dim=(1, 2))
        pixels += image.shape[1] * image.shape[2]
    mean = total / pixels
    std = (total_sq / pixels - mean**2).clamp_min(0).sqrt()
    return [round(v, 4) for v in mean.tolist()], [round(v, 4) for v in std.tolist()]


def parser() -> ArgumentParser:
    """The arguments of `python -m lightning_template.tasks.classification.data.image_folder`."""
    parser = script_parser("Image-folder utilities: `stats <folder>` prints the --data.mean and --data.std to use.")
    parser.add_argument("command", choices=["stats"], help="stats: the per-channel mean and std.")
    parser.add_argument("folder", type=str, help="e.g. data/images/train")
    parser.add_argument("--image_size", type=int, default=224, help="The side images are resized to, as in training.")
    parser.add_argument("--max_images", type=int, default=5000, help="Images read (a sample of a larger folder).")
    return parser


def main() -> None:
    args = parser().parse_args()
    mean, std = compute_mean_std(Path(args.folder), args.image_size, args.max_images)
    print(f"--data.mean '{mean}' --data.std '{std}'")


if __name__ == "__main__":
    main()
