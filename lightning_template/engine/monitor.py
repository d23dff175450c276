"""The metric a run is judged by: the best-epoch checkpoint, and the check that every monitored metric is logged.

The job states the metric (`--checkpoint.monitor`, `--early_stopping.monitor`; configs/defaults.yaml watches
`val_loss`, which any task can log, and a classification job `val_acc`); `null` turns either off. A monitored
metric that the model never logs is an error at the end of the first validation, naming the metrics that were
logged (`MonitoredMetrics`). Under DDP, so is a monitored value that differs between the processes (logged without
`sync_dist=True`): each would judge by its own, and the processes part or wait for each other.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason

from lightning_template.engine.errors import ConfigError
from lightning_template.engine.lightning_internals import reads_at_train_epoch_end


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, with epochs counted from 1 in file names, as the console counts them
    (`epoch=5-...` after the 5th epoch)."""

    @staticmethod
    def filename_for(monitor: str) -> str:
        """`epoch={epoch}-val_acc={val_acc:.4f}` for `val_acc` (a `/` in a metric's name is not a folder)."""
        if monitor in COUNTERS:
            return "epoch={epoch}-step={step}"
        return f"epoch={{epoch}}-{monitor.replace('/', '_')}={{{monitor}:.4f}}"

    def format_checkpoint_name(self, metrics: dict[str, Any], *args: Any, **kwargs: Any) -> str:
        if "epoch" in metrics:
            metrics = {**metrics, "epoch": metrics["epoch"] + 1}
        return super().format_checkpoint_name(metrics, *args, **kwargs)


class EarlyStop(EarlyStopping):
    """Lightning's EarlyStopping, which `--early_stopping.monitor null` turns off (the CLI then leaves it out)."""

    def __init__(self, monitor: str | None, **kwargs: Any) -> None:
        """
        Args:
            monitor: The metric watched; null: no early stopping (a model that logs no validation metric).
        """
        super().__init__(monitor=monitor or "", **kwargs)


def monitoring_off(callback: Callback) -> bool:
    """A best-epoch checkpoint or early stopping whose monitor was set to null (a model that logs nothing)."""
    return isinstance(callback, (BestCheckpoint, EarlyStop)) and not callback.monitor


def early_stopping_decided(trainer: Trainer) -> EarlyStopping | None:
    """The early stopping that has decided to stop the run, if one has (Lightning keeps its reason once set)."""
    decided = (c for c in trainer.early_stopping_callbacks if c.stopping_reason != EarlyStoppingReason.NOT_STOPPED)
    return next(decided, None)


COUNTERS = ("epoch", "step")  # what a ModelCheckpoint watches besides logged metrics (`step`, mode max: the latest)


def option_of(callback: Callback) -> str:
    """The command-line option that sets a callback's monitor (one added under `trainer.callbacks` has no option)."""
    if isinstance(callback, BestCheckpoint):
        return "--checkpoint.monitor"
    if isinstance(callback, EarlyStop):
        return "--early_stopping.monitor"
    return f"{type(callback).__name__}'s monitor"


def unlogged(callback: Callback, trainer: Trainer) -> bool:
    """Whether `callback` watches a metric that is not logged now (a ModelCheckpoint can also watch `epoch` and
    `step`); an EarlyStopping with `strict=False` goes on without it, as in Lightning."""
    monitor = getattr(callback, "monitor", None)
    if not isinstance(monitor, str) or not getattr(callback, "strict", True):
        return False
    counters = set(COUNTERS) if isinstance(callback, ModelCheckpoint) else set()
    return monitor not in trainer.callback_metrics.keys() | counters


def watched_values(trainer: Trainer) -> list[tuple[str, str]]:
    """(the option, the metric) of each value a callback or a plateau scheduler watches."""
    watched = [(option_of(c), c.monitor) for c in trainer.callbacks if isinstance(getattr(c, "monitor", None), str)]
    if trainer.lightning_module.automatic_optimization:  # in manual optimization the module steps its schedulers
        plateaus = [c.monitor for c in trainer.lr_scheduler_configs if c.reduce_on_plateau and c.monitor]
        watched += [("the plateau scheduler's monitor", monitor) for monitor in plateaus]
    return [(option, monitor) for option, monitor in watched if monitor]


def refuse_per_process_monitors(trainer: Trainer) -> None:
    """Under DDP, a value that a callback or a plateau scheduler watches must be the same in every process (logged
    with `sync_dist=True`, a torchmetrics metric, or equal by construction): compared in one collective."""
    if trainer.world_size == 1 or not (watched := watched_values(trainer)):
        return
    logged = trainer.callback_metrics
    mine = [float(logged[m]) if m in logged and logged[m].numel() == 1 else float("nan") for _, m in watched]
    every = trainer.strategy.all_gather(torch.tensor(mine, device=trainer.strategy.root_device)).cpu()
    for (option, monitor), values in zip(watched, every.T, strict=True):
        if not (values.isnan().all() or (values == values[0]).all()):
            raise ConfigError(
                f"{option} {monitor}: under DDP the processes logged different values of {monitor!r}"
                f" ({', '.join(f'{v:.6g}' for v in values.tolist())}): each would judge by its own (the best"
                " checkpoint and its file name, early stopping, a plateau scheduler's learning rate), and the"
                f" processes part or wait for each other. Log it with self.log({monitor!r}, ..., sync_dist=True), or"
                " as a torchmetrics metric (which syncs itself)."
            )


def unlogged_monitors(trainer: Trainer) -> list[Any]:
    """The callbacks whose monitored metric is not logged when it should be: in the sanity check, only validation's
    metrics are known; after a validation of training, a training metric logged once an epoch is known at the
    epoch's end, and left to a callback reading it there."""
    missing = [callback for callback in trainer.callbacks if unlogged(callback, trainer)]
    if trainer.sanity_checking:
        return [c for c in missing if not c.monitor.startswith("train")]
    return [c for c in missing if not (c.monitor.startswith("train") and reads_at_train_epoch_end(c, trainer))]


class MonitoredMetrics(Callback):
    """At the end of the first validation (the sanity check's, if it runs), every `monitor` of the run's callbacks
    must be among the logged metrics: otherwise a one-line error names the option and what was logged. Metrics of
    the training loop (named `train...`), logged only once training runs, are checked after the first validation of
    training, unless their callback reads them at the training epoch's end (where a metric logged once an epoch is
    known): Lightning's check there. Under DDP, each validation and training epoch's end also checks that every
    monitored value is the same in every process (`refuse_per_process_monitors`)."""

    def __init__(self) -> None:
        self.checked = False

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        refuse_per_process_monitors(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn != "fit":
            return
        refuse_per_process_monitors(trainer)
        if self.checked:
            return
        if trainer.sanity_checking and not trainer.callback_metrics:  # training has not logged anything yet
            return
        self.checked = not trainer.sanity_checking
        if missing := unlogged_monitors(trainer):
            monitor = missing[0].monitor
            shown = ", ".join(sorted(k for k in trainer.callback_metrics if not k.startswith("lr-"))) or "nothing"
            raise ConfigError(
                f"{option_of(missing[0])} {monitor}: the model never logged {monitor!r}; it logged {shown}. Monitor"
                " one of these (with --checkpoint.mode / --early_stopping.mode min for a loss, max for an accuracy),"
                f" log {monitor!r} with self.log in the model, or train without a metric: --checkpoint.monitor null"
                " --early_stopping.monitor null (last.ckpt only, no early stopping)."
            )
