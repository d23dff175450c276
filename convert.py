"""Write a dataset of the project as LitData chunks, for `StreamingImageDataModule` / `StreamingTextDataModule`.

    python convert.py --job configs/simple_cnn.yaml --output data/streaming/fashion_mnist
    python convert.py --job configs/resnet_finetune.yaml --output data/streaming/flowers --images encoded
    python convert.py --job configs/transformer_text.yaml --output s3://my-bucket/fortunes

The source is the `data` of a job config (`--job`), or `--data` as train.py takes it, with the same
`--data.*` overrides; its train/val/test splits are written as they are (same samples, order and
labels). Images are stored `raw` (decoded uint8; file images resized to `--size`, so training
decodes nothing) or `encoded` (the file's bytes, or PNG for in-memory images: smaller, decoded in the
loader's workers). `dataset.json` is written last: a conversion stopped halfway is refused by the
datamodules, and running the same command again starts it over.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from jsonargparse import ArgumentParser
from lightning import LightningDataModule
from PIL import Image

import lightning_template.tasks.classification  # noqa: F401  (registers the datamodules for --data)
from lightning_template.engine.errors import ConfigError, InterfaceError
from lightning_template.script_args import script_parser
from lightning_template.streaming.datamodules import (
    FORMAT_VERSION,
    METADATA_FILE,
    SPLITS,
    decode_image,
    is_remote,
    join,
    require_litdata,
)
from lightning_template.tasks.classification import (
    ImageFolderDataModule,
    InMemoryImageDataModule,
    TextClassificationDataModule,
)
from lightning_template.tasks.classification.data.image_folder import CorruptImageError
from lightning_template.tasks.classification.input_spec import SPEC_KEY

BLOCK = 512  # samples per LitData work item: one item per sample costs ~1 ms of queueing each
# fork: the workers inherit the loaded source data instead of importing torch again (seconds each).
START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else None


class ItemBlock:
    """Yields the samples of a block of indices (LitData writes every yielded sample)."""

    def __init__(self, item: Any) -> None:
        self.item = item

    def __call__(self, indices: range) -> Any:
        for index in indices:
            yield self.item(index)


class InMemoryItems:
    """Sample i of an in-memory image split, as stored (a class: LitData's workers pickle it)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, encoded: bool) -> None:
        self.images, self.labels, self.encoded = images, labels, encoded

    def __len__(self) -> int:
        return len(self.labels)

    def __call__(self, index: int) -> dict[str, Any]:
        image = self.images[index]
        if self.encoded:
            buffer = io.BytesIO()
            Image.fromarray(image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)).save(buffer, "PNG")
            image = buffer.getvalue()
        return {"image": image, "label": int(self.labels[index])}


class FileItems:
    """Image file i of a class-folder split: its bytes, or decoded and resized to `size`."""

    def __init__(self, samples: list[tuple[str, int]], encoded: bool, size: int) -> None:
        self.samples, self.encoded, self.size = samples, encoded, size

    def __len__(self) -> int:
        return len(self.samples)

    def __call__(self, index: int) -> dict[str, Any]:
        path, label = self.samples[index]
        data = Path(path).read_bytes()
        try:
            image = data if self.encoded else decode_image(data, "RGB", self.size)
            if self.encoded:
                Image.open(io.BytesIO(data)).verify()  # an unreadable file fails here, not in training
        except Exception as err:  # PIL raises many types for bad files
            raise CorruptImageError(
                f"{path}: cannot be decoded as an image ({err}). Delete or replace the file."
            ) from err
        return {"image": image, "label": label}


class TextItems:
    def __init__(self, ids: list[list[int]], labels: list[int]) -> None:
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __call__(self, index: int) -> dict[str, Any]:
        return {"ids": np.asarray(self.ids[index], dtype=np.int32), "label": self.labels[index]}


def splits_and_metadata(
    datamodule: LightningDataModule, images: Literal["raw", "encoded"], size: int | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(split -> item function with its length, dataset.json without the counts) for a source datamodule."""
    datamodule.prepare_data()
    for stage in ("fit", "test"):
        datamodule.setup(stage)
    splits = {split: datamodule.splits[split] for split in SPLITS if split in datamodule.splits}
    metadata: dict[str, Any] = {
        "format": FORMAT_VERSION, "source": f"{type(datamodule).__module__}.{type(datamodule).__qualname__}",
        "class_names": list(datamodule.class_names), SPEC_KEY: datamodule.serving_spec(),
    }  # fmt: skip
    encoded = images == "encoded"
    if isinstance(datamodule, InMemoryImageDataModule):
        channels, height, width = datamodule.input_shape
        if height != width:
            raise ConfigError(f"{type(datamodule).__name__}: only square images can be streamed ({height}x{width}).")
        items = {s: InMemoryItems(d.images.numpy(), d.labels.numpy(), encoded) for s, d in splits.items()}
        stored, crop, mean, std = height, height, datamodule.mean, datamodule.std
    elif isinstance(datamodule, ImageFolderDataModule):
        channels, crop = 3, datamodule.input_shape[1]
        stored = size or datamodule.resize_size
        if stored < crop:
            raise ConfigError(f"--size {stored} is smaller than the network's input ({crop}); use {crop} or more.")
        items = {s: FileItems(d.samples, encoded, stored) for s, d in splits.items()}
        mean, std = datamodule.hparams.mean, datamodule.hparams.std
    elif isinstance(datamodule, TextClassificationDataModule):
        items = {s: TextItems(d.ids, d.labels) for s, d in splits.items()}
        tokenizer = datamodule.tokenizer
        metadata.update(
            kind="text",
            text={"vocab": tokenizer.vocab, "max_length": datamodule.max_length, "pad_id": tokenizer.pad_id},
        )
        return items, metadata
    else:
        raise InterfaceError(f"convert.py does not know how to read {type(datamodule).__name__}.")
    metadata.update(
        kind="image",
        image={
            "storage": images, "channels": channels, "size": stored, "crop": crop, "mean": list(mean),
            "std": list(std),
        },
    )  # fmt: skip
    return items, metadata


def convert(
    datamodule: LightningDataModule,
    output: str,
    images: Literal["raw", "encoded"] = "raw",
    size: int | None = None,
    chunk_bytes: str = "64MB",
    num_workers: int = 2,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write every split of `datamodule` under `output`; returns dataset.json's content."""
    require_litdata()
    from litdata import optimize

    items, metadata = splits_and_metadata(datamodule, images, size)
    if not any(map(len, items.values())):
        raise ConfigError(f"{metadata['source']}: every split is empty; nothing to convert (check the data's files).")
    remove_metadata(output, storage_options)  # first: from now until the end, the folder reads as unfinished
    metadata["splits"] = {}
    for split, item in items.items():
        count = len(item)
        if not count:  # LitData refuses empty inputs; a missing split is named when the converted data is used
            print(f"{split}: no samples in the source; skipped (the converted dataset has no {split} split)")
            continue
        blocks = [range(start, min(start + BLOCK, count)) for start in range(0, count, BLOCK)]
        sigint = signal.getsignal(signal.SIGINT)
        try:
            optimize(
                fn=ItemBlock(item), inputs=blocks, output_dir=join(output, split), chunk_bytes=chunk_bytes,
                num_workers=max(1, min(num_workers, len(blocks))), mode="overwrite", keep_data_ordered=True,
                verbose=False, start_method=START_METHOD, storage_options=storage_options or {},
            )  # fmt: skip
        finally:  # LitData leaves its Ctrl-C handler installed, which ends the process with status 0
            signal.signal(signal.SIGINT, sigint)
        metadata["splits"][split] = count
        print(f"{split}: {count} samples -> {join(output, split)}", flush=True)
    write_metadata(output, metadata, storage_options)
    return metadata


def remove_metadata(output: str, storage_options: dict[str, Any] | None) -> None:
    if not is_remote(output):
        Path(output, METADATA_FILE).unlink(missing_ok=True)
        return
    from litdata.streaming.fs_provider import _get_fs_provider

    provider = _get_fs_provider(output, storage_options)
    if provider.exists(join(output, METADATA_FILE)):
        provider.delete_file_or_directory(join(output, METADATA_FILE))


def write_metadata(output: str, metadata: dict[str, Any], storage_options: dict[str, Any] | None) -> None:
    text = json.dumps(metadata, indent=1)
    if not is_remote(output):
        partial = Path(output, METADATA_FILE + ".partial")
        partial.write_text(text)
        partial.replace(Path(output, METADATA_FILE))  # atomic: dataset.json is whole or absent
        return
    from litdata.streaming.fs_provider import _get_fs_provider

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp, METADATA_FILE)
        local.write_text(text)
        _get_fs_provider(output, storage_options).upload_file(str(local), join(output, METADATA_FILE))


def job_data(job: str) -> list[str]:
    """`--data <json>` for the data section of a job config, placed before the user's --data.* flags."""
    config = yaml.safe_load(Path(job).read_text()) or {}
    if "data" not in config:
        raise ConfigError(f"--job {job}: no `data:` section in this config.")
    data = config["data"]
    return ["--data", data if isinstance(data, str) else json.dumps(data)]


def parser() -> ArgumentParser:
    parser = script_parser(__doc__)
    parser.add_argument("--job", type=str | None, default=None, help="A job config whose `data` is converted.")
    parser.add_subclass_arguments(LightningDataModule, "data", required=True, help="The source datamodule.")
    parser.add_argument("--output", type=str, required=True, help="Folder or URL (s3://, gs://) to write to.")
    parser.add_argument(
        "--images", type=Literal["raw", "encoded"], default="raw",
        help="raw: decoded uint8 (file images resized to --size); encoded: the file's bytes (PNG for in-memory).",
    )  # fmt: skip
    parser.add_argument(
        "--size", type=int | None, default=None,
        help="File images: side of the stored square (short side resized, center crop);"
        " default the datamodule's evaluation resize (image_size / 0.875).",
    )  # fmt: skip
    parser.add_argument("--chunk_bytes", type=str, default="64MB", help="Size of each chunk file.")
    parser.add_argument("--num_workers", type=int, default=2, help="Conversion processes.")
    parser.add_argument("--storage_options", type=dict | None, default=None, help="Object-store client options.")
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    for position, arg in enumerate(argv):
        if arg == "--job" or arg.startswith("--job="):
            job = arg.partition("=")[2] or (argv[position + 1] if position + 1 < len(argv) else "")
            argv = job_data(job) + argv
            break
    arg_parser = parser()
    config = arg_parser.instantiate_classes(arg_parser.parse_args(argv))
    if not is_remote(config.output) and Path(config.output).is_file():
        raise ConfigError(f"--output {config.output}: a file; give a folder.")
    convert(
        config.data, config.output, config.images, config.size, config.chunk_bytes, config.num_workers,
        config.storage_options,
    )  # fmt: skip
    kind = "Text" if isinstance(config.data, TextClassificationDataModule) else "Image"
    data = f"lightning_template.tasks.classification.Streaming{kind}DataModule"
    print(f"Train on it with --data {data} --data.input_dir {config.output}")


if __name__ == "__main__":
    from lightning_template.engine.cli import exit_on_error

    exit_on_error(main)
