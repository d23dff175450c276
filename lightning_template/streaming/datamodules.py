"""Training from LitData's chunked format, from a local folder or object storage (s3://, gs://, ...).

For data that does not fit in RAM or on the local disk, or that several nodes read: `convert.py`
writes any of the project's datasets as LitData chunks (`<dir>/{train,val,test}/` plus
`dataset.json`, written last); these datamodules stream them with the same models and configs.

- Training uses LitData's `StreamingDataset` + `StreamingDataLoader`: shuffled chunk by chunk (a
  function of seed and epoch), sharded across DDP ranks and nodes by LitData, and placed at the
  Trainer's position at each epoch start (`streaming_loader.py`), so a resumed run continues exactly.
  Under DDP LitData drops the last samples that do not fill a batch on every rank.
- Evaluation reads the chunks by index, with the project's samplers: under DDP every validation
  and test sample is evaluated exactly once, and `predict` names its rows `test[i]`.
- Images arrive as uint8 (decoded in the workers when stored encoded) and are cropped (flipped with
  `augment`) and normalized in batches on the device, as the in-memory datamodules do.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import torch
from lightning import LightningDataModule
from PIL import Image
from torch.utils.data import DataLoader, Dataset, default_collate

from lightning_template.engine.errors import DataError, MissingPackageError
from lightning_template.engine.sampling import derive_seed, global_seed, world
from lightning_template.tasks.classification.data.in_memory import DeviceImageTransforms
from lightning_template.tasks.classification.data.text import PadCollate
from lightning_template.tasks.classification.input_spec import SPEC_KEY, center_crop, resized_size
from lightning_template.tasks.loaders import SplitLoaders, make_loader

METADATA_FILE = "dataset.json"
FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
REMOTE_TIMEOUT_S = 30.0


class StreamingDataError(DataError):
    """A converted dataset that is missing, unfinished or damaged."""


def require_litdata() -> None:
    """LitData is an optional extra: say how to install it rather than fail on an import."""
    try:
        import litdata  # noqa: F401
    except ImportError as err:
        raise MissingPackageError(
            "Streaming datasets need LitData: uv sync --inexact --extra stream (make test installs it)."
        ) from err


def is_remote(location: str) -> bool:
    return urlparse(location).scheme not in ("", "file")


def local_path(location: str) -> str:
    """`file:///x` -> `/x`; anything else unchanged."""
    return location[len("file://") :] if location.startswith("file://") else location


def join(location: str, *parts: str) -> str:
    return "/".join([location.rstrip("/"), *parts]) if is_remote(location) else str(Path(location, *parts))


def fetch_remote_file(url: str, storage_options: dict[str, Any] | None) -> bytes:
    """One small file from object storage, through LitData's downloader, within REMOTE_TIMEOUT_S."""
    from litdata.streaming.downloader import get_downloader

    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "file")

        def download() -> None:
            try:
                get_downloader(url.rpartition("/")[0], tmp, [], storage_options).download_file(url, local)
                result["data"] = Path(local).read_bytes()
            except Exception as err:  # any client, credential or network error ends in the same advice
                result["error"] = err

        thread = threading.Thread(target=download, daemon=True)
        thread.start()
        thread.join(REMOTE_TIMEOUT_S)
    if "data" in result:
        return result["data"]
    error = result.get("error")
    reason = (
        f"{type(error).__name__}: {str(error).splitlines()[0]}" if error else f"no answer in {REMOTE_TIMEOUT_S:.0f} s"
    )
    raise StreamingDataError(
        f"{url}: cannot be read ({reason})."
        " Check the URL, the network, and the credentials (for s3://: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or"
        " AWS_PROFILE, AWS_ENDPOINT_URL for other S3 services; or --data.storage_options)."
    )


def read_metadata(location: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """`dataset.json` of a converted dataset, after checking the conversion finished and its chunks are whole."""
    if is_remote(location):  # chunks are checked by LitData when it downloads them
        metadata = json.loads(fetch_remote_file(join(location, METADATA_FILE), storage_options))
        check_format(metadata, join(location, METADATA_FILE))
        return metadata
    root = Path(local_path(location))
    if not (root / METADATA_FILE).is_file():
        started = root.is_dir() and any((root / split).exists() for split in SPLITS)
        raise StreamingDataError(
            f"{root}: the conversion did not finish (no {METADATA_FILE}, which convert.py writes last): run"
            " convert.py again with the same --output."
            if started
            else f"{root}: no converted dataset here. Write one with `python convert.py --job <config> --output {root}`"
            " (docs/streaming.md), or set --data.input_dir."
        )
    metadata = json.loads((root / METADATA_FILE).read_text())
    check_format(metadata, str(root / METADATA_FILE))
    for split, count in metadata["splits"].items():
        check_chunks(root / split, count)
    return metadata


def check_format(metadata: dict[str, Any], source: str) -> None:
    if metadata.get("format") != FORMAT_VERSION:
        raise StreamingDataError(
            f"{source}: format {metadata.get('format')}, this project reads {FORMAT_VERSION}. Run convert.py again."
        )


def check_chunks(split_dir: Path, expected_samples: int) -> None:
    """Every chunk named in the split's index.json is present and of its recorded size."""
    index_file = split_dir / "index.json"
    if not index_file.is_file():
        raise StreamingDataError(f"{index_file}: missing. Run convert.py again with the same --output.")
    chunks = json.loads(index_file.read_text())["chunks"]
    for chunk in chunks:
        path = split_dir / chunk["filename"]
        size = path.stat().st_size if path.is_file() else None
        if size != chunk["chunk_bytes"]:
            state = "missing" if size is None else f"{size} bytes instead of {chunk['chunk_bytes']}"
            raise StreamingDataError(f"{path}: chunk {state}. Run convert.py again, or restore the file.")
    samples = sum(chunk["chunk_size"] for chunk in chunks)
    if samples != expected_samples:
        raise StreamingDataError(
            f"{split_dir}: {samples} samples in its chunks, {METADATA_FILE} says {expected_samples}."
            " Run convert.py again with the same --output."
        )


def decode_image(data: bytes, mode: str, size: int) -> np.ndarray:
    """Encoded image -> uint8 [C, size, size]: short side resized to `size`, center crop (JPEGs decoded at
    reduced resolution when they are much larger)."""
    with Image.open(io.BytesIO(data)) as image:  # BytesIO shares the bytes until written to
        image.draft(mode, (size, size))  # JPEG: decode at 1/2, 1/4 or 1/8 scale if still >= size
        image = image.convert(mode)
    if image.size != (size, size):
        image = center_crop(image.resize(resized_size(image.size, size), Image.Resampling.BILINEAR), size)
    array = np.array(image, dtype=np.uint8)  # writable: torch.from_numpy warns on a read-only array
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


class ImageSample:
    """A stored sample -> (uint8 tensor [C, S, S], label); a class so DataLoader workers can pickle it."""

    def __init__(self, storage: str, channels: int, size: int) -> None:
        self.storage, self.mode, self.size = storage, "L" if channels == 1 else "RGB", size

    def __call__(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
        image = sample["image"]
        if self.storage == "encoded":
            image = decode_image(image, self.mode, self.size)
        return torch.from_numpy(np.ascontiguousarray(image)), int(sample["label"])


def text_sample(sample: dict[str, Any]) -> tuple[list[int], int]:
    return sample["ids"].tolist(), int(sample["label"])


class IndexedSplit(Dataset):
    """A converted split read by index (for evaluation with the project's samplers)."""

    def __init__(self, dataset: Any, size: int, to_sample: Any) -> None:
        # `size` from dataset.json: under DDP, len(StreamingDataset) is the rank's shard, not the split.
        self.dataset, self.size, self.to_sample = dataset, size, to_sample

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        return self.to_sample(self.dataset[index])


class StreamingDataModule(SplitLoaders, LightningDataModule):
    """Base of the streamed image and text datamodules: metadata, loaders, state."""

    kind: str
    collate: Any
    to_sample: Any  # stored sample -> (input, label), picklable (it runs in the loader's workers)
    batch_decode: int | str = "auto"  # LitData's: items deserialized together
    # LitData shards its IterableDataset across workers and ranks itself, so its length is right (train.py).
    quieted_warnings = ("Your `IterableDataset` has `__len__` defined",)

    def __init__(
        self,
        input_dir: str,
        batch_size: int,
        num_workers: int,
        pin_memory: bool | None,
        cache_dir: str | None,
        max_cache_size: str,
        storage_options: dict[str, Any] | None,
    ) -> None:
        super().__init__()
        require_litdata()
        input_dir = local_path(input_dir)
        self.input_dir, self.batch_size, self.num_workers = input_dir, batch_size, num_workers
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.cache_dir, self.max_cache_size, self.storage_options = cache_dir, max_cache_size, storage_options
        self.metadata = read_metadata(input_dir, storage_options)
        if self.metadata["kind"] != self.kind:
            raise StreamingDataError(
                f"{input_dir} holds {self.metadata['kind']} data; use --data Streaming"
                f"{self.metadata['kind'].capitalize()}DataModule."
            )
        self.class_names = list(self.metadata["class_names"])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def streaming_dataset(self, split: str, shuffle: bool) -> Any:
        from litdata import StreamingDataset

        if split not in self.metadata["splits"]:
            raise StreamingDataError(f"{self.input_dir} has no {split} split; convert a dataset that has one.")
        return StreamingDataset(
            join(self.input_dir, split), cache_dir=self.cache_dir and join(self.cache_dir, split),
            shuffle=shuffle, seed=global_seed(), drop_last=shuffle and world(self.trainer)[0] > 1,
            max_cache_size=self.max_cache_size, storage_options=self.storage_options or {},
            transform=self.to_sample if shuffle else None, batch_decode=self.batch_decode,
        )  # fmt: skip

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        if shuffle:  # LitData's order, sharding and mid-epoch state
            from lightning_template.streaming.loader import LoopPositionedLoader

            return LoopPositionedLoader(
                self.streaming_dataset(split, shuffle=True), self.trainer, batch_size=self.batch_size,
                num_workers=self.num_workers, pin_memory=self.pin_memory, collate_fn=self.collate,
                generator=torch.Generator().manual_seed(derive_seed(global_seed(), world(self.trainer)[1])),
            )  # fmt: skip
        split = "test" if split == "predict" else split
        dataset = IndexedSplit(self.streaming_dataset(split, False), self.metadata["splits"][split], self.to_sample)
        return make_loader(
            dataset, self.trainer, False, self.batch_size, self.collate, self.num_workers, self.pin_memory
        )

    def predict_inputs(self, indices: list[int]) -> list[str]:
        """Names of predicted samples (`predict` runs on the test split), for CSV output."""
        return [f"test[{i}]" for i in indices]

    def serving_spec(self) -> dict[str, Any]:
        """The source datamodule's, recorded by convert.py."""
        return self.metadata[SPEC_KEY]


class StreamingImageDataModule(DeviceImageTransforms, StreamingDataModule):
    kind = "image"
    model_facts = ("num_classes", "input_shape")  # handed to the model's arguments of these names (train.py)
    collate = staticmethod(default_collate)
    # One item at a time: LitData's default decodes windows of neighbours, which a shuffled read of
    # large image arrays mostly throws away (measured: 440 -> 6,500 images/s for 256 px raw chunks).
    batch_decode = 0

    def __init__(
        self,
        input_dir: str = "data/streaming/fashion_mnist",
        batch_size: int = 128,
        augment: bool = False,
        crop_padding: int = 2,
        horizontal_flip: bool = False,
        num_workers: int = 2,
        pin_memory: bool | None = None,
        cache_dir: str | None = None,
        max_cache_size: str = "50GB",
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        """
        Args:
            input_dir: A folder or URL (s3://bucket/path, gs://...) written by convert.py.
            batch_size: Samples per batch on each device.
            augment: Random translation by up to `crop_padding` pixels (and flip) of training batches, on the device.
                Images stored larger than the network's input (file datasets) are always cropped at random
                while training and centrally for evaluation.
            crop_padding: Maximum translation in pixels when `augment` is on.
            horizontal_flip: Also flip training images left-right when `augment` is on.
            num_workers: Reading (and decoding) processes.
            pin_memory: Page-locked host memory for faster copies to a GPU (default: when CUDA is available).
            cache_dir: Where chunks of a remote dataset are cached (default: LitData's).
            max_cache_size: Chunks beyond this are evicted from the cache ("50GB", "500MB").
            storage_options: Passed to the object-store client (credentials, endpoint).
        """
        super().__init__(input_dir, batch_size, num_workers, pin_memory, cache_dir, max_cache_size, storage_options)
        self.save_hyperparameters()
        image = self.metadata["image"]
        self.augment, self.crop_padding, self.horizontal_flip = augment, crop_padding, horizontal_flip
        self.mean, self.std = tuple(image["mean"]), tuple(image["std"])
        crop = image["crop"]
        self.crop_size = crop if crop != image["size"] else None
        self.input_shape = (image["channels"], crop, crop)
        self.to_sample = ImageSample(image["storage"], image["channels"], image["size"])


class StreamingTextDataModule(StreamingDataModule):
    kind = "text"
    model_facts = ("num_classes", "vocab_size", "pad_id", "max_length")  # handed to the model (train.py)

    def __init__(
        self,
        input_dir: str = "data/streaming/fortunes",
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        cache_dir: str | None = None,
        max_cache_size: str = "50GB",
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        """
        Args:
            input_dir: A folder or URL (s3://bucket/path, gs://...) written by convert.py.
            batch_size: Sequences per batch on each device (padded to the longest of the batch).
            num_workers: Reading processes.
            pin_memory: Page-locked host memory for faster copies to a GPU (default: when CUDA is available).
            cache_dir: Where chunks of a remote dataset are cached (default: LitData's).
            max_cache_size: Chunks beyond this are evicted from the cache ("50GB", "500MB").
            storage_options: Passed to the object-store client (credentials, endpoint).
        """
        super().__init__(input_dir, batch_size, num_workers, pin_memory, cache_dir, max_cache_size, storage_options)
        self.save_hyperparameters()
        text = self.metadata["text"]
        self.vocab_size, self.max_length, self.pad_id = len(text["vocab"]), text["max_length"], text["pad_id"]
        self.collate, self.to_sample = PadCollate(self.pad_id), text_sample
