"""Weight averaging (configs/presets/ema.yaml, swa.yaml) on Lightning's `WeightAveraging`.

`WeightAveraging` validates with the average and writes it as each checkpoint's `state_dict`;
the live weights and the average's state go beside it, so a resumed run continues both.
Lightning's older `StochasticWeightAveraging` instead keeps the average outside the checkpoints
until training ends: the best checkpoint, `test_after_fit` and any reader of a checkpoint would get
the live weights. Two things are changed here, for EMA and SWA alike (`AverageOnlyInFit`):

- Loading a checkpoint outside fit keeps its `state_dict`, the average. Lightning's callback
  loads the live weights back whenever its average exists, which is the case in `trainer.test`
  right after `fit`: `test_after_fit` would have tested the live weights.
- Nothing is swapped or stored while the average is still the initial model (SWA before
  `swa_epoch_start`): validation and checkpoints then show the live weights.
"""

from __future__ import annotations

from typing import Any

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import EMAWeightAveraging as LightningEMA
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.trainer.states import TrainerFn

from lightning_template.engine.errors import ConfigError


class AverageOnlyInFit:
    """Mixin for a `WeightAveraging` subclass (see the module docstring)."""

    averaged = False  # the average holds weights: updated in this fit, or restored so from its checkpoint

    def started(self, trainer: Trainer) -> bool:
        return trainer.state.fn == TrainerFn.FITTING and self.averaged

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.averaged = False  # WeightAveraging makes the average anew for each fit, from the module
        super().setup(trainer, pl_module, stage)  # type: ignore[misc]

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # WeightAveraging records the step of each update after a step (its should_update, whoever overrides it).
        before = self.state_dict()["latest_update_step"]  # type: ignore[attr-defined]
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # type: ignore[misc]
        self.averaged = self.averaged or self.state_dict()["latest_update_step"] != before  # type: ignore[attr-defined]

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # WeightAveraging updates at an epoch's end (once per epoch) where should_update(epoch_idx=...) says so.
        self.averaged = self.averaged or self.should_update(epoch_idx=trainer.current_epoch)  # type: ignore[attr-defined]
        super().on_train_epoch_end(trainer, pl_module)  # type: ignore[misc]

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._swapped = self.started(trainer)
        if self._swapped:
            super().on_validation_epoch_start(trainer, pl_module)  # type: ignore[misc]

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if getattr(self, "_swapped", False):
            super().on_validation_epoch_end(trainer, pl_module)  # type: ignore[misc]
        self._swapped = False

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.started(trainer):
            super().on_save_checkpoint(trainer, pl_module, checkpoint)  # type: ignore[misc]

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.state.fn == TrainerFn.FITTING:  # resuming: the live weights and the average's state
            super().on_load_checkpoint(trainer, pl_module, checkpoint)  # type: ignore[misc]
            # WeightAveraging loads the average's state (its count of updates) where the live weights are beside it.
            state = checkpoint.get("averaging_state", {}) if "current_model_state" in checkpoint else {}
            self.averaged = int(state.get("n_averaged", 0)) > 0

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.started(trainer):
            super().on_train_end(trainer, pl_module)  # type: ignore[misc]


class EMAWeightAveraging(AverageOnlyInFit, LightningEMA):
    """Lightning's `EMAWeightAveraging` (same arguments: decay, update_every_n_steps, ...), see the module docstring."""


class SWAWeightAveraging(AverageOnlyInFit, WeightAveraging):
    """The equal-weight average of the weights at the end of each epoch from `swa_epoch_start` on, as SWA does.

    Updated at the epoch's last batch rather than at epoch end: validation, which runs before the
    epoch-end hooks, then already sees this epoch's weights in the average.
    """

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
            raise ConfigError(
                f"SWAWeightAveraging: swa_epoch_start={self.swa_epoch_start} as a fraction needs 0 <= it < 1 and"
                f" --trainer.max_epochs (got {trainer.max_epochs}); give an epoch index (an int) instead."
            )
        return int(self.swa_epoch_start * trainer.max_epochs)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._start = self.start_epoch(trainer)
        super().setup(trainer, pl_module, stage)

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and self._epoch_ends  # after a step: set by on_train_batch_end below

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._epoch_ends = trainer.is_last_batch and trainer.current_epoch >= self._start
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
