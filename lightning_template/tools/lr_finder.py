"""Learning-rate range test before training, whose suggestion the whole run then trains with."""

from __future__ import annotations

from typing import Any

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import LearningRateFinder
from lightning.pytorch.utilities import rank_zero_info

from lightning_template.tasks.optim import WarmupSchedule


class LRFinder(LearningRateFinder):
    """Lightning's `LearningRateFinder`, applied to the peak learning rate of every param group.

    Lightning's version writes the suggestion into each group's current `lr` only, which a
    warmup or cosine schedule overwrites at the next step from the group's peak (`initial_lr`),
    and it needs a `model.lr` attribute. Here every group's peak is scaled by
    suggestion / configured lr (groups keep their ratios, e.g. a backbone at 0.1 x), so the
    whole schedule runs at the suggested rate.
    """

    def __init__(self, min_lr: float = 1e-4, max_lr: float = 0.1, num_training_steps: int = 100, **kwargs: Any) -> None:
        """
        Args:
            min_lr: Smallest learning rate of the sweep.
            max_lr: Largest learning rate of the sweep.
            num_training_steps: Steps of the sweep (each at a larger learning rate).
            **kwargs: Further arguments of Lightning's `LearningRateFinder` (`mode`, `early_stop_threshold`).
        """
        super().__init__(min_lr, max_lr, num_training_steps, update_attr=False, **kwargs)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.ckpt_path is not None:  # the sweep would replace the restored training state
            rank_zero_info("LRFinder: resuming from a checkpoint, so no sweep; its learning rates continue.")
            return
        available = trainer.estimated_stepping_batches  # the sweep's steps come from the run's epochs and batches
        if available < self._num_training_steps:
            # Lightning would end the sweep early and blame a diverging loss; spread it over the steps there are.
            rank_zero_info(
                f"LRFinder: the run has {available} optimizer steps (epochs x batches), fewer than num_training_steps"
                f" {self._num_training_steps}: the sweep takes {available}."
            )
            self._num_training_steps = int(available)
        super().on_fit_start(trainer, pl_module)
        suggestion = self.optimal_lr.suggestion() if self.optimal_lr is not None else None
        if suggestion is None:
            rank_zero_info("LRFinder: no suggestion (the loss never fell); training with the configured lr.")
            return
        optimizer = trainer.optimizers[0]
        configured = optimizer.param_groups[0].get("initial_lr", optimizer.param_groups[0]["lr"])
        factor = suggestion / configured
        scheduler = trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None
        if isinstance(scheduler, WarmupSchedule):
            scheduler.scale_peak_lr(factor)
        else:
            for group in optimizer.param_groups:
                group["lr"] *= factor
        rank_zero_info(
            f"LRFinder: peak learning rate {configured:.3g} -> {suggestion:.3g} (every param group x {factor:.3g})."
        )
