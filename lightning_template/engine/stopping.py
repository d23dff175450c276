"""A graceful stop: SIGTERM (cluster pre-emption, `kill`), the first Ctrl-C and SLURM's requeue signal stop the run
at the next optimizer-step boundary, where `ResumeCheckpoint` writes `last.ckpt` (and, for a requeue, Lightning its
hpc checkpoint) that resumes exactly."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Literal

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_template.engine.lightning_internals import (
    closes_accumulation_window,
    cluster_environment,
    last_batch_trained,
    requeue_slurm_job,
    stop_after_this_step,
    validation_due,
)


def epoch_ends_here(trainer: Trainer) -> bool:
    """The batch just trained is the epoch's last, or the run's (`max_steps`): Lightning ends the epoch next."""
    return last_batch_trained(trainer) or 0 <= trainer.max_steps <= trainer.global_step


class GracefulStop(Callback):
    """Stops the run where a checkpoint resumes exactly, when asked to by a signal.

    Guarantees: SIGTERM and the first Ctrl-C stop the run at the next optimizer-step boundary (never between the
    micro-batches of one accumulated step; after the validation due after that step; after an epoch's last batch or
    the run's last step, at the epoch's end), every DDP rank at the same one, and Lightning then saves and exits
    (`ResumeCheckpoint` writes `last.ckpt`); a second Ctrl-C aborts at once. On SLURM with auto-requeue, its requeue
    signal stops at such a boundary too (never right after a validation), and Lightning's requeue writes its
    checkpoint and requeues the job there. A request stops the run it came in, no later one; the signal handlers
    before the run are back after it, whether it ends or raises.

    Runs after the other exact-resume callbacks in each hook (`exact_resume`): a batch's seeding before the stop."""

    def __init__(self) -> None:
        self._previous_handlers: dict[int, Any] = {}
        self._stop_requested = False
        self._requeue_signal: int | None = None  # SLURM's requeue signal, once received
        self._requeue_installed = False
        self._requeue_at_exit = False  # decided: Lightning's requeue once the step's every hook has run

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Replaces Lightning's SIGTERM handler for the run: a stop is decided at a step boundary. On SLURM with
        # auto-requeue, also its requeue signal (SIGUSR1): Lightning's handler would save the checkpoint wherever the
        # signal lands, inside a step and at a different step on each rank.
        self._stop_requested, self._requeue_signal = False, None  # a request stops the run it came in, no later one
        self._requeue_at_exit = self._requeue_installed = False
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous_handlers = {
            signal.SIGTERM: signal.signal(signal.SIGTERM, self._request_stop),
            signal.SIGINT: signal.signal(signal.SIGINT, self._graceful_sigint),
        }
        environment = cluster_environment(trainer)
        if isinstance(environment, SLURMEnvironment) and environment.auto_requeue and environment.requeue_signal:
            requeue = environment.requeue_signal
            self._previous_handlers[requeue] = signal.signal(requeue, self._request_requeue)
            self._requeue_installed = True

    def _graceful_sigint(self, signum: int, frame: Any) -> None:
        rank_zero_info("Ctrl-C: stopping at the next step boundary and saving a checkpoint (press again to abort).")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), signal.SIGTERM)

    def _request_stop(self, signum: int, frame: Any) -> None:
        self._stop_requested = True  # no collective call inside a signal handler: decided at the boundary

    def _request_requeue(self, signum: int, frame: Any) -> None:
        self._requeue_signal = signum

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        # A stop waits for the validation due after this batch (Lightning would cut it short, and the resumed run
        # would go on without it) and, after an epoch's last batch or the run's last step, for the epoch's end: its
        # validation and epoch-end checkpoint would otherwise be skipped by the resumed run.
        if closes_accumulation_window(trainer) and not epoch_ends_here(trainer):
            self._stop_if_requested(trainer, at="step")

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        inside_an_epoch = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        if inside_an_epoch and closes_accumulation_window(trainer) and not epoch_ends_here(trainer):
            self._stop_if_requested(trainer, at="validation")

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop_if_requested(trainer)

    def _stop_if_requested(self, trainer: Trainer, at: Literal["step", "validation", "epoch"] = "epoch") -> None:
        """Stop here (at a step's, a validation's or an epoch's end) if any rank was asked to."""
        if trainer.received_sigterm:  # decided at a validation's end, which max_steps follows with the epoch's end
            return
        requested, requeue = self._stop_requested, self._requeue_signal is not None
        if trainer.world_size > 1:  # every rank stops at the same step if any rank was asked to
            requested = trainer.strategy.reduce_boolean_decision(requested, all=False)
            if self._requeue_installed:  # a second collective only where SLURM can ask for a requeue
                requeue = trainer.strategy.reduce_boolean_decision(requeue, all=False)
        if not (requested or requeue) or (at == "step" and validation_due(trainer)):
            return
        if requeue and at == "validation":
            # A requeue's checkpoint, written once the step's hooks have run, would count the step's end twice after
            # a validation (Lightning's rule for a restart there): it waits for the next step.
            return
        self._requeue_at_exit = requeue
        rank_zero_info(
            f"Stopping after optimizer step {trainer.global_step} (SIGTERM, Ctrl-C or requeue); last.ckpt keeps it:"
            " the same command with --ckpt_path last continues."
        )
        stop_after_this_step(trainer)  # Lightning raises SIGTERMException next

    def _restore_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._restore_handlers()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self._requeue_at_exit and isinstance(exception, SIGTERMException):
            # Lightning's own requeue, on every rank at the step the stop was decided at, once its hooks have run (the
            # best checkpoint's save after a validation or at an epoch's end among them): hpc_ckpt_<n>.ckpt in
            # default_root_dir (the requeued job resumes from it), then `scontrol requeue` from rank 0.
            self._requeue_at_exit = False
            rank_zero_info(f"SLURM requeue signal: saving and requeueing after optimizer step {trainer.global_step}.")
            requeue_slurm_job(trainer, self._requeue_signal or signal.SIGUSR1)
        self._restore_handlers()
