"""What the engine writes to disk, written so that nothing is lost and a failure is one line.

- `write_whole`, `AtomicCheckpointIO`: every checkpoint file written whole or not at all (a full disk, a kill).
- `check_folder`: a folder a run will write in (its logs), refused before anything runs where it cannot be made.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from fsspec.utils import get_protocol
from lightning import Trainer
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lightning_template.engine.errors import StorageError

PARTIAL = ".partial"  # `.<name>.partial`: a checkpoint being written beside `<name>`


def why_not_written(folder: Path, err: OSError) -> str:
    """Why nothing could be written in `folder`: a file where a folder of its path should be, or what `err` says."""
    in_the_way = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    return f"{in_the_way} is a file, not a folder" if in_the_way is not None else str(err.strerror or err)


def write_whole(path: Path, data: bytes | memoryview) -> None:
    """Write `data` to `path` whole or not at all: into `.<name>.partial` beside it, flushed to disk, then renamed over
    it (one atomic step on one filesystem). A failure removes the partial file and leaves `path` as it was; a kill
    leaves at most the partial file, which no `--ckpt_path` reads and the next save in that folder removes."""
    partial = path.with_name(f".{path.name}{PARTIAL}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        if not isinstance(err, OSError):
            raise
        reason = why_not_written(path.parent, err)
        raise StorageError(
            f"could not write the checkpoint {path} ({reason}): nothing under that name changed. Make room (or fix"
            " the folder), then the same command with --ckpt_path last continues from the last checkpoint written."
        ) from err
    with contextlib.suppress(OSError):  # the rename itself on disk; not every filesystem syncs a folder
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, with each local file written by `write_whole`. Lightning's own writes it in the
    system's temp folder and moves it, which is a copy where the logs are on another filesystem (a tmpfs /tmp, a data
    disk, NFS): a full disk or a kill during that copy left the previous file cut off under its name. Remote storage
    (`s3://...`) is written as Lightning writes it."""

    def __init__(self) -> None:
        super().__init__()
        self._swept: set[Path] = set()  # folders cleared of the partial files an earlier process left

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or get_protocol(str(path)) not in ("file", "local"):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        path = Path(path)
        if path.parent not in self._swept:  # one writer per run folder: rank 0 of the run writing in it
            self._swept.add(path.parent)
            for left in path.parent.glob(f".*{PARTIAL}"):
                left.unlink(missing_ok=True)
        # Serialized first: torch's writer reports a failed write (a full disk) as an unexplained RuntimeError.
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        write_whole(path, buffer.getbuffer())


def write_checkpoints_whole(trainer: Trainer) -> None:
    """The run's checkpoints written by `AtomicCheckpointIO`, where the strategy writes them with Lightning's plain
    writer (a strategy or plugin that brings its own, sharded or asynchronous, keeps it)."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = AtomicCheckpointIO()


def check_folder(folder: Path, option: str) -> None:
    """Refuse in one line, before anything runs, a folder the run will write in that cannot be made: a file where a
    folder of its path should be, a filesystem that refuses (/proc, read-only). Tried by making (and removing) an
    empty folder in its nearest existing one."""
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        reason = "a file, not a folder"
    else:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=existing))
            return
        except OSError as err:
            reason = str(err.strerror or err)
    raise StorageError(f"{option} {folder}: no folder can be made in {existing} ({reason}); give a folder that can be"
                       " written.")  # fmt: skip
