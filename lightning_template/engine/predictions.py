"""`train.py predict` writes its results to one CSV file (`--predictions.output_file`), for any LightningModule.

A row per sample. The module says what a row holds by defining

    def prediction_rows(self, outputs, indices: list[int]) -> list[dict[str, Any]]:

(`outputs`: what `predict_step` returned for the batch; `indices`: the samples' positions in the predict
dataset); the first row's keys are the columns. A module without it gets one `output_<i>` column per value of
each sample's output (a tensor of [batch, ...], flattened per sample).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch
from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from lightning_template.engine.errors import InterfaceError


def default_rows(outputs: Any, indices: list[int]) -> list[dict[str, Any]]:
    """One row per sample of a [batch, ...] tensor: its values, flattened."""
    if not isinstance(outputs, torch.Tensor) or outputs.dim() == 0:
        raise InterfaceError(
            f"predict_step returned {type(outputs).__name__}; give the module a `prediction_rows(outputs, indices)`"
            " method that turns it into one dict per sample (lightning_template/engine/predictions.py)."
        )
    values = outputs.detach().float().cpu().flatten(1) if outputs.dim() > 1 else outputs.detach().float().cpu()[:, None]
    return [
        {"index": index, **{f"output_{i}": f"{v:.6g}" for i, v in enumerate(row)}}
        for index, row in zip(indices, values.tolist(), strict=True)
    ]


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
        self._rows = 0

    def _path(self, trainer: Trainer) -> Path:
        path = self.output_file
        return path.with_suffix(f".rank{trainer.global_rank}{path.suffix}") if trainer.world_size > 1 else path

    def remove_earlier_output(self, trainer: Trainer) -> None:
        """An earlier run's file is never left to look like this run's, even if this one fails or writes nothing:
        `train.py predict` calls this first thing (before the datamodule reads its data), Lightning at `setup`."""
        self._path(trainer).unlink(missing_ok=True)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "predict":
            self.remove_earlier_output(trainer)

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        path = self._path(trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "w", newline="", encoding="utf-8")  # noqa: SIM115 (closed in on_predict_end)
        self._writer, self._rows = None, 0  # its columns come with the first rows

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        prediction: Any,
        batch_indices: list[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        indices = list(batch_indices) if batch_indices is not None else []
        to_rows = getattr(pl_module, "prediction_rows", default_rows)
        rows = to_rows(prediction, indices)
        if not rows:
            return
        if self._writer is None:
            self._writer = csv.DictWriter(self._file, fieldnames=list(rows[0]))
            self._writer.writeheader()
        self._writer.writerows(rows)
        self._rows += len(rows)

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._file is None:
            return
        self._file.close()
        if self._rows:
            print(f"predictions written to {self._file.name} ({self._rows} rows)", flush=True)
        else:
            Path(self._file.name).unlink()
            print(f"no predictions: the predict data was empty; nothing written to {self._file.name}", flush=True)
        self._file = None
