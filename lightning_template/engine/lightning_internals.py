"""Every private attribute of Lightning that the template touches, in one place.

Lightning's public API has no hook for these; each function says what it is for. They are why `lightning<2.7`
is pinned: `tests/test_lightning_internals.py` checks each name of `USED` on a real Trainer and fails naming the
one a new Lightning release moved, so an upgrade is a matter of editing this file.
"""

from __future__ import annotations

from typing import Any

from lightning import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

# (owner, dotted attribute): what the functions below read or call.
USED = (
    ("trainer", "fit_loop.epoch_loop._should_accumulate"),
    ("trainer", "fit_loop._data_fetcher"),
    ("trainer", "fit_loop._combined_loader"),
    ("trainer", "_accelerator_connector.cluster_environment"),
    ("trainer", "_signal_connector.received_sigterm"),
    ("trainer", "_signal_connector._slurm_sigusr_handler_fn"),
    ("trainer", "_logger_connector.should_update_logs"),
    ("ModelCheckpoint", "_last_global_step_saved"),
    ("ModelCheckpoint", "_save_checkpoint"),
    ("ModelCheckpoint", "_should_skip_saving_checkpoint"),
    ("ModelCheckpoint", "_save_topk_checkpoint"),
    ("ModelCheckpoint", "_monitor_candidates"),
    ("WeightAveraging", "_average_model"),
)


def closes_accumulation_window(trainer: Trainer) -> bool:
    """Whether the current (or just finished) batch is the last micro-batch of an optimizer step, by Lightning's
    own rule (it also steps on an epoch's last, incomplete window)."""
    return not trainer.fit_loop.epoch_loop._should_accumulate()


def logs_this_step(trainer: Trainer) -> bool:
    """Whether Lightning writes this training step's logged values to the loggers (every `log_every_n_steps`)."""
    return trainer._logger_connector.should_update_logs


def train_data_fetcher(trainer: Trainer) -> Any:
    """The fit loop's iterator over the training loader (None before its first epoch)."""
    return trainer.fit_loop._data_fetcher


def forget_train_loader(trainer: Trainer) -> None:
    """Make the fit loop build its training loader again (after the batch size changed)."""
    trainer.fit_loop._combined_loader = None


def cluster_environment(trainer: Trainer) -> Any:
    """The cluster environment (SLURM, torchrun, ...) of every strategy, single-device ones included."""
    return trainer._accelerator_connector.cluster_environment


def stop_after_this_step(trainer: Trainer) -> None:
    """Lightning's own graceful stop: it raises SIGTERMException at the next check, on every rank."""
    trainer._signal_connector.received_sigterm = True


def requeue_slurm_job(trainer: Trainer, signum: int) -> None:
    """Lightning's SLURM handler: saves `hpc_ckpt_<n>.ckpt` and requeues the job."""
    trainer._signal_connector._slurm_sigusr_handler_fn(signum, None)


def mark_saved_at(callback: ModelCheckpoint, step: int) -> None:
    """Tell a checkpoint callback that its file already holds `step` (it then does not write it again)."""
    callback._last_global_step_saved = step


def save_now(callback: ModelCheckpoint, trainer: Trainer) -> None:
    """Save as the callback would after validation, unless it already did at this step."""
    if not callback._should_skip_saving_checkpoint(trainer):
        callback._save_topk_checkpoint(trainer, callback._monitor_candidates(trainer))


def averaged_model(callback: Any) -> Any:
    """The running average of a WeightAveraging callback (None before its first update)."""
    return callback._average_model
