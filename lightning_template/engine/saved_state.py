"""What a resumed run needs of the run that wrote the checkpoint and Lightning's checkpoint does not hold: the parts
of the model frozen, the metrics and the ReduceLROnPlateau step still due, the gradients accumulated by hand. Each is
saved in `ExactResume`'s state and put back at a resume by it; what no checkpoint holds is said."""

from __future__ import annotations

from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelPruning
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.nn import SyncBatchNorm

from lightning_template.engine.errors import ConfigError
from lightning_template.engine.lightning_internals import (
    epoch_counts,
    is_batch_norm,
    last_batch_trained,
    let_lightning_step_plateau_schedulers,
    step_plateau_scheduler,
)
from lightning_template.engine.sampling import inside_an_epoch


def few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


# -- the parts of the model frozen ---------------------------------------------------------------
def frozen_parts(module: LightningModule) -> dict[str, list[str]]:
    """Which parameters do not train, and which BatchNorm layers keep their running statistics fixed: the model's
    state that freezing sets (`requires_grad`, `track_running_stats`), which its state_dict does not hold."""
    return {
        "frozen": [name for name, parameter in module.named_parameters() if not parameter.requires_grad],
        "fixed_statistics": [
            name for name, layer in module.named_modules() if is_batch_norm(layer) and not layer.track_running_stats
        ],
    }


def restore_frozen_parts(module: LightningModule, saved: dict[str, Any]) -> None:
    """Parts of the model that trained when the checkpoint was written, and that this run's `setup` froze again,
    train again: a fine-tuning callback (Lightning's BaseFinetuning) freezes its part in every run's setup and
    unfreezes it at the start of an epoch that has passed. Parts frozen then and trainable now are left so (this
    run no longer freezes them), and said: a callback that froze them during the run would not do so again."""
    if "frozen" not in saved:  # a checkpoint that does not say
        return
    frozen, fixed = set(saved["frozen"]), set(saved["fixed_statistics"])
    parameters = dict(module.named_parameters())
    refrozen = [name for name, p in parameters.items() if not p.requires_grad and name not in frozen]
    thawed = [name for name, p in parameters.items() if p.requires_grad and name in frozen]
    for name in refrozen:
        parameters[name].requires_grad_(True)
    for name, layer in module.named_modules():
        if is_batch_norm(layer) and name not in fixed:
            layer.track_running_stats = True
    if refrozen:
        rank_zero_info(
            f"ExactResume: {len(refrozen)} parameter tensors ({few(refrozen)}) train again, as when the checkpoint"
            " was written: this run's setup froze them (a fine-tuning callback or the module's own code unfroze"
            " them before that, and does not again)."
        )
    if thawed:
        rank_zero_warn(
            f"ExactResume: {len(thawed)} parameter tensors ({few(thawed)}) were frozen when the checkpoint was"
            " written and train in this run, which no longer freezes them: left so."
        )


# -- the metrics, and the ReduceLROnPlateau step still due ---------------------------------------
def plateau_schedulers(trainer: Trainer) -> list[Any]:
    """The ReduceLROnPlateau schedulers that Lightning steps (those of automatic optimization)."""
    if not trainer.lightning_module.automatic_optimization:
        return []
    return [config for config in trainer.lr_scheduler_configs if config.reduce_on_plateau]


def pending_plateau_epoch(trainer: Trainer) -> int | None:
    """The epoch whose end-of-epoch ReduceLROnPlateau step has not been taken yet, at a checkpoint written now.

    Lightning takes it after the epoch-end callbacks (the epoch-end checkpoint is written before it); inside an
    epoch it is still to come. None when there is none to take: between epochs, or at the end of an epoch that
    stopped before its last batch (`max_steps`), where Lightning takes none."""
    epochs = epoch_counts(trainer)
    if inside_an_epoch(trainer):
        return epochs.processed
    if epochs.completed < epochs.processed and last_batch_trained(trainer):  # its end, before the step
        return epochs.completed
    return None


def step_plateau_schedulers(trainer: Trainer, epoch: int) -> None:
    """The ReduceLROnPlateau steps Lightning takes at the end of `epoch`, by its rules (`interval: epoch`, every
    `frequency` epochs, the monitored metric as it is now; `strict`: an error if it is missing)."""
    for config in plateau_schedulers(trainer):
        if config.interval != "epoch" or (epoch + 1) % config.frequency:
            continue
        value = trainer.callback_metrics.get(config.monitor)
        if value is None:
            if config.strict:
                raise ConfigError(
                    f"ReduceLROnPlateau monitors {config.monitor}, which the checkpoint's run had not logged when it"
                    f" was written; the metrics it had: {sorted(trainer.callback_metrics)}."
                )
            continue
        step_plateau_scheduler(trainer, config.scheduler, value)


class MetricsAndPlateauStep:
    """The metrics as the checkpoint's run had them, and the ReduceLROnPlateau step of the epoch it was written in.

    Guarantees: a resumed run starts with the metrics of the run that wrote the checkpoint (what a plateau scheduler,
    a callback's monitor and the run's final summary read, until it logs each again), and takes the plateau step
    Lightning skips in a resumed run (the checkpoint comes before it, at an epoch's end too) as the run never stopped
    did: at once for an epoch counted as finished, at the restarted epoch's end for one continued."""

    def __init__(self) -> None:
        self._at_epoch_end = False  # the restarted epoch's plateau step: Lightning's to take at its end

    @staticmethod
    def state(trainer: Trainer) -> dict[str, Any]:
        state: dict[str, Any] = {
            "metrics": {k: torch.as_tensor(v).detach().cpu() for k, v in trainer.callback_metrics.items()}
        }
        if plateau_schedulers(trainer):  # and whether this epoch's end step is still due
            state["plateau_step_pending"] = pending_plateau_epoch(trainer)
        return state

    @staticmethod
    def restore_metrics(trainer: Trainer, saved: dict[str, Any]) -> None:
        """The metrics as the checkpoint's run had them (one written by an earlier version of this code holds those
        of plateau schedulers alone, as "monitored")."""
        for key, value in saved.get("metrics", saved.get("monitored", {})).items():
            trainer.callback_metrics.setdefault(key, value)

    def restore(self, trainer: Trainer, saved: dict[str, Any]) -> None:
        self.restore_metrics(trainer, saved)
        pending = saved.get("plateau_step_pending")
        if pending is None:
            return
        if trainer.current_epoch > pending:  # the epoch counts as finished: its end is not run again
            step_plateau_schedulers(trainer, pending)
        else:
            self._at_epoch_end = True

    def on_train_epoch_end(self, trainer: Trainer) -> None:
        if self._at_epoch_end:
            self._at_epoch_end = False
            let_lightning_step_plateau_schedulers(trainer)


# -- gradients accumulated by hand (manual optimization) ------------------------------------------
class PendingGradients:
    """In manual optimization, the gradients of backward passes not yet stepped with (accumulated by hand).

    Guarantees: a checkpoint written between them holds them, and the resumed run takes that step with them (those
    that do not fit its parameters, said in one line, without them)."""

    def __init__(self) -> None:
        self.pending = False  # a backward pass since the last optimizer step

    def after_backward(self, module: LightningModule) -> None:
        self.pending = not module.automatic_optimization

    def stepped(self) -> None:
        self.pending = False

    def state(self, module: LightningModule) -> dict[str, Any]:
        if not self.pending:
            return {}
        return {
            "gradients": {name: p.grad.detach().cpu() for name, p in module.named_parameters() if p.grad is not None}
        }

    def restore(self, module: LightningModule, saved: dict[str, Any]) -> None:
        params = dict(module.named_parameters())
        gradients = saved.get("gradients", {})
        fits = {n: g for n, g in gradients.items() if n in params and params[n].shape == g.shape}
        for name, grad in fits.items():
            params[name].grad = grad.to(params[name].device, params[name].dtype)
        self.pending = bool(fits)
        if len(fits) < len(gradients):
            rank_zero_warn(
                f"ExactResume: {few(sorted(gradients.keys() - fits.keys()))}: the checkpoint's gradients not yet"
                " stepped with do not fit these parameters (another model or strategy), so the step they belong to"
                " is taken without them."
            )


# -- what no checkpoint holds, said ----------------------------------------------------------------
def keeps_own_state(owner: Callback | LightningModule) -> bool:
    """Whether a callback or the module puts state of its own in the checkpoint (`state_dict`, `on_save_checkpoint`)."""
    base = LightningModule if isinstance(owner, LightningModule) else Callback
    hooks = ("on_save_checkpoint",) if base is LightningModule else ("state_dict", "on_save_checkpoint")
    return any(is_overridden(hook, owner, base) for hook in hooks)


def warn_of_state_no_checkpoint_holds(trainer: Trainer, module: LightningModule) -> None:
    """At any resume, in one line each: a `torch.Generator` of the module's own (unless the module keeps a state of
    its own in the checkpoint), and Lightning's ModelPruning (whose checkpoint holds the pruned weights without their
    masks), which the resumed run cannot continue."""
    generators = [
        f"{prefix}.{attribute}".lstrip(".")
        for prefix, part in module.named_modules()
        for attribute, value in vars(part).items()
        if isinstance(value, torch.Generator)
    ]
    if generators and not keeps_own_state(module):
        rank_zero_warn(
            f"ExactResume: the module draws from a torch.Generator of its own ({few(generators)}), which no checkpoint"
            " holds: it starts again from its seed, so its draws are not the run never stopped (draw from torch's"
            " global generator, which the engine seeds at every batch, or keep its get_state() in on_save_checkpoint"
            " and give it back with set_state() in on_load_checkpoint)."
        )
    if any(isinstance(callback, ModelPruning) for callback in trainer.callbacks):
        rank_zero_warn(
            "ExactResume: Lightning's ModelPruning saves the pruned weights without their masks, so the resumed run"
            " trains the pruned weights again until its next pruning: it is not the run never stopped."
        )


def own_buffers(module: LightningModule) -> list[str]:
    """The floating-point buffers that can differ between DDP processes: all but a SyncBatchNorm's (whose statistics
    are every process's)."""
    synced = {name for name, layer in module.named_modules() if isinstance(layer, SyncBatchNorm)}
    return [
        name
        for name, buffer in module.named_buffers()
        if buffer.is_floating_point() and name.rpartition(".")[0] not in synced
    ]


def warn_of_own_buffers(trainer: Trainer, module: LightningModule) -> None:
    """Under DDP in manual optimization, at any resume: the buffers each process keeps, of which the checkpoint holds
    rank 0's."""
    if trainer.world_size > 1 and not module.automatic_optimization and (names := own_buffers(module)):
        rank_zero_warn(
            f"ExactResume: under DDP in manual optimization each process keeps its own buffers ({few(names)}:"
            " Lightning has DDP broadcast none), and the checkpoint holds rank 0's: the other processes resume from"
            " rank 0's, so what they compute with them (a BatchNorm's validation) is not the run never stopped."
            " On GPUs --trainer.sync_batchnorm true keeps BatchNorm statistics the same on every process."
        )
