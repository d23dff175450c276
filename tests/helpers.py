"""Small pieces shared by the tests."""

from __future__ import annotations

from lightning import Callback, Trainer


class StopAfterEpoch(Callback):
    """Ends fit after epoch `epoch` as an interruption would (the schedule still expects the full run)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer: Trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True
