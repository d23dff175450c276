"""The epoch-level training metrics of a run resumed in the middle of an epoch: the values of the whole epoch, as in the
run never stopped, not of the batches after the resume.

What an epoch-level training metric has gathered so far lives outside the checkpoint: in a torchmetrics metric of the
module (`self.train_acc = MulticlassAccuracy(...)`, whose states are not in its `state_dict` unless made persistent)
and in Lightning's running reduction of what `self.log(..., on_epoch=True)` logs. A checkpoint written inside an
epoch holds both here; a run resumed from it puts them back, so a metric logged for that epoch, and what monitors it
(a ReduceLROnPlateau, early stopping, a checkpoint on a training metric), is the run's own.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torchmetrics import Metric

from lightning_template.engine.lightning_internals import add_epoch_sums, epoch_sums
from lightning_template.engine.sampling import fit_position


def _cpu(state: torch.Tensor | list[torch.Tensor]) -> Any:
    return [t.detach().cpu() for t in state] if isinstance(state, list) else state.detach().cpu()


class EpochMetrics(Callback):
    """Saves, in a checkpoint written inside a training epoch, the states of the module's torchmetrics metrics and
    Lightning's running sums of the epoch's logged values; a run resumed there starts from them (one process: under
    DDP each process gathered its own, and the checkpoint holds rank 0's, which the resume says in one line)."""

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._saved: dict[str, Any] = {}
        self._sums: dict[str, Any] = {}  # Lightning's sums not yet folded into this run's

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        epochs = trainer.fit_loop.epoch_progress.current if trainer is not None else None
        if epochs is None or trainer.lightning_module is None or epochs.started == epochs.processed:
            return {}  # between epochs: the next one starts from nothing
        metrics = {
            name: {state: _cpu(value) for state, value in metric.metric_state.items()}
            for name, metric in trainer.lightning_module.named_modules()
            if isinstance(metric, Metric) and metric.update_called
        }
        return {"position": fit_position(trainer), "metrics": metrics, "sums": epoch_sums(trainer)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = state_dict

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        saved, self._saved, self._sums = self._saved, {}, {}
        if not saved or saved["position"] != fit_position(trainer) or not (saved["metrics"] or saved["sums"]):
            return
        if trainer.world_size > 1:
            rank_zero_warn(
                f"ExactResume: under DDP, the epoch-level training metrics of epoch {trainer.current_epoch}"
                " (torchmetrics states, `self.log(..., on_epoch=True)`) restart from the resume: each process gathered"
                " its own, and the checkpoint holds one process's."
            )
            return
        modules = dict(pl_module.named_modules())
        for name, states in saved["metrics"].items():
            metric = modules.get(name)
            for state, value in states.items() if isinstance(metric, Metric) else ():
                device = metric.device
                setattr(metric, state, [t.to(device) for t in value] if isinstance(value, list) else value.to(device))
        self._sums = dict(saved["sums"])

    # Lightning's sums are folded in once this run has logged each value a first time: after a batch's training_step
    # (and its on_train_batch_start), or the module's on_train_batch_end (seen at the next batch, or the epoch's end).
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if self._sums:
            add_epoch_sums(trainer, self._sums)

    on_train_batch_end = on_train_batch_start  # type: ignore[assignment]

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._sums:
            add_epoch_sums(trainer, self._sums)
            self._sums = {}  # a value the resumed epoch never logged again is not carried into the next one
