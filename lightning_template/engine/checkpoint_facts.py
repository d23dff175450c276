"""Facts about the run that wrote a checkpoint, written into every checkpoint: which tracker run it was (`--ckpt_path`
continues that run) and the seed it trained with (a resume in the middle of an epoch needs the same one)."""

from __future__ import annotations

from typing import Any

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from lightning_template.engine.errors import ConfigError
from lightning_template.engine.sampling import global_seed
from lightning_template.engine.tracking import CHECKPOINT_KEY, tracker_runs_of

SEED_KEY = "seed"


class CheckpointFacts(Callback):
    """`checkpoint[CHECKPOINT_KEY]`: {logger class: run id}, so `--ckpt_path` continues the same tracker run (the same
    TensorBoard version folder, MLflow run id, W&B run id); `checkpoint[SEED_KEY]`: the run's seed.

    The seed orders each epoch's samples: a run resumed in the middle of an epoch with another seed would skip the
    batches done in another order, training some samples twice and others never. That is refused in one line; at an
    epoch end another seed only orders the epochs to come, and is said."""

    def __init__(self) -> None:
        self._trained_with: int | None = None  # the seed of the checkpoint that fit resumes from

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = tracker_runs_of(trainer)
        checkpoint[SEED_KEY] = global_seed()

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._trained_with = checkpoint.get(SEED_KEY)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        trained_with, self._trained_with = self._trained_with, None
        if trained_with is None or trained_with == global_seed():
            return
        if trainer.fit_loop.restarted_mid_epoch:
            raise ConfigError(
                f"The checkpoint was written in the middle of epoch {trainer.current_epoch} of a run seeded"
                f" {trained_with}, not {global_seed()}: the batches already trained cannot be skipped in another"
                f" order. Resume with --seed_everything {trained_with}, or from a checkpoint written at an epoch end."
            )
        rank_zero_warn(
            f"The checkpoint's run was seeded {trained_with}; it goes on with seed {global_seed()}: the epochs from"
            f" epoch {trainer.current_epoch + 1} draw their order and random numbers from it."
        )
