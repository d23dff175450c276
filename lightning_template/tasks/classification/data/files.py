"""Finding a dataset on disk, or downloading it, or saying clearly what to do."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from pathlib import Path

from lightning_template.engine.errors import MissingFileError

DOWNLOAD_TIMEOUT_S = 20.0


class DatasetNotFoundError(MissingFileError):
    """The dataset is in none of the places we look and could not be downloaded."""


def torchvision_download(dataset_cls: type, root: Path) -> None:
    """The real torchvision download, bounded in time so an offline machine fails fast."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        dataset_cls(root=str(root), train=True, download=True)
        dataset_cls(root=str(root), train=False, download=True)
    finally:
        socket.setdefaulttimeout(previous)


def find_dataset_dir(local_dir: Path, system_dirs: Sequence[Path], is_complete: Callable[[Path], bool]) -> Path | None:
    """`local_dir` if complete, else the first complete system dir; None where neither is."""
    return next((folder for folder in (local_dir, *system_dirs) if is_complete(folder)), None)


def resolve_dataset_dir(
    local_dir: Path,
    system_dirs: Sequence[Path],
    is_complete: Callable[[Path], bool],
    download: Callable[[], None],
    missing_advice: str,
) -> Path:
    """`local_dir` if complete, else the first complete system dir, else download into `local_dir`."""
    found = find_dataset_dir(local_dir, system_dirs, is_complete)
    if found is not None:
        return found
    try:
        download()
    except Exception as err:  # any network or HTTP failure ends in the same advice
        looked_in = ", ".join(str(d) for d in (local_dir, *system_dirs))
        raise DatasetNotFoundError(
            f"Dataset not found and the download failed ({type(err).__name__}: {err}).\n"
            f"Looked in: {looked_in}.\nFix: {missing_advice}"
        ) from err
    if not is_complete(local_dir):
        raise DatasetNotFoundError(f"Download finished but {local_dir} is incomplete. Fix: {missing_advice}")
    return local_dir
