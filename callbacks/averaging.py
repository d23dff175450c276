"""Stochastic weight averaging on Lightning's `WeightAveraging`, the base of its `EMAWeightAveraging`.

Lightning's older `StochasticWeightAveraging` callback keeps the averaged weights outside the
checkpoints until training ends: validation, the best checkpoint, `test_after_fit`, export and
serving would all see the raw weights. `WeightAveraging` validates with the average and writes
it as the checkpoint's `state_dict` (the raw weights and the average's state go beside it, so a
resumed run continues both). This subclass averages the weights of the end of each epoch from
`swa_epoch_start` on, with equal weight, as SWA does (validation of an epoch already includes
it); until then it stays out of the way.
"""

from __future__ import annotations

from typing import Any

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import WeightAveraging


class SWAWeightAveraging(WeightAveraging):
    def __init__(self, swa_epoch_start: int | float = 0.5, device: str | None = None, use_buffers: bool = True) -> None:
        """
        Args:
            swa_epoch_start: The first epoch whose final weights enter the average: an epoch index (int), or a
                fraction of max_epochs (float, e.g. 0.5 averages the second half of the run).
            device: Where the averaged copy lives (default: the model's device; "cpu" saves accelerator memory).
            use_buffers: Average buffers too (BatchNorm statistics); else they are the current model's.
        """
        super().__init__(device=device, use_buffers=use_buffers)
        self.swa_epoch_start = swa_epoch_start

    def start_epoch(self, trainer: Trainer) -> int:
        if not isinstance(self.swa_epoch_start, float):
            return self.swa_epoch_start
        if not 0 <= self.swa_epoch_start < 1 or not trainer.max_epochs or trainer.max_epochs < 1:
            raise ValueError(
                f"SWAWeightAveraging: swa_epoch_start={self.swa_epoch_start} as a fraction needs 0 <= it < 1 and"
                f" --trainer.max_epochs (got {trainer.max_epochs}); give an epoch index (an int) instead."
            )
        return int(self.swa_epoch_start * trainer.max_epochs)

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return False  # the base class's hooks never update; on_train_batch_end below does

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # At the epoch's last batch rather than at epoch end: validation, which runs before the
        # epoch-end hooks, then already sees this epoch's weights in the average.
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch and trainer.current_epoch >= self._start:
            self._average_model.update_parameters(pl_module)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._start = self.start_epoch(trainer)
        super().setup(trainer, pl_module, stage)

    def started(self) -> bool:
        """Until the first epoch is averaged the average is the initial model: validate and save the live one."""
        return self._average_model is not None and int(self._average_model.n_averaged) > 0

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._swapped = self.started()
        if self._swapped:
            super().on_validation_epoch_start(trainer, pl_module)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if getattr(self, "_swapped", False):
            super().on_validation_epoch_end(trainer, pl_module)
        self._swapped = False

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.started():
            super().on_save_checkpoint(trainer, pl_module, checkpoint)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.started():
            super().on_train_end(trainer, pl_module)
