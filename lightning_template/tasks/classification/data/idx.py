"""Reading the IDX files of MNIST and Fashion-MNIST, and finding them on disk.

IDX is the original format: a big-endian header (magic, dims) followed by raw uint8.
Parsing it ourselves keeps the whole dataset as one uint8 tensor (47 MB for 60k
images) instead of 60k PIL images.
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

import torch

from lightning_template.engine.errors import ConfigError

SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
ALL_FILES = [name for pair in SPLIT_FILES.values() for name in pair]


def _existing(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def has_all_files(folder: Path) -> bool:
    return all(_existing(folder, name) is not None for name in ALL_FILES)


def read_idx(path: Path) -> torch.Tensor:
    """Parse an (optionally gzipped) IDX file of unsigned bytes into a uint8 tensor (a copy of its own)."""
    try:
        stat = path.stat()
        # By the file a link points to: a folder of links to another copy shares that copy's decoded tensors.
        version = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        return _decoded(path.resolve(), path.suffix == ".gz", version).clone()
    except (OSError, EOFError) as err:
        raise ConfigError(f"{path}: cannot be read ({err}). Delete it and run again to fetch a fresh copy.") from err
    except ValueError as err:
        raise ConfigError(f"{path}: {err}. Delete it and run again.") from None


# Runs in one process (a search's trials, a test session) read the same files again, and unzipping the 60k training
# images takes longer than building a network: each version of a file is decoded once. A copy that keeps the
# modification time (`cp -p`) is still another version: its inode or its change time (which no copy keeps) differs.
@functools.lru_cache(maxsize=len(ALL_FILES))
def _decoded(path: Path, gzipped: bool, version: tuple[int, ...]) -> torch.Tensor:
    """The tensor of an IDX file (gzipped or not: its name says, not the name of what a link points to)."""
    with (gzip.open if gzipped else open)(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError("not an IDX file of unsigned bytes (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + int(torch.tensor(shape).prod())
    if len(data) != expected:
        raise ValueError(f"truncated or corrupt ({len(data)} bytes, header says {expected})")
    return torch.frombuffer(bytearray(data[header:]), dtype=torch.uint8).reshape(shape)


def load_split(folder: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Images as uint8 [N, 1, H, W] and labels as int64 [N]."""
    image_name, label_name = SPLIT_FILES[split]
    images = read_idx(_existing(folder, image_name) or folder / image_name)
    labels = read_idx(_existing(folder, label_name) or folder / label_name)
    if len(images) != len(labels):
        raise ConfigError(f"{folder}: {split} split has {len(images)} images but {len(labels)} labels.")
    return images.unsqueeze(1), labels.long()
