"""The fault-injection matrix of exact resume: one cell = (data, accumulation, trigger, model stage).

The data axis holds the project's datamodules and a user's own plain task (tests/plain_task.py: its own
LightningModule and a `DataLoader(shuffle=True, num_workers=2)` with random flips in `__getitem__`).

A cell trains a small real run (3 epochs x 5 batches), interrupts it the way the trigger says,
resumes from the checkpoint that trigger leaves, and the resumed run must end with weights and
metrics bit-identical to the same run never interrupted. Also run as a script, for the cells
whose interruption is a SIGKILL: `python -m tests.matrix CELL_JSON DIRECTORY`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from lightning import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_template.engine import FiniteLossGuard, ResumeCheckpoint, exact_resume
from lightning_template.tasks.classification import (
    FashionMNISTDataModule,
    ImageFolderDataModule,
    SimpleCNN,
    TwoStageFinetuning,
)

from tests.helpers import SignalAtBatch, StopAfterEpoch
from tests.plain_task import RegressionData, Regressor

DATA = ("memory-w0", "files-w2")  # in memory without workers; PNG files, 2 workers, random crops in the workers
# extra:streaming
DATA += ("stream-w2",)  # LitData chunks of encoded PNGs, 2 workers, random crops on the device
# /extra:streaming
PLAIN_TASK = "plain-task-w2"  # a user's own module and DataLoader (tests/plain_task.py): no fine-tuning stages
ACCUMULATION = (1, 2)
TRIGGERS = ("epoch-end", "step-checkpoint", "mid-epoch-validation", "sigterm", "sigkill")
STAGES = ("plain", "stage-1", "stage-2")
BATCHES, EPOCHS = 5, 3  # an odd batch count: the last accumulation window of an epoch is short


@dataclass(frozen=True)
class Cell:
    data: str
    accumulate: int
    trigger: str
    stage: str

    @property
    def id(self) -> str:
        return f"{self.data}-acc{self.accumulate}-{self.trigger}-{self.stage}"

    @property
    def interrupt_epoch(self) -> int:
        return {"plain": 1, "stage-1": 0, "stage-2": 1}[self.stage]  # unfreezing happens at epoch 1


def all_cells() -> list[Cell]:
    cells = [Cell(*values) for values in itertools.product(DATA, ACCUMULATION, TRIGGERS, STAGES)]
    return cells + [Cell(PLAIN_TASK, *values, "plain") for values in itertools.product(ACCUMULATION, TRIGGERS)]


def pairwise_cells() -> list[Cell]:
    """15 cells in which every pair of values of any two factors occurs (5 x 3 trigger-stage pairs,
    with data and accumulation chosen so that their pairs with each other factor are covered too)."""
    cells = []
    for t, trigger in enumerate(TRIGGERS):
        for s, stage in enumerate(STAGES):
            cells.append(Cell(DATA[(t + s) % len(DATA)], ACCUMULATION[(t // 2 + s) % 2], trigger, stage))
    return cells


class KillAtBatch(Callback):
    """SIGKILL: no handler runs, nothing is saved, as at a power cut or the OOM killer."""

    def __init__(self, epoch: int, batch: int) -> None:
        self.epoch, self.batch = epoch, batch

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            os.kill(os.getpid(), signal.SIGKILL)


def weights_file(directory: Path, input_shape: tuple[int, int, int]) -> Path:
    """The 'pretrained' network fine-tuning starts from (a fixed random one: any file will do here)."""
    path = directory / f"pretrained-{input_shape[0]}ch.pt"
    if not path.exists():
        with torch.random.fork_rng():  # the run's own random stream must not depend on whether it existed
            torch.manual_seed(1)
            torch.save(SimpleCNN(input_shape=input_shape).net.state_dict(), path)
    return path


def data_of(cell: Cell, image_root: Path) -> Any:
    """The cell's datamodule (built before the run is seeded: making chunks reseeds)."""
    if cell.data == PLAIN_TASK:
        return RegressionData(batch_size=16, num_workers=2, train_size=16 * BATCHES)
    if cell.data == "memory-w0":
        return FashionMNISTDataModule(batch_size=16, augment=True, num_workers=0)
    if cell.data == "files-w2":
        return ImageFolderDataModule(
            root=str(image_root), image_size=28, batch_size=16, crop_scale=(0.5, 1.0), num_workers=2
        )
    # extra:streaming
    if cell.data.startswith("stream-w"):  # stream-w2 in the matrix; other worker counts in single tests
        from lightning_template.streaming import StreamingImageDataModule

        from convert import convert

        chunks = image_root.parent / f"{image_root.name}-stream"  # encoded PNGs of 32 px: crops of 28 px at random
        if not (chunks / "dataset.json").exists():
            source = ImageFolderDataModule(root=str(image_root), image_size=28, num_workers=0)
            convert(source, str(chunks), images="encoded", size=32, num_workers=1)
        workers = int(cell.data.removeprefix("stream-w"))
        return StreamingImageDataModule(input_dir=str(chunks), batch_size=16, augment=True, num_workers=workers)
    # /extra:streaming
    raise ValueError(f"no such data in the matrix: {cell.data}")


def fit(cell: Cell, directory: Path, image_root: Path, *extra: Callback, ckpt_path: str | None = None) -> Trainer:
    """One run of the cell's setup; `extra` callbacks interrupt it."""
    directory.mkdir(parents=True, exist_ok=True)
    datamodule = data_of(cell, image_root)
    seed_everything(3)
    model: Any = Regressor() if cell.data == PLAIN_TASK else None
    if cell.data != PLAIN_TASK:
        weights = None if cell.stage == "plain" else str(weights_file(directory.parent, datamodule.input_shape))
        model = SimpleCNN(
            num_classes=datamodule.num_classes, input_shape=datamodule.input_shape, warmup_epochs=0.5, weights=weights
        )
    callbacks: list[Callback] = [*exact_resume(), ResumeCheckpoint(dirpath=directory), FiniteLossGuard(), *extra]
    if cell.stage != "plain":
        callbacks.append(TwoStageFinetuning(unfreeze_at_epoch=1, backbone_warmup_epochs=0.5))
    if cell.trigger in ("step-checkpoint", "sigkill"):
        callbacks.append(ModelCheckpoint(dirpath=directory, filename="{step}", every_n_train_steps=2, save_top_k=-1))
    if cell.trigger == "mid-epoch-validation":
        callbacks.append(ModelCheckpoint(dirpath=directory, filename="val-{step}", save_top_k=-1))
    trainer = Trainer(
        max_epochs=EPOCHS, limit_train_batches=BATCHES, limit_val_batches=2, accumulate_grad_batches=cell.accumulate,
        val_check_interval=4 if cell.trigger == "mid-epoch-validation" else None, logger=False,
        enable_progress_bar=False, enable_model_summary=False, deterministic=True, num_sanity_val_steps=0,
        callbacks=callbacks,
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


def interrupt(cell: Cell, directory: Path, image_root: Path) -> Path:
    """Run the cell until its trigger fires; return the checkpoint a user would resume from."""
    epoch = cell.interrupt_epoch
    mid_batch = 2  # the 3rd batch: inside an accumulation window when accumulating 2
    steps_per_epoch = -(-BATCHES // cell.accumulate)
    if cell.trigger == "epoch-end":
        fit(cell, directory, image_root, StopAfterEpoch(epoch))
        return directory / "last.ckpt"
    if cell.trigger == "sigterm":
        with contextlib.suppress(SystemExit):  # Lightning's graceful stop
            fit(cell, directory, image_root, SignalAtBatch(epoch, mid_batch, signal.SIGTERM))
        return directory / "last.ckpt"
    if cell.trigger == "sigkill":
        import subprocess

        spec = json.dumps({**asdict(cell), "image_root": str(image_root)})
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        done = subprocess.run([sys.executable, "-m", "tests.matrix", spec, str(directory)], env=env, timeout=300)
        assert done.returncode == -signal.SIGKILL, done.returncode
        return max(directory.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)  # the newest, as a user would pick
    # A checkpoint written inside the interrupted epoch (after 2 steps, or at the validation after
    # batch 4), as a hard kill right after it would leave: resume from it.
    fit(cell, directory, image_root, StopAfterEpoch(epoch))
    pattern = "step=*.ckpt" if cell.trigger == "step-checkpoint" else "val-step=*.ckpt"
    inside = [
        path for path in directory.glob(pattern)
        if epoch * steps_per_epoch < int(path.stem.rpartition("=")[2]) < (epoch + 1) * steps_per_epoch
    ]  # fmt: skip
    assert inside, f"no {pattern} inside epoch {epoch}"
    return min(inside, key=lambda path: int(path.stem.rpartition("=")[2]))


def main() -> None:
    spec, directory = json.loads(sys.argv[1]), Path(sys.argv[2])
    image_root = Path(spec.pop("image_root"))
    cell = Cell(**spec)
    fit(cell, directory, image_root, KillAtBatch(cell.interrupt_epoch, BATCHES - 1))  # before the epoch-end save


if __name__ == "__main__":
    main()
