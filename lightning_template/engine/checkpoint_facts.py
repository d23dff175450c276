"""Which tracker run wrote a checkpoint, written into every checkpoint: `--ckpt_path` continues that run."""

from __future__ import annotations

from typing import Any

from lightning import Callback, LightningModule, Trainer

from lightning_template.engine.tracking import CHECKPOINT_KEY, tracker_runs_of


class CheckpointFacts(Callback):
    """`checkpoint[CHECKPOINT_KEY]`: {logger class: run id}, so `--ckpt_path` continues the same tracker run (the same
    TensorBoard version folder, MLflow run id, W&B run id)."""

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = tracker_runs_of(trainer)
