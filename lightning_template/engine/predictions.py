"""Writes `predict` results as CSV: the input, the predicted class name, and every class probability."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch
from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from lightning_template.engine.errors import InterfaceError
from lightning_template.tasks.classification.data.contract import ClassificationData


class CSVPredictionWriter(BasePredictionWriter):
    def __init__(self, output_file: str = "predictions.csv") -> None:
        """
        Args:
            output_file: Where the CSV goes. Under DDP each rank writes `<name>.rank<N>.csv`.
        """
        super().__init__(write_interval="batch")
        self.output_file = Path(output_file)
        self._writer: Any = None
        self._file: Any = None

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        datamodule = trainer.datamodule
        if not isinstance(datamodule, ClassificationData):
            raise InterfaceError(
                "CSVPredictionWriter needs a datamodule with the ClassificationData interface (data/contract.py)"
                f" (num_classes, class_names, predict_inputs()); got {type(datamodule).__name__}."
            )
        path = self.output_file
        if trainer.world_size > 1:
            path = path.with_suffix(f".rank{trainer.global_rank}{path.suffix}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "w", newline="", encoding="utf-8")  # noqa: SIM115 (closed in on_predict_end)
        self._writer = csv.writer(self._file)
        self._writer.writerow(["input", "prediction", "probability", *(f"p_{name}" for name in datamodule.class_names)])

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        prediction: torch.Tensor,
        batch_indices: list[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        datamodule = trainer.datamodule
        probabilities = prediction.float().cpu()
        confidence, predicted = probabilities.max(dim=-1)
        inputs = datamodule.predict_inputs(batch_indices)
        for text, label, p, row in zip(
            inputs, predicted.tolist(), confidence.tolist(), probabilities.tolist(), strict=True
        ):
            self._writer.writerow([text, datamodule.class_names[label], f"{p:.6f}", *(f"{v:.6f}" for v in row)])

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._file is not None:
            self._file.close()
            print(f"predictions written to {self._file.name}", flush=True)
