"""Bit-exact resume, from a checkpoint written at an epoch end, at a step, at a mid-epoch
validation, or on SIGTERM / Ctrl-C in the middle of an epoch; on one process or under DDP.

For any LightningModule and LightningDataModule. What a resumed run must reproduce, and how:
- the order of samples: the samplers in `lightning_template/engine/sampling.py` derive it from
  (seed, epoch) and skip the batches Lightning's restored loop says are done; a plain `DataLoader` the
  model or datamodule returns (shuffled or not, any batch size, workers) gets one (`resumable_loader`);
- random numbers of the training step (dropout, on-device augmentation): every batch
  draws from a generator seeded by (seed, epoch, batch, rank) (`ResumableBatches`), so there is no generator
  state to save, and each DDP rank has its own stream; random transforms in a dataset's `__getitem__` and a
  loader's `collate_fn` (in loader workers or not) are seeded per batch or sample (`SeededBatches`, the tasks'
  `seeded_sample`);
- model, optimizer, scheduler and loop state: Lightning's checkpoint.

Stopping: `GracefulStop` (engine/stopping.py) stops at the next optimizer-step boundary on SIGTERM, Ctrl-C or
SLURM's requeue signal, and `ResumeCheckpoint` writes `last.ckpt` there. A checkpoint is never written in the middle
of a step or with non-finite weights.

Its callbacks, each with what it guarantees: `ResumableBatches` (engine/batches.py: the same batches, the same random
numbers), `ExactResume` (Lightning's restart put right, and what Lightning does not save: engine/saved_state.py),
`GracefulStop` (engine/stopping.py). `exact_resume()` gives them, in the order they run.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import (
    GradientAccumulationScheduler,
    StochasticWeightAveraging,
    WeightAveraging,
)
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.warnings import PossibleUserWarning

from lightning_template.engine.batches import ResumableBatches
from lightning_template.engine.errors import ConfigError, StorageError
from lightning_template.engine.lightning_internals import (
    CheckpointWrites,
    batch_in_progress,
    batches_done,
    closes_accumulation_window,
    epoch_counts,
    finish_restarted_epoch,
    last_batch_trained,
    mark_saved_at,
    may_stop_early,
    restart_time_budgets,
    restarted_mid_epoch,
    restored_after_last_batch,
    skips_due_validation,
    skips_due_validation_at_its_end,
    start_next_epoch,
)
from lightning_template.engine.monitor import early_stopping_decided
from lightning_template.engine.sampling import (
    inside_an_epoch,
)
from lightning_template.engine.saved_state import (
    MetricsAndPlateauStep,
    PendingGradients,
    few,
    frozen_parts,
    keeps_own_state,
    restore_frozen_parts,
    warn_of_own_buffers,
    warn_of_state_no_checkpoint_holds,
)
from lightning_template.engine.stopping import GracefulStop, epoch_ends_here
from lightning_template.engine.storage import write_checkpoints_whole

# Lightning's callbacks that set up each epoch in on_train_epoch_start, from their saved state, and can run it again
# for the same epoch: Lightning does not run it for an epoch restarted in its middle, the engine does, at its first
# batch (the epoch's accumulation; the averaging's learning-rate schedule, set up as its first epoch starts).
EPOCH_SETUPS = (GradientAccumulationScheduler, StochasticWeightAveraging)


def user_hooks(trainer: Trainer, module: LightningModule, hook: str) -> list[Callback | LightningModule]:
    """The callbacks, and the module, whose `hook` is the user's (not Lightning's or the engine's)."""

    def users(hook_owner: Callback | LightningModule) -> bool:
        defined_in = next(c for c in type(hook_owner).__mro__ if hook in vars(c))
        return not defined_in.__module__.startswith(("lightning.", "pytorch_lightning.", f"{__package__}."))

    return [owner for owner in [*trainer.callbacks, module] if users(owner)]


def stateless_epoch_setups(trainer: Trainer, module: LightningModule) -> list[str]:
    """The user's `on_train_epoch_start` hooks of objects that keep nothing in the checkpoint (no
    `on_save_checkpoint`, a callback no `state_dict`): what they set up for an epoch is not there in an epoch resumed
    in its middle, where Lightning does not run them."""
    owners = [
        owner
        for owner in user_hooks(trainer, module, "on_train_epoch_start")
        if not isinstance(owner, EPOCH_SETUPS) and not keeps_own_state(owner)
    ]
    return [f"{type(owner).__name__}.on_train_epoch_start" for owner in owners]


def at_step_boundary(trainer: Trainer) -> bool:
    """No step is half done: no batch between forward and end, no accumulated gradient pending."""
    return not batch_in_progress(trainer) and closes_accumulation_window(trainer)


def warn_skipped_validation(epoch: int, done: int) -> None:
    rank_zero_warn(
        f"ExactResume: resuming epoch {epoch} after {done} batches, from a checkpoint written before the validation"
        " due after that batch had finished (a step checkpoint written at that batch): Lightning goes on without"
        " running it, so its metrics (and the best checkpoint, early stopping or plateau step they decide) are not"
        " the run's that was stopped. last.ckpt and the best-epoch checkpoint are written after it."
    )


def starts_no_epoch(trainer: Trainer) -> bool:
    """Resumed after the last batch of the run's last epoch (`max_epochs`), or at its end: the run starts no epoch, and
    continues none from its middle."""
    epochs = epoch_counts(trainer)
    batches_left = inside_an_epoch(trainer) and not last_batch_trained(trainer)
    return not batches_left and 0 < (trainer.max_epochs or 0) <= max(epochs.started, epochs.processed)


def warn_if_swa_has_ended(trainer: Trainer, at_its_end: bool) -> None:
    """Lightning's StochasticWeightAveraging sets up its schedule in the epochs it runs, and puts its average into the
    model at the end of training: a run resumed after its last averaging epoch, or at its end (reached, or decided
    by early stopping) once averaging had begun, does neither."""
    started = epoch_counts(trainer).started  # epochs whose on_train_epoch_start ran
    swa = [c for c in trainer.callbacks if isinstance(c, StochasticWeightAveraging)]
    if any(trainer.current_epoch > c.swa_end or (at_its_end and started > c.swa_start) for c in swa):
        rank_zero_warn(
            "ExactResume: Lightning's StochasticWeightAveraging, resumed after its last averaging epoch or at the run's"
            " end, does not set up its learning-rate schedule or put its average into the model again: the run is"
            " not the one never stopped. Lightning's WeightAveraging (or EMAWeightAveraging) keeps the average in"
            " every checkpoint."
        )


class ResumeCheckpoint(CheckpointWrites):
    """`last.ckpt`, rewritten at every epoch end (or validation) and on a graceful stop, never half a step.

    Installed in every run by train.py; `--ckpt_path last` resumes from it."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs = {"filename": "last", "enable_version_counter": False, "save_on_exception": True, **kwargs}
        # At every epoch's end, whatever the validation schedule (ModelCheckpoint's own would save after the
        # validations instead where they run inside the epoch: the batches after the epoch's last one would be missing).
        super().__init__(**kwargs, save_on_train_epoch_end=True)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        write_checkpoints_whole(trainer)  # a full disk or a kill while writing one leaves the previous file intact

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        # The file already holds this step: a resume refused at start must not overwrite it.
        mark_saved_at(self, checkpoint["global_step"])

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # After a validation inside an epoch too (val_check_interval < 1, a time interval): ModelCheckpoint's save
        # (its epoch-end one, which save_on_train_epoch_end makes due whatever the schedule; none twice at a step).
        # A validation after an epoch's last batch (check_val_every_n_epoch > 1, val_check_interval < 1) or the
        # run's last step is saved by the epoch's end that follows: written here, the run would resume into an epoch
        # already trained, whose end it logged before it stopped (or, at max_steps, would never end that epoch).
        if not (inside_an_epoch(trainer) and epoch_ends_here(trainer)):
            super().on_train_epoch_end(trainer, pl_module)

    def write_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not at_step_boundary(trainer):
            rank_zero_warn(
                f"{filepath}: not written in the middle of an optimizer step (between micro-batches of an"
                " accumulated step, or inside a failing one); the previous checkpoint stays."
            )
            return
        if not all(torch.isfinite(p).all() for p in trainer.lightning_module.parameters()):
            rank_zero_warn(f"{filepath}: not written, the weights are not finite; the previous checkpoint stays.")
            return
        super().write_checkpoint(trainer, filepath)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # Nothing trained, or a setting refused (the run is started again with the fix): nothing to resume. A checkpoint
        # that could not be written (a full disk): another would fail the same way, or record the one not written.
        if trainer.global_step == 0 or isinstance(exception, (ConfigError, StorageError)):
            return
        # A save failing here (the full disk that failed the run) must not escape: Lightning would skip its teardown
        # and leave its SIGTERM handler installed, catching the signals meant for whatever the process runs next.
        try:
            super().on_exception(trainer, pl_module, exception)
        except Exception as err:
            rank_zero_warn(f"{self.dirpath}: no checkpoint written after the {type(exception).__name__} ({err}).")


class ExactResume(Callback):
    """Puts right each way Lightning's restored loop, and the checkpoint, differ from the run never stopped.

    Guarantees, at a resume (said in one line where it cannot):
    - the restarted epoch continues as in the run never stopped: an epoch restored at its end (`max_steps`) is not
      ended twice; one restored after its last batch is done and the next starts in full; one restored in its
      middle continues after its last batch (`ResumableBatches` skips those done), with the epoch setups of
      Lightning's callbacks (`EPOCH_SETUPS`) that Lightning does not run again;
    - what Lightning does not save is saved and put back (`state_dict`): early stopping's decision to stop, the
      metrics (what a ReduceLROnPlateau, a callback's monitor and the final summary read), the plateau step still
      due, the parts frozen, and in manual optimization the gradients not yet stepped with;
    - the time budget of `--trainer.max_time` starts again; no checkpoint is written twice at one step; a run
      resumed at its end ends as the run never stopped (a WeightAveraging's average as the weights);
    - what it cannot put back is said: a loader that cannot skip batches, a checkpoint written inside an accumulated
      step or before a due validation, state no checkpoint holds.

    Works with `ResumableBatches` (found at `setup`), which it calls at the resume, in the order of
    `on_train_start`. Its state is keyed `ExactResume`, as when it was the one callback of exact resume."""

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._batches = ResumableBatches()  # the exact_resume() one, found at setup
        self._saved: dict[str, Any] | None = None
        self._warnings: warnings.catch_warnings | None = None  # Lightning's warning silenced for this run
        self._metrics = MetricsAndPlateauStep()
        self._gradients = PendingGradients()
        self._trainer_loop_skipped = True  # until on_train_start: Lightning skips it when resumed at its end
        self._epoch_setups: list[Callback] = []  # run at a restarted epoch's first batch (EPOCH_SETUPS)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = trainer
        self._batches = the_resumable_batches(trainer)
        if stage == "fit":
            self._trainer_loop_skipped = True

    # -- checkpoint state: what Lightning does not save --------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        if trainer is None or trainer.train_dataloader is None:
            return {}
        module = trainer.lightning_module
        return {
            "should_stop": trainer.should_stop,  # the run's decision to stop, which Lightning does not save
            **frozen_parts(module),
            **self._gradients.state(module),
            **self._metrics.state(trainer),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = state_dict

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        restart_time_budgets(trainer, checkpoint)  # a stop of --trainer.max_time is a pause: the resumed run goes on

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._trainer_loop_skipped = False
        self._epoch_setups = []
        self._gradients.stepped()
        finish_restarted_epoch(trainer)  # before what follows reads the restored loop
        self._batches.warn_if_inexact(trainer)
        if self._saved is None:
            return
        self._restore_saved_state(trainer, pl_module)
        self._batches.restart(trainer)
        if not restarted_mid_epoch(trainer):
            return
        if restored_after_last_batch(trainer):
            self._start_after_last_batch(trainer)
            return
        self._continue_mid_epoch(trainer, pl_module)

    def _restore_saved_state(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """What the checkpoint's run had that Lightning does not restore, put back or said in one line each."""
        # The run never stopped writes no checkpoint twice at one step (`every_n_train_steps` wrote it, or was not due):
        # nor does this one, where the step's first micro-batches after the resume would write it again.
        for callback in trainer.checkpoint_callbacks:
            mark_saved_at(callback, trainer.global_step)
        stops_here = bool(self._saved.get("should_stop") and early_stopping_decided(trainer))
        if stops_here:
            self._stop_as_decided(trainer)
        self._metrics.restore(trainer, self._saved)
        restore_frozen_parts(pl_module, self._saved)
        warn_of_state_no_checkpoint_holds(trainer, pl_module)
        self._gradients.restore(pl_module, self._saved)
        at_its_end = (stops_here and may_stop_early(trainer)) or starts_no_epoch(trainer)
        warn_if_swa_has_ended(trainer, at_its_end=at_its_end)
        warn_of_own_buffers(trainer, pl_module)

    def _continue_mid_epoch(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Resumed in the middle of an epoch: its next batch as in the run never stopped, or why not in one line."""
        self._epoch_setups = [callback for callback in trainer.callbacks if isinstance(callback, EPOCH_SETUPS)]
        # Lightning warns that a loader without state_dict cannot resume mid-epoch: this one continues exactly,
        # or the line below says what happens instead.
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", "You're resuming from a checkpoint that ended before", PossibleUserWarning)
        done = batches_done(trainer)
        if hooks := stateless_epoch_setups(trainer, pl_module):
            rank_zero_warn(
                f"ExactResume: resuming epoch {trainer.current_epoch} after {done} batches: Lightning does not run"
                f" {few(hooks)} again for it, so whatever that sets up for the epoch (a curriculum, a dataset's"
                " epoch) is not set up here, and no checkpoint holds it: keep it in state_dict or on_save_checkpoint,"
                " or set it up where it is used."
            )
        if not self._batches.continue_mid_epoch(trainer, done):  # seeded there, and its batches skipped, or said
            return
        if skips_due_validation(trainer):
            warn_skipped_validation(trainer.current_epoch, done)
            return
        if self._warn_if_inside_accumulated_step(trainer, done):
            return
        rank_zero_info(f"ExactResume: continuing epoch {trainer.current_epoch} after {done} batches.")

    def _warn_if_inside_accumulated_step(self, trainer: Trainer, done: int) -> bool:
        """Resumed after `done` batches, inside an accumulated step whose first gradients no checkpoint holds: said."""
        scheduled = [c for c in self._epoch_setups if isinstance(c, GradientAccumulationScheduler)]
        accumulation = scheduled[0].get_accumulate_grad_batches(trainer.current_epoch) if scheduled else None
        accumulation = accumulation or trainer.accumulate_grad_batches
        within = done % accumulation
        if within and not last_batch_trained(trainer):
            rank_zero_warn(
                f"ExactResume: resuming epoch {trainer.current_epoch} after {done} batches, inside an accumulated step"
                f" of {accumulation}: the checkpoint holds no gradient of its first {within}"
                " micro-batches, so the step is taken without them and the run is not the one never stopped (such a"
                " checkpoint comes from a validation every N batches, N not a multiple of accumulate_grad_batches;"
                " last.ckpt is never written there)."
            )
            return True
        return False

    def _stop_as_decided(self, trainer: Trainer) -> None:
        """Early stopping had decided to stop the run before its checkpoint was written: the resumed run has decided
        too, and stops at once, as it did (or trains on while `--trainer.min_epochs`/`min_steps` ask for more, as it
        did). Lightning restores the callback but not `trainer.should_stop`, and would train to the next validation.
        A stop of `--trainer.max_time` or of your own code is a pause: the resumed run goes on."""
        trainer.should_stop = True
        message = (
            "ExactResume: early stopping had decided to stop the run before its checkpoint was written: it stops at"
            " once (unless --trainer.min_epochs or min_steps ask for more). To train it further, start a new run from"
            " its weights."
        )
        if not restarted_mid_epoch(trainer) or not may_stop_early(trainer):  # min_epochs/min_steps: the epoch goes on
            rank_zero_info(message)
            return
        # What the run never stopped did at that epoch's end is not run.
        rank_zero_warn(f"{message} Written in the middle of an epoch, it stops without that epoch's end (its"
                       " on_train_epoch_end hooks, epoch-interval schedulers).")  # fmt: skip

    def _start_after_last_batch(self, trainer: Trainer) -> None:
        """Restarted from a checkpoint written after an epoch's last batch, before that epoch's end: Lightning counts
        the epoch as done, and the next one starts here as in the run never stopped, seeded and in its order."""
        epoch, done = trainer.current_epoch - 1, batches_done(trainer)
        skipped = skips_due_validation(trainer)
        start_next_epoch(trainer)
        self._batches.next_epoch_starts_here()
        if skipped:
            warn_skipped_validation(epoch, done)
        # The checkpoint (at the batch's end: a step checkpoint) came before that epoch's end, which never runs.
        ends = user_hooks(trainer, trainer.lightning_module, "on_train_epoch_end")
        message = f"ExactResume: continuing after the last batch of epoch {epoch}, with epoch {epoch + 1}"
        if ends:
            rank_zero_warn(
                f"{message}: Lightning counts epoch {epoch} as done, so"
                f" {few([f'{type(owner).__name__}.on_train_epoch_end' for owner in ends])} never runs for it (the"
                " checkpoint was written at its last batch, before its end), and what that does there is not the run"
                " never stopped's. Checkpoints written at epoch ends (last.ckpt) resume with it."
            )
        elif not skipped:
            rank_zero_info(f"{message} (Lightning counts epoch {epoch} as done).")

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._gradients.after_backward(pl_module)

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        self._gradients.stepped()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        for callback in self._epoch_setups:  # after every callback's on_train_start (the scheduler's own checks)
            callback.on_train_epoch_start(trainer, pl_module)
        self._epoch_setups = []

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._metrics.on_train_epoch_end(trainer)

    def _restore(self) -> None:
        if self._warnings is not None:
            self._warnings.__exit__(None, None, None)
            self._warnings = None

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._restore()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Resumed at its end, the run trains nothing: Lightning runs neither on_train_start nor on_train_end.
        if self._saved is None or not self._trainer_loop_skipped:
            return
        # It ends as the run that wrote the checkpoint did: with a WeightAveraging's average as the model's weights.
        for callback in trainer.callbacks:
            if isinstance(callback, WeightAveraging):
                callback.on_train_end(trainer, pl_module)
        warn_if_swa_has_ended(trainer, at_its_end=True)
        self._metrics.restore_metrics(trainer, self._saved)  # for the run's final metrics
        if skips_due_validation_at_its_end(trainer):
            warn_skipped_validation(trainer.current_epoch, batches_done(trainer))
        if inside_an_epoch(trainer):  # `max_steps` reached inside it: the run never stopped went on to its end
            rank_zero_warn(
                f"ExactResume: the checkpoint was written at max_steps inside epoch {trainer.current_epoch} (at a"
                " validation, or a step checkpoint), before that epoch's end: Lightning ends the run at once, without"
                " that epoch's end (its on_train_epoch_end hooks, its epoch-level training metrics), which the run"
                " never stopped ran. last.ckpt, written at that epoch's end, resumes with it."
            )

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore()


def the_resumable_batches(trainer: Trainer) -> ResumableBatches:
    """The trainer's ResumableBatches, which ExactResume calls at a resume."""
    found = [callback for callback in trainer.callbacks if isinstance(callback, ResumableBatches)]
    if not found:
        raise ConfigError(
            "ExactResume works with ResumableBatches, which this trainer does not have: install the callbacks of"
            " lightning_template.engine.exact_resume(), all of them, in their order."
        )
    return found[0]


def exact_resume() -> list[Callback]:
    """The callbacks of exact resume, in the order they must run in each hook: `ResumableBatches` seeds a batch and
    `ExactResume` puts an epoch's restart right (calling `ResumableBatches` where the resume needs it) before
    `GracefulStop` decides whether to stop after them (the checkpoint written there holds what they set).
    engine/cli.py installs them, before `ResumeCheckpoint`."""
    return [ResumableBatches(), ExactResume(), GracefulStop()]
