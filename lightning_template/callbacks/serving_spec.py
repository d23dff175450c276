"""Writes the datamodule's input spec into every checkpoint, so a checkpoint alone can be served."""

from __future__ import annotations

from typing import Any

from lightning import Callback, LightningModule, Trainer

from lightning_template.data.contract import ServableData
from lightning_template.input_spec import SPEC_KEY


class ServingSpec(Callback):
    """`checkpoint["serving"] = datamodule.serving_spec()`: what serve.py and export.py need to read raw inputs
    as this model was evaluated (image size and normalization, or the tokenizer), without the training data."""

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        datamodule = trainer.datamodule
        if isinstance(datamodule, ServableData):
            checkpoint[SPEC_KEY] = datamodule.serving_spec()
