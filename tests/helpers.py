"""Small pieces shared by the tests."""

from __future__ import annotations

import os

from lightning import Callback, Trainer


class StopAfterEpoch(Callback):
    """Ends fit after epoch `epoch` as an interruption would (the schedule still expects the full run)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer: Trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True


class SignalAtBatch(Callback):
    """Sends a real signal to this process after batch `batch` of epoch `epoch`, as `kill` would."""

    def __init__(self, epoch: int, batch: int, signum: int) -> None:
        self.epoch, self.batch, self.signum = epoch, batch, signum

    def on_train_batch_end(self, trainer: Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            os.kill(os.getpid(), self.signum)
