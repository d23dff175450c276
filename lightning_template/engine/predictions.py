"""`train.py predict` writes its results to one CSV file (`--predictions.output_file`), for any LightningModule.

A row per sample. The module says what a row holds by defining

    def prediction_rows(self, outputs, indices: list[int]) -> list[dict[str, Any]]:

(`outputs`: what `predict_step` returned for the batch; `indices`: the samples' positions in the predict
dataset, or in the stream of an IterableDataset); the first row's keys are the columns. A module without it gets
the values of what `predict_step` returns, a row per sample:
- a tensor [batch, ...]: columns `output_0`, `output_1`, ... (each sample's values, flattened);
- a dict of per-sample tensors [batch, ...] or lists: a column per key (`probs_0`, `probs_1`, ... for a key with
  several values a sample);
- a tuple or list of tensors [batch, ...]: as a dict with keys `output0`, `output1`, ...
Anything else (a scalar, a value not per sample) is refused in one line, and no file is left. With several predict
loaders, the first column `dataloader_idx` says which loader a row comes from. A run that fails removes its file: no
partial CSV passes for a result; one with no rows (or no batches) writes none, and says so.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities.data import extract_batch_size

from lightning_template.engine.errors import InterfaceError

HOW = "give the module a `prediction_rows(outputs, indices)` method (lightning_template/engine/predictions.py)"


def _per_sample(name: str, values: Any, count: int, numbered: bool) -> list[dict[str, str]]:
    """The columns of one output, for each of `count` samples: `name` (or `name_0`) for one value a sample,
    `name_<i>` for several."""
    if isinstance(values, torch.Tensor) and values.dim() > 0 and len(values) == count:
        flat = values.detach().float().cpu().reshape(count, -1).tolist()
        if len(flat[0]) == 1 and not numbered:
            return [{name: f"{row[0]:.6g}"} for row in flat]
        return [{f"{name}_{i}": f"{v:.6g}" for i, v in enumerate(row)} for row in flat]
    if isinstance(values, (list, tuple)) and len(values) == count:  # e.g. a text per sample
        return [{name: str(value)} for value in values]
    what = f"a tensor of shape {tuple(values.shape)}" if isinstance(values, torch.Tensor) else type(values).__name__
    raise InterfaceError(
        f"predict_step returned {what} as {name!r} for a batch of {count} samples; a CSV row per sample needs one"
        f" value (or a row of values) per sample: return that, or {HOW}."
    )


def default_rows(outputs: Any, indices: list[int]) -> list[dict[str, Any]]:
    """One row per sample of what predict_step returned: a tensor [batch, ...], a dict or a tuple of them."""
    if isinstance(outputs, torch.Tensor):
        named, numbered = {"output": outputs if outputs.dim() != 1 else outputs[:, None]}, True
    elif isinstance(outputs, Mapping) and outputs:
        named, numbered = {str(k): v for k, v in outputs.items()}, False
    elif isinstance(outputs, (tuple, list)) and outputs and all(isinstance(v, torch.Tensor) for v in outputs):
        named, numbered = {f"output{j}": v for j, v in enumerate(outputs)}, False
    else:
        raise InterfaceError(f"predict_step returned {type(outputs).__name__}; to write it as CSV rows, {HOW}.")
    rows: list[dict[str, Any]] = [{"index": index} for index in indices]
    for name, values in named.items():
        for row, columns in zip(rows, _per_sample(name, values, len(indices), numbered), strict=True):
            row.update(columns)
    return rows


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
        self._streamed: dict[int, int] = {}  # per loader without sample indices (an IterableDataset): samples so far
        self._started = False  # whether this predict ran its loop: Lightning skips it where there are no batches

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
            self._started = False

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        path = self._path(trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._started = True
        self._file = open(path, "w", newline="", encoding="utf-8")  # noqa: SIM115 (closed in on_predict_end)
        self._writer, self._rows, self._streamed = None, 0, {}  # its columns come with the first rows

    def _indices(self, batch_indices: list[int] | None, batch: Any, dataloader_idx: int) -> list[int]:
        """The samples' positions in the predict dataset; an IterableDataset has none: their place in its stream."""
        if batch_indices:
            return list(batch_indices)
        start = self._streamed.get(dataloader_idx, 0)
        self._streamed[dataloader_idx] = start + extract_batch_size(batch)
        return list(range(start, self._streamed[dataloader_idx]))

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
        to_rows = getattr(pl_module, "prediction_rows", default_rows)
        rows = to_rows(prediction, self._indices(batch_indices, batch, dataloader_idx))
        if not rows:
            return
        if len(trainer.num_predict_batches) > 1:  # which loader each row comes from
            rows = [{"dataloader_idx": dataloader_idx, **row} for row in rows]
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
            _say_nothing_written(self._file.name)
        self._file = None

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "predict" and not self._started:  # not called after a failure: on_exception is
            _say_nothing_written(self._path(trainer))

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self._file is None:  # a failed run leaves no file, not even a partial one
            return
        self._file.close()
        Path(self._file.name).unlink(missing_ok=True)
        self._file = None


def _say_nothing_written(path: str | Path) -> None:
    print(f"no predictions: the predict data was empty; nothing written to {path}", flush=True)
