"""Every private or non-public attribute of Lightning (and torch) that the project touches, in one place.

Lightning's public API has no hook for these; each function says what it is for. They are why `lightning<2.7`
is pinned: `tests/test_lightning_internals.py` checks each name of `USED` on a real Trainer, checks each function's
behaviour on a tiny real run, and finds any such read elsewhere in the engine, so an upgrade is a matter of editing
this file. The loops (`trainer.fit_loop` and what it holds: its epoch loop, their progress counters and restart
stages) count as non-public: Lightning documents them as an advanced, changing API.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
from lightning import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, EarlyStopping, ModelCheckpoint, Timer
from lightning.pytorch.cli import LightningCLI, _InstantiatorFn
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.trainer import call
from torch.nn.modules.batchnorm import _BatchNorm

# (owner, dotted attribute): what the functions below read or call.
USED = (
    ("trainer", "fit_loop.epoch_loop._should_accumulate"),
    ("trainer", "fit_loop._data_fetcher"),
    ("trainer", "fit_loop._combined_loader"),
    ("trainer", "fit_loop._data_source"),
    ("trainer", "fit_loop.epoch_loop._results"),
    ("trainer", "fit_loop.epoch_loop.val_loop._results"),
    ("trainer", "fit_loop._restarting"),
    ("trainer", "fit_loop._can_stop_early"),
    ("trainer", "fit_loop.epoch_loop._should_check_val_fx"),
    ("trainer", "fit_loop.epoch_loop._skip_next_val"),
    ("trainer", "fit_loop.epoch_loop._batches_that_stepped"),
    ("trainer", "fit_loop.epoch_loop.restarted_on_train_batch_end"),
    ("trainer", "fit_loop.epoch_loop.val_loop.restarted_mid_evaluation"),
    ("trainer", "fit_loop.epoch_loop.update_restart_stage"),
    ("trainer", "fit_loop.epoch_loop.reset_restart_stage"),
    ("trainer", "fit_loop.epoch_loop.val_loop.reset_restart_stage"),
    ("trainer", "fit_loop.reset_restart_stage"),
    ("trainer", "fit_loop._combined_loader_states_to_load"),
    ("trainer", "fit_loop._load_combined_loader_states"),
    ("trainer", "_accelerator_connector.cluster_environment"),
    ("trainer", "_accelerator_connector.use_distributed_sampler"),
    ("trainer", "_signal_connector.received_sigterm"),
    ("trainer", "_checkpoint_connector._hpc_resume_path"),
    ("trainer", "_signal_connector._slurm_sigusr_handler_fn"),
    ("ModelCheckpoint", "_last_global_step_saved"),
    ("ModelCheckpoint", "_save_checkpoint"),
    ("ModelCheckpoint", "_should_save_on_train_epoch_end"),
    ("EarlyStopping", "_check_on_train_epoch_end"),
    ("LightningModule", "_current_fx_name"),
    ("LightningCLI", "_parse_ckpt_path"),
    ("cli", "_InstantiatorFn"),
    ("call", "_call_callback_hooks"),
    ("Metric", "_update_count"),  # torchmetrics' own, through Lightning
    ("Metric", "_computed"),
    # Without an underscore, not public either: the loops' restart stages and progress counters.
    ("trainer", "fit_loop.restarted_mid_epoch"),
    ("trainer", "fit_loop.restarted_on_epoch_end"),
    ("trainer", "fit_loop.is_resuming"),
    ("trainer", "fit_loop.epoch_progress.current.processed"),
    ("trainer", "fit_loop.epoch_loop.restarting"),
    ("trainer", "fit_loop.epoch_loop.batch_idx"),
    ("trainer", "fit_loop.epoch_loop.batch_progress.current.processed"),
    ("trainer", "fit_loop.epoch_loop.batch_progress.is_last_batch"),
    ("trainer", "fit_loop.epoch_loop.scheduler_progress.increment_ready"),
    ("trainer", "fit_loop.epoch_loop.restarted_on_train_batch_end"),
    ("trainer", "fit_loop.epoch_loop.val_loop.batch_progress.is_last_batch"),
    ("trainer", "fit_loop.epoch_loop.val_loop.restarting"),
    ("trainer", "precision_plugin.convert_input"),
    # torch's
    ("torch", "_amp_foreach_non_finite_check_and_unscale_"),
    ("batchnorm", "_BatchNorm"),
)


# -- where the fit loop is ------------------------------------------------------------------------------------------


class EpochCounts(NamedTuple):
    """The fit loop's count of the epochs whose start hooks ran (`started`), whose batches ran (`processed`) and whose
    end ran (`completed`: `trainer.current_epoch`)."""

    started: int
    processed: int
    completed: int


def epoch_counts(trainer: Trainer) -> EpochCounts:
    epochs = trainer.fit_loop.epoch_progress.current
    return EpochCounts(epochs.started, epochs.processed, epochs.completed)


def batches_done(trainer: Trainer) -> int:
    """The batches of the current epoch that have ended (`on_train_batch_end` run), restored when resuming."""
    return trainer.fit_loop.epoch_loop.batch_progress.current.processed


def batch_index(trainer: Trainer) -> int:
    """The `batch_idx` of the training batch that runs now."""
    return trainer.fit_loop.epoch_loop.batch_idx


def batch_in_progress(trainer: Trainer) -> bool:
    """A training batch has started and not ended (between its forward pass and `on_train_batch_end`)."""
    batches = trainer.fit_loop.epoch_loop.batch_progress.current
    # A batch whose `on_train_batch_start` returned -1 (the epoch ends there) is counted processed, never started.
    return batches.started > batches.processed


def last_batch_trained(trainer: Trainer) -> bool:
    """The batch just trained is the epoch's last (Lightning then validates and ends the epoch)."""
    batches = trainer.fit_loop.epoch_loop.batch_progress
    return batches.is_last_batch or batches.current.ready == trainer.num_training_batches


def restarted_mid_epoch(trainer: Trainer) -> bool:
    """The run restarted from a checkpoint written inside an epoch (at a batch's or a validation's end)."""
    return trainer.fit_loop.restarted_mid_epoch


def keeps_first_train_iterator(trainer: Trainer) -> bool:
    """Whether Lightning keeps, for this epoch, the training iterator it made before the epoch started (as it does for
    the first epoch of a resumed run)."""
    return trainer.fit_loop.is_resuming or trainer.fit_loop.epoch_loop.restarting


def step_plateau_scheduler(trainer: Trainer, scheduler: Any, value: Any) -> None:
    """Step a ReduceLROnPlateau as Lightning does at an epoch's end, counted in the loop's scheduler progress."""
    progress = trainer.fit_loop.epoch_loop.scheduler_progress
    progress.increment_ready()
    trainer.lightning_module.lr_scheduler_step(scheduler, value)
    progress.increment_completed()


# -- torch's --------------------------------------------------------------------------------------------------------


def is_batch_norm(layer: torch.nn.Module) -> bool:
    """Any BatchNorm layer (1d, 2d, 3d, lazy, synchronized): what they share is private to torch."""
    return isinstance(layer, _BatchNorm)


@functools.cache
def _unit_scale(device: torch.device) -> torch.Tensor:
    return torch.ones(1, dtype=torch.float32, device=device)


def flag_non_finite(tensors: list[torch.Tensor], found: torch.Tensor) -> None:
    """Set `found` (one float32 on the tensors' device) to 1 if any element of `tensors` (float16 or float32, one
    device and dtype) is NaN or infinite: GradScaler's fused check, with a scale of 1 (each value is written back as
    it was)."""
    torch._amp_foreach_non_finite_check_and_unscale_(tensors, found, _unit_scale(found.device))


def epoch_sums(trainer: Trainer) -> dict[str, dict[str, Any]]:
    """What `self.log(value, on_epoch=True)` in training has reduced so far this epoch: {Lightning's key: {"value":
    its running sum (of value x batch size for a mean), max or min, "count": the samples of a mean}}. Not what
    `on_train_start` logged, which a resumed run logs again."""
    sums = {}
    for key, result in trainer.fit_loop.epoch_loop._results.items():
        if result.is_tensor and result.meta.on_epoch and result.update_called and result.meta.fx != "on_train_start":
            count = result.cumulated_batch_size.clone().cpu() if result.meta.is_mean_reduction else None
            sums[key] = {"value": result.value.detach().clone().cpu(), "count": count}
    return sums


def add_epoch_sums(trainer: Trainer, sums: dict[str, dict[str, Any]]) -> None:
    """Fold the `epoch_sums` of the run that was stopped into the values this run has logged since, taking out of
    `sums` those it folds. Each is folded after its first update here, where the reduction holds this run's first
    value alone: the saved sum then comes first, as Lightning reduces them in the run never stopped (a value logged
    twice in one hook before it is folded is reduced in another order: equal to rounding)."""
    results = trainer.fit_loop.epoch_loop._results
    for key in [key for key in sums if key in results]:
        saved, result = sums.pop(key), results[key]
        value = saved["value"].to(result.value.device)
        if result.meta.is_mean_reduction:
            result.value = value + result.value
            result.cumulated_batch_size = saved["count"].to(value.device) + result.cumulated_batch_size
        elif result.meta.is_sum_reduction:
            result.value = value + result.value
        else:  # max or min
            result.value = result.meta.reduce_fx(value, result.value)
        result._computed = None


def metrics_lightning_resets(trainer: Trainer) -> tuple[list[Any], list[Any]]:
    """The torchmetrics metrics that `self.log(name, metric)` hands to Lightning, which computes and resets them: those
    training logs (at the epoch's end), and those validation logs (at the validation's end)."""
    loop = trainer.fit_loop.epoch_loop
    training, validation = (
        [result.value for result in results.values() if not result.is_tensor]
        for results in (loop._results, loop.val_loop._results)
    )
    return training, validation


def metric_state(metric: Any) -> dict[str, Any]:
    """What a torchmetrics metric has gathered: its states, and its count of updates (which its reduction of a
    state by mean weighs the states with)."""
    cpu = lambda t: t.detach().cpu()  # noqa: E731
    states = {k: [cpu(t) for t in v] if isinstance(v, list) else cpu(v) for k, v in metric.metric_state.items()}
    return {"states": states, "updates": metric._update_count}


def load_metric_state(metric: Any, saved: dict[str, Any]) -> None:
    """Give a torchmetrics metric the `metric_state` it had, on its device."""
    device = metric.device
    for name, value in saved["states"].items():
        setattr(metric, name, [t.to(device) for t in value] if isinstance(value, list) else value.to(device))
    metric._update_count, metric._computed = saved["updates"], None


def closes_accumulation_window(trainer: Trainer) -> bool:
    """Whether the current (or just finished) batch is the last micro-batch of an optimizer step, by Lightning's
    own rule (it also steps on an epoch's last, incomplete window)."""
    return not trainer.fit_loop.epoch_loop._should_accumulate()


def restart_train_iterator(trainer: Trainer) -> None:
    """Make the fit loop's iterator over the training loader again (none before its first epoch)."""
    if trainer.fit_loop._data_fetcher is not None:
        iter(trainer.fit_loop._data_fetcher)


def load_train_loader_states(trainer: Trainer) -> bool:
    """Give the training loaders the states the checkpoint holds for them (a StatefulDataLoader's position), if
    Lightning has not: it skips them when the loaders were built before the checkpoint was restored, as reading
    `trainer.estimated_stepping_batches` in `configure_optimizers` does (Lightning #20550). True if it loaded any."""
    loop = trainer.fit_loop
    if not loop._combined_loader_states_to_load or loop._combined_loader is None:
        return False
    loop._load_combined_loader_states()
    return True


def let_lightning_step_plateau_schedulers(trainer: Trainer) -> None:
    """Let Lightning step ReduceLROnPlateau schedulers at the end of the epoch a run restarted in, as in a run never
    stopped: the fit loop skips that step while it is restarting (`fit_loop.on_advance_end`). Called at the epoch's
    `on_train_epoch_end`, before the check; the loop's children keep their own restarting state."""
    trainer.fit_loop._restarting = False


def may_stop_early(trainer: Trainer) -> bool:
    """Whether `--trainer.min_epochs` and `min_steps` let the run stop now, when it is asked to (`should_stop`)."""
    return trainer.fit_loop._can_stop_early


def finish_restarted_epoch(trainer: Trainer) -> bool:
    """A run with `max_steps` restarted from a checkpoint written at an epoch's end (in its `on_train_epoch_end`):
    Lightning restarts that epoch (it keeps a loop with `max_steps` restarting even at an epoch's end) and runs its
    end again, its `on_train_epoch_end` hooks included (a module counting epochs counts one more). Resumed as
    Lightning resumes such a checkpoint with `max_epochs`: the epoch is done, and the next one starts here as in the
    run never stopped. True if it was such a restart."""
    loop = trainer.fit_loop
    if not loop.restarted_on_epoch_end:
        return False
    loop._restarting = False  # its setter keeps a loop with max_steps restarting
    loop.epoch_loop.restarting = False  # and its validation loop
    loop.epoch_loop.reset_restart_stage()
    loop.epoch_loop.val_loop.reset_restart_stage()
    loop.reset_restart_stage()
    loop.epoch_progress.increment_completed()
    return True


def restored_after_last_batch(trainer: Trainer) -> bool:
    """Restarted from a checkpoint written after an epoch's last batch, before that epoch's end: Lightning counts the
    epoch as done when it restores it (`current_epoch` is already the next one) and runs neither its validation nor
    its epoch-end hooks."""
    loop = trainer.fit_loop
    return (
        loop.restarted_mid_epoch
        and loop.epoch_loop.restarted_on_train_batch_end
        and loop.epoch_loop.batch_progress.is_last_batch
    )


def start_next_epoch(trainer: Trainer) -> None:
    """After `restored_after_last_batch`: the next epoch runs as in the run never stopped. Lightning would run it as
    the restarted one: without its `on_train_epoch_start` hooks, and at its first batch it would end a validation
    that never started (making a validation loader iterator: a draw from torch's generator)."""
    loop = trainer.fit_loop.epoch_loop
    # What Lightning's restarting reset adds (the checkpoint was written before the count): an epoch's last batch
    # always takes an optimizer step.
    loop._batches_that_stepped += 1
    loop.restarting = False
    trainer.fit_loop.reset_restart_stage()


def validation_due(trainer: Trainer) -> bool:
    """Whether Lightning validates after the training batch that has just ended (by the run's schedule)."""
    loop = trainer.fit_loop.epoch_loop
    return not loop._skip_next_val and loop._should_check_val_fx(trainer.fit_loop._data_fetcher)


def skips_due_validation(trainer: Trainer) -> bool:
    """A run restarted from a checkpoint written before the validation due after its batch had finished: at the
    batch's end (`every_n_train_steps`), or during that validation (a stop in it) where Lightning does not resume
    it. Lightning goes on past that validation without running it."""
    loop = trainer.fit_loop.epoch_loop
    validation = loop.val_loop
    before_it = loop.restarted_on_train_batch_end
    inside_it = not validation.batch_progress.is_last_batch and not validation.restarted_mid_evaluation
    if not (before_it or inside_it):  # written after it
        return False
    # Lightning decides by `current_epoch` (`check_val_every_n_epoch`): ask about the checkpoint's epoch.
    epochs = trainer.fit_loop.epoch_progress.current
    counted = int(restored_after_last_batch(trainer))
    epochs.completed -= counted
    try:
        return loop._should_check_val_fx(trainer.fit_loop._data_fetcher)
    finally:
        epochs.completed += counted


def skips_due_validation_at_its_end(trainer: Trainer) -> bool:
    """`skips_due_validation` for a run resumed at its end (`max_steps` reached): Lightning skips its whole loop, so
    no restart stage was read from the restored progress. A run ended with its last epoch (its validation and end
    included) skipped nothing."""
    epochs = trainer.fit_loop.epoch_progress.current
    if epochs.completed == epochs.started:
        return False
    epoch_loop = trainer.fit_loop.epoch_loop
    epoch_loop.update_restart_stage()  # and its validation loop's (the fit loop's, which would shift the epoch, not)
    try:
        return skips_due_validation(trainer)
    finally:
        epoch_loop.reset_restart_stage()
        epoch_loop.val_loop.reset_restart_stage()


def restart_time_budgets(trainer: Trainer, checkpoint: dict[str, Any]) -> None:
    """Each run trains for `--trainer.max_time` from its own start. Lightning's Timer restores the time the checkpoint's
    run had trained, so the run it stopped, resumed, trains nothing and ends as if finished. Called in a callback's
    `on_load_checkpoint`, before the Timer loads its entry: the entry holds no time trained."""
    entries = checkpoint.get("callbacks", {})
    for timer in (callback for callback in trainer.callbacks if isinstance(callback, Timer)):
        if timer.state_key in entries:
            entries[timer.state_key]["time_elapsed"] = {}


def forget_train_loader(trainer: Trainer) -> None:
    """Make the fit loop build its training loader again (after the batch size changed)."""
    trainer.fit_loop._combined_loader = None


def cluster_environment(trainer: Trainer) -> Any:
    """The cluster environment (SLURM, torchrun, ...) of every strategy, single-device ones included."""
    return trainer._accelerator_connector.cluster_environment


def stop_after_this_step(trainer: Trainer) -> None:
    """Lightning's own graceful stop: it raises SIGTERMException at the next check, on every rank."""
    trainer._signal_connector.received_sigterm = True


def slurm_resume_path(trainer: Trainer) -> str | None:
    """The checkpoint Lightning resumes a SLURM job from when none is given: a requeued job's `hpc_ckpt_<n>.ckpt`."""
    return trainer._checkpoint_connector._hpc_resume_path if SLURMEnvironment.detect() else None


def requeue_slurm_job(trainer: Trainer, signum: int) -> None:
    """Lightning's SLURM handler: saves `hpc_ckpt_<n>.ckpt` and requeues the job."""
    trainer._signal_connector._slurm_sigusr_handler_fn(signum, None)


def mark_saved_at(callback: ModelCheckpoint, step: int) -> None:
    """Tell a checkpoint callback that its file already holds `step` (it then does not write it again)."""
    callback._last_global_step_saved = step


def reads_at_train_epoch_end(callback: Callback, trainer: Trainer) -> bool:
    """Whether a ModelCheckpoint or EarlyStopping reads its monitored metric at the training epoch's end (where
    Lightning decides it, by the run's validation schedule), not after each validation."""
    if isinstance(callback, ModelCheckpoint):
        return callback._should_save_on_train_epoch_end(trainer)
    return isinstance(callback, EarlyStopping) and bool(callback._check_on_train_epoch_end)


def call_before_batch_hooks(trainer: Trainer, before: Callable[[], None]) -> Callable[[], None]:
    """Call `before()` each time a loop hands a batch to the module's batch hooks (`on_before_batch_transfer`, the
    move to the device, `on_after_batch_transfer`), before them: through the precision plugin's `convert_input`,
    which the loops call just before (the trainer's, not the module's: the module stays as it is, to copy or pickle);
    returns what undoes it."""
    plugin = trainer.precision_plugin
    convert = plugin.convert_input

    def before_then_convert(data: Any) -> Any:
        before()
        return convert(data)

    plugin.convert_input = before_then_convert  # type: ignore[method-assign]
    return lambda: vars(plugin).pop("convert_input", None)


def replaces_samplers(trainer: Trainer) -> bool:
    """Whether Lightning puts its distributed sampler into the loaders (`--trainer.use_distributed_sampler`)."""
    return trainer._accelerator_connector.use_distributed_sampler


def wrap_train_loader(trainer: Trainer, wrap: Callable[[Any], Any]) -> None:
    """Pass the training loader(s) that the module, the datamodule or `fit(train_dataloaders=...)` gives through
    `wrap`, where Lightning requests them (so Lightning records their arguments, as for its own samplers)."""
    source = trainer.fit_loop._data_source
    original = source.__dict__.get("unwrapped_dataloader", source.dataloader)  # once, however many fits
    source.unwrapped_dataloader = original
    source.dataloader = lambda: wrap(original())


class CheckpointWrites(ModelCheckpoint):
    """ModelCheckpoint's private write of one file, under a public name that a subclass overrides (calling
    `super().write_checkpoint` to write): `write_checkpoint`, where ModelCheckpoint writes any file it saves."""

    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        self.write_checkpoint(trainer, filepath)

    def write_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)


class CLIHooks(LightningCLI):
    """LightningCLI's private step that the project replaces, under a public name: `apply_checkpoint`, where
    LightningCLI would read `--ckpt_path`'s hyper-parameters into the model's config (once more)."""

    def _parse_ckpt_path(self) -> None:
        self.apply_checkpoint()

    def apply_checkpoint(self) -> None:
        super()._parse_ckpt_path()


class _Instantiator:
    """LightningCLI's instantiator of the model or the datamodule (`key`), handed only the links the class takes
    (`links_taken`), then `after(built)` where given (a class, not a closure: a spawning DDP launcher pickles the
    parser that holds it)."""

    def __init__(self, cli: LightningCLI, key: str, after: Callable[[Any], None] | None = None) -> None:
        self.lightning, self.key, self.after = _InstantiatorFn(cli=cli, key=key), key, after

    def __call__(self, class_type: type, *args: Any, applied_instantiation_links: dict, **kwargs: Any) -> Any:
        links = links_taken(self.key, applied_instantiation_links, kwargs)
        built = self.lightning(class_type, *args, applied_instantiation_links=links, **kwargs)
        if self.after is not None:
            self.after(built)
        return built


def links_taken(key: str, links: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """The links into `key` (`model.init_args.num_classes`: value) whose argument the class is called with.

    jsonargparse counts a link whose target the class lacks as applied (a datamodule's fact the model does not
    take: it sets nothing), and Lightning's instantiator records every applied link among the hyper-parameters: the
    checkpoint would then hold an argument the model does not take, and resuming from it would pass it."""

    def argument(target: str) -> str:
        name = target.removeprefix(f"{key}.")
        return name.removeprefix("init_args.").partition(".")[0]

    return {k: v for k, v in links.items() if not k.startswith(f"{key}.") or argument(k) in arguments}


def add_datamodule_hook(cli: LightningCLI, after: Callable[[LightningDataModule], None]) -> None:
    """Call `after(datamodule)` right after LightningCLI builds the datamodule (with its own instantiator, which
    records the config as the datamodule's hyper-parameters), before the links read its attributes into the model."""
    cli.parser.add_instantiator(_Instantiator(cli, "data", after), LightningDataModule, subclasses=True, prepend=True)


def record_only_links_taken(cli: LightningCLI) -> None:
    """The model's hyper-parameters (and so its checkpoint) hold only the linked facts its class takes
    (`links_taken`): LightningCLI's instantiator of the model, handed those alone."""
    cli.parser.add_instantiator(_Instantiator(cli, "model"), LightningModule, subclasses=True, prepend=True)


@contextlib.contextmanager
def datamodules_named_by_class() -> Iterator[None]:
    """While LightningCLI builds the classes: a datamodule's `str()` is its class name.

    jsonargparse formats the datamodule into a debug message for every linked fact it lacks (engine/facts.py),
    and Lightning's `LightningDataModule.__str__` calls each of its `*_dataloader` methods to describe them, before
    `setup`, and fails on a dict of training loaders."""
    describe = LightningDataModule.__str__
    LightningDataModule.__str__ = lambda self: type(self).__name__  # type: ignore[method-assign]
    try:
        yield
    finally:
        LightningDataModule.__str__ = describe  # type: ignore[method-assign]


# Lightning calls every hook of every callback, through `profiler.profile(f"[Callback]{callback.state_key}...")`
# whatever the profiler: about 80 calls in each training step of a run with the engine's and a task's callbacks, of
# which fewer than ten do anything. Where the run chose no profiler, what follows calls only those.


class HooksUnprofiled(PassThroughProfiler):
    """Lightning's default profiler (it records nothing), without the context manager it still makes for every
    hook call (a generator each time, which costs more than most hooks)."""

    def profile(self, action_name: str) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


_call_every_callback_hook = call._call_callback_hooks


def _call_callback_hooks(
    trainer: Trainer, hook_name: str, *args: Any, monitoring_callbacks: bool | None = None, **kwargs: Any
) -> None:
    """Lightning's own dispatch of a callback hook, except that a callback whose hook is `Callback`'s (which does
    nothing) is not called: the same calls in the same order, with the module's `_current_fx_name` set as
    Lightning sets it. Lightning's own where the run profiles (any other profiler)."""
    if not isinstance(trainer.profiler, HooksUnprofiled):
        return _call_every_callback_hook(trainer, hook_name, *args, monitoring_callbacks=monitoring_callbacks, **kwargs)
    idle = getattr(Callback, hook_name, None)
    pl_module = trainer.lightning_module
    if pl_module:
        outer, pl_module._current_fx_name = pl_module._current_fx_name, hook_name
    callbacks = trainer.callbacks  # the live list, as Lightning walks it: a callback a hook adds gets its turn
    if monitoring_callbacks is not None:
        callbacks = [c for c in callbacks if isinstance(c, (EarlyStopping, Checkpoint)) == monitoring_callbacks]
    for callback in callbacks:
        hook = getattr(callback, hook_name)
        if callable(hook) and getattr(hook, "__func__", None) is not idle:
            hook(trainer, trainer.lightning_module, *args, **kwargs)
    if pl_module:
        pl_module._current_fx_name = outer
    return None


class IdleHooksSkipped(Callback):
    """The dispatch above for one run of its trainer (`fit`, `validate`, `test`, `predict`): installed at the run's
    `setup`, Lightning's own back at its `teardown` or where it raises. Nothing after the run sees it; a trainer
    that runs meanwhile in the same process gets Lightning's dispatch from it (its profiler is not
    `HooksUnprofiled`)."""

    def setup(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        call._call_callback_hooks = _call_callback_hooks

    def teardown(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        call._call_callback_hooks = _call_every_callback_hook

    def on_exception(self, trainer: Trainer, pl_module: Any, exception: BaseException) -> None:
        call._call_callback_hooks = _call_every_callback_hook


def skip_idle_hooks(trainer: Trainer) -> None:
    """Where the run chose no profiler (Lightning's default, which records nothing), hook calls that cost what the
    hooks themselves cost: `--trainer.profiler simple` keeps Lightning's profiler and its dispatch. For the runs of
    this trainer only (`IdleHooksSkipped`)."""
    if type(trainer.profiler) is PassThroughProfiler:
        trainer.profiler = HooksUnprofiled()
        trainer.callbacks.append(IdleHooksSkipped())
