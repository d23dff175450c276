"""What a run prints: Rich's progress bar in a terminal, one line per epoch anywhere else.

A progress bar redraws itself many times a second; in a log file (CI, `nohup`, `| tee`) every
redraw stays, and a short run writes megabytes of frames. `EpochLines` prints the epoch's
metrics once, when the epoch (and its validation) is over.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar


class EpochLines(ProgressBar):
    def __init__(self) -> None:
        super().__init__()
        self._enabled = True
        self._epoch_start, self._loss_sum, self._batches = 0.0, 0.0, 0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # A run resumed in the middle of an epoch gets no on_train_epoch_start for it: its time counts from here.
        self.on_train_epoch_start(trainer, pl_module)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch_start = time.monotonic()
        self._loss_sum, self._batches = 0.0, 0

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:  # summed on the device: no synchronization per step
            self._loss_sum, self._batches = self._loss_sum + loss.detach(), self._batches + 1

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._enabled or not trainer.is_global_zero:
            return
        metrics = {
            name.removesuffix("_epoch"): float(value)
            for name, value in sorted(trainer.callback_metrics.items())
            if value.numel() == 1 and not name.endswith("_step") and not name.startswith("lr-")
        }
        if self._batches:  # the epoch's mean, not the last batch's value that train_loss holds
            metrics["train_loss"] = float(self._loss_sum / self._batches)
        if trainer.optimizers:  # the first param group's rate (the monitor logs every group's)
            metrics["lr"] = trainer.optimizers[0].param_groups[0]["lr"]
        shown = "  ".join(f"{name} {value:.4g}" for name, value in metrics.items())
        total = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        elapsed = time.monotonic() - self._epoch_start
        print(f"epoch {trainer.current_epoch + 1}{total}  {shown}  ({elapsed:.1f} s)", flush=True)


def progress_bar(stream: Any = None) -> ProgressBar:
    """Rich's progress bar when `stream` (stdout) is a terminal, else `EpochLines`."""
    return RichProgressBar() if (stream or sys.stdout).isatty() else EpochLines()
