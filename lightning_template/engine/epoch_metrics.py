"""The epoch-level training metrics of a run resumed in the middle of an epoch: the values of the whole epoch, as in the
run never stopped, not of the batches after the resume.

What a metric has gathered so far lives outside the checkpoint: in the module's torchmetrics metrics (their states
are in no `state_dict` unless made persistent), and in Lightning's running reduction of each value that `self.log(...,
on_epoch=True)` logs in training. A checkpoint holds both: the states of every torchmetrics metric of the module that
has gathered something, but those Lightning is about to reset (the ones validation logs as objects, and at an epoch's
end those training logs), and, written inside an epoch, Lightning's reductions. A run resumed there starts from them,
so a metric logged for that epoch, and what monitors it (a ReduceLROnPlateau, early stopping, a checkpoint on a
training metric), is the run's own, and a metric gathered across epochs (a best accuracy so far) goes on. Where that
cannot be, the run says so in one line: under DDP (each process gathered its own; the checkpoint holds one
process's), resumed after the epoch's last batch (on one process the metrics gathered across epochs still go on), or
for a value the resumed epoch does not log again (logged in `on_train_epoch_start`, or at some batches only).
"""

from __future__ import annotations

from typing import Any

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torchmetrics import Metric

from lightning_template.engine.lightning_internals import (
    add_epoch_sums,
    epoch_sums,
    last_batch_trained,
    load_metric_state,
    metric_state,
    metrics_lightning_resets,
)
from lightning_template.engine.sampling import fit_position, inside_an_epoch


def _names(keys: Any) -> str:
    """Lightning's keys (`training_step.train_loss`) as the names logged (`train_loss`)."""
    return ", ".join(sorted({key.split(".")[1] if "." in key else key for key in keys}))


def at_its_last_batch(trainer: Trainer) -> bool:
    """Resumed inside an epoch after its last batch: no batch is left to log the epoch's training metrics with."""
    return inside_an_epoch(trainer) and last_batch_trained(trainer)


class EpochMetrics(Callback):
    """Saves, in a checkpoint written inside a training epoch, what the epoch's training metrics have gathered; a run
    resumed there starts from it (see the module's docstring)."""

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._saved: dict[str, Any] = {}
        self._sums: dict[str, Any] = {}  # Lightning's reductions of the stopped run, until this run logs them again
        self._restored: dict[str, Any] = {}  # {name: metric} that training logs, given back: saved until logged again

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        if trainer is None or trainer.lightning_module is None:
            return {}
        in_epoch = inside_an_epoch(trainer)
        add_epoch_sums(trainer, self._sums)  # what this run has logged since a resume, with what came before it
        training, validation = (set(map(id, metrics)) for metrics in metrics_lightning_resets(trainer))
        training |= set(map(id, self._restored.values()))
        reset_now = validation | (set() if in_epoch else training)
        metrics = {
            name: {**metric_state(module), "logged": id(module) in training}
            for name, module in trainer.lightning_module.named_modules()
            if isinstance(module, Metric) and module.update_called and id(module) not in reset_now
        }
        sums = {**self._sums, **epoch_sums(trainer)} if in_epoch else {}
        position, step = fit_position(trainer), trainer.global_step
        return {"position": position, "inside": in_epoch, "step": step, "metrics": metrics, "sums": sums}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = state_dict

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        saved, self._saved, self._sums, self._restored = self._saved, {}, {}, {}
        if not saved or not (saved["metrics"] or saved["sums"]):
            return
        after_last_batch = self._resumed_after_its_last_batch(trainer, saved)
        if not (after_last_batch or self._resumed_where_saved(trainer, saved)):
            return
        modules = {
            name: m for name, m in pl_module.named_modules() if name in saved["metrics"] and isinstance(m, Metric)
        }
        if trainer.world_size > 1 or after_last_batch or at_its_last_batch(trainer):
            self._go_on_across_epochs(trainer, saved, modules)
            return
        for name, metric in modules.items():
            load_metric_state(metric, saved["metrics"][name])
        self._restored = {name: metric for name, metric in modules.items() if saved["metrics"][name]["logged"]}
        self._sums = dict(saved["sums"])

    @staticmethod
    def _go_on_across_epochs(trainer: Trainer, saved: dict[str, Any], modules: dict[str, Metric]) -> None:
        """Resumed where the saved epoch's metrics cannot be the run's: said in one line. On one process, those
        gathered across epochs (never logged, so never reset by Lightning) go on from the checkpoint."""
        why = (
            "each process gathered its own, and the checkpoint holds one process's"
            if trainer.world_size > 1
            else "it was written after the epoch's last batch, which leaves none to log them with"
        )
        across = [] if trainer.world_size > 1 else [name for name in modules if not saved["metrics"][name]["logged"]]
        for name in across:
            load_metric_state(modules[name], saved["metrics"][name])
        lost = [*saved["sums"], *(name for name in saved["metrics"] if name not in across)]
        rank_zero_warn(
            f"ExactResume: epoch {saved['position'][0]}'s metrics ({_names(lost)}) are not the run's after this resume:"
            f" {why}."
        )

    @staticmethod
    def _resumed_after_its_last_batch(trainer: Trainer, saved: dict[str, Any]) -> bool:
        """Saved inside an epoch, at its last batch, and resumed with the next epoch: Lightning counts the saved epoch
        as done on restoring a checkpoint written at that batch's end (a step checkpoint)."""
        epoch = saved["position"][0] if saved.get("inside") and saved.get("position") else None
        return epoch is not None and saved["step"] == trainer.global_step and fit_position(trainer) == (epoch + 1, 0)

    @staticmethod
    def _resumed_where_saved(trainer: Trainer, saved: dict[str, Any]) -> bool:
        """Inside an epoch, at the same batch of the same epoch. Between epochs, at the same step: Lightning counts
        the epoch of an epoch-end checkpoint done on restoring it (`--trainer.max_epochs`), and what is saved there
        (metrics gathered across epochs) goes on in the next."""
        if saved.get("inside", True):  # (a checkpoint of an earlier version has no flag: by position)
            return saved["position"] == fit_position(trainer)
        return saved["step"] == trainer.global_step and not inside_an_epoch(trainer)

    # Lightning's reductions are folded in once this run has logged each value a first time: after a batch's
    # training_step (and its on_train_batch_start), or the module's on_train_batch_end (seen at the next batch, or at
    # the epoch's end).
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if self._sums:
            add_epoch_sums(trainer, self._sums)

    on_train_batch_end = on_train_batch_start  # type: ignore[assignment]

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        add_epoch_sums(trainer, self._sums)
        logged = set(map(id, metrics_lightning_resets(trainer)[0]))
        unlogged = {name: metric for name, metric in self._restored.items() if id(metric) not in logged}
        for metric in unlogged.values():  # Lightning resets only what it logged: not carried into the next epoch
            metric.reset()
        if self._sums or unlogged:
            rank_zero_warn(
                f"ExactResume: {_names([*self._sums, *unlogged])}, logged for epoch {trainer.current_epoch} before the"
                " resume and not since (in on_train_epoch_start, which Lightning does not run again for an epoch"
                " resumed in its middle, or at some batches only), are not logged for it."
            )
        self._sums, self._restored = {}, {}
