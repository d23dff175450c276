"""Small pieces shared by the tests: interruptions, state comparison, reading TensorBoard logs."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
from pathlib import Path

import torch
from lightning import Callback, Trainer


class StopAfterEpoch(Callback):
    """Ends fit after epoch `epoch` as an interruption would (the schedule still expects the full run)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer: Trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True


class SignalAtBatch(Callback):
    """Sends a real signal to this process after batch `batch` of epoch `epoch`, as `kill` would
    (under DDP only to rank `rank`, if given)."""

    def __init__(self, epoch: int, batch: int, signum: int, rank: int | None = None) -> None:
        self.epoch, self.batch, self.signum, self.rank = epoch, batch, signum, rank

    def on_train_batch_end(self, trainer: Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch) and self.rank in (None, trainer.global_rank):
            os.kill(os.getpid(), self.signum)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a process group's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].numel())


def same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def read_events(event_file: Path):
    """One TensorBoard event file, read (tensorboard's reader is imported here: most test processes never need it)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(event_file))
    accumulator.Reload()
    return accumulator


def event_tags(log_dir: Path, kind: str = "scalars") -> set[str]:
    """Tags of `kind` (scalars, images, tensors, hparams) in every TensorBoard event file of a run."""
    tags: set[str] = set()
    for event_file in log_dir.glob("events.out.tfevents.*"):
        accumulator = read_events(event_file)
        if kind == "hparams":
            with contextlib.suppress(KeyError):  # only the file with the hparams summary has the plugin
                tags |= set(accumulator.PluginTagToContent("hparams"))
        else:
            tags |= set(accumulator.Tags()[kind])
    return tags


def scalar_steps(event_files: list[Path], tag: str) -> list[int]:
    steps = []
    for event_file in event_files:
        accumulator = read_events(event_file)
        if tag in accumulator.Tags()["scalars"]:
            steps += [event.step for event in accumulator.Scalars(tag)]
    return steps


class RecordTrainingSamples(Callback):
    """Writes a fingerprint of every training image this rank trained on, by epoch, to `folder`/rank<r>.json."""

    def __init__(self, folder: str) -> None:
        self.folder, self.seen = Path(folder), {}

    def on_train_batch_start(self, trainer: Trainer, pl_module, batch, batch_idx: int) -> None:
        fingerprints = [hashlib.blake2b(image.cpu().numpy().tobytes(), digest_size=8).hexdigest() for image in batch[0]]
        self.seen.setdefault(str(trainer.current_epoch), []).extend(fingerprints)

    def on_train_end(self, trainer: Trainer, pl_module) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))


class FillDisk(Callback):
    """As epoch `epoch` starts, fills the filesystem of the working folder up to `keep` free bytes (a file `filler`),
    as another program filling a shared disk would."""

    def __init__(self, epoch: int, keep: int) -> None:
        self.epoch, self.keep = epoch, keep

    def on_train_epoch_start(self, trainer: Trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            free = os.statvfs(".")
            with open("filler", "wb") as f:
                f.write(bytes(max(0, free.f_bavail * free.f_frsize - self.keep)))


class Ballast(Callback):
    """`megabytes` of zeros in every checkpoint from epoch `epoch` on: a write that takes a while, a checkpoint that
    grows."""

    def __init__(self, megabytes: int, epoch: int = 0) -> None:
        self.megabytes, self.epoch = megabytes, epoch

    def on_save_checkpoint(self, trainer: Trainer, pl_module, checkpoint: dict) -> None:
        if trainer.current_epoch >= self.epoch:
            checkpoint["ballast"] = torch.zeros(self.megabytes * 2**18)
