"""What a checkpoint alone needs later, written into every checkpoint: how to read raw inputs, and which
tracker run wrote it."""

from __future__ import annotations

from typing import Any

from lightning import Callback, LightningModule, Trainer

from lightning_template.engine.tracking import CHECKPOINT_KEY, tracker_runs_of
from lightning_template.tasks.classification.data.contract import ServableData
from lightning_template.tasks.classification.input_spec import SPEC_KEY


class CheckpointFacts(Callback):
    """`checkpoint["serving"]`: the datamodule's input spec (image size and normalization, or the tokenizer), so
    serve.py and export.py read raw inputs as this model was evaluated, without the training data.
    `checkpoint[CHECKPOINT_KEY]`: {logger class: run id}, so `--ckpt_path` continues the same tracker run."""

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if isinstance(trainer.datamodule, ServableData):
            checkpoint[SPEC_KEY] = trainer.datamodule.serving_spec()
        checkpoint[CHECKPOINT_KEY] = tracker_runs_of(trainer)
