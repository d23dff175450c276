"""The tasks' optimizer and learning-rate schedule: an optimizer given as a config (kept in checkpoints as data, not
code), and a linear warmup, then cosine, step or constant, stepped once per optimizer step."""

from __future__ import annotations

import functools
import importlib
import math
from typing import Any, Literal

from lightning import Trainer
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from lightning_template.engine.errors import ConfigError

ScheduleName = Literal["cosine", "step", "constant"]


def optimizer_spec(optimizer: Any) -> Any:
    """A class or `functools.partial` of one as {"class_path", "init_args"} (how the CLI writes it), so
    checkpoints hold no code and load with `weights_only=True`."""
    cls, init_args = optimizer, {}
    if isinstance(optimizer, functools.partial):
        cls, init_args = optimizer.func, dict(optimizer.keywords)
    if isinstance(cls, type):
        return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": init_args}
    return optimizer


def optimizer_from_spec(spec: Any) -> OptimizerCallable:
    """Inverse of `optimizer_spec` (e.g. for `load_from_checkpoint`); callables pass through."""
    if not isinstance(spec, dict):
        return spec
    module, _, name = spec["class_path"].rpartition(".")
    return functools.partial(getattr(importlib.import_module(module), name), **spec.get("init_args", {}))


def steps_per_epoch(trainer: Trainer) -> int:
    """Optimizer steps in one epoch: Lightning also steps on a last, incomplete accumulation window."""
    return max(math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches), 1)


def check_run_length(schedule: ScheduleName, max_epochs: int | None, max_steps: int) -> None:
    """A cosine schedule decays to the last step, so the run needs one."""
    if schedule == "cosine" and max_steps == -1 and max_epochs == -1:
        raise ConfigError(
            "model.schedule=cosine needs a finite run: set trainer.max_epochs or trainer.max_steps"
            " (or use --model.schedule constant / step)."
        )


def lr_factor(
    step: int,
    total_steps: int,
    warmup_steps: int,
    schedule: ScheduleName,
    min_lr_ratio: float = 0.0,
    step_every: int = 1,
    gamma: float = 0.1,
) -> float:
    """Multiplier on the peak learning rate at optimizer step `step`."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "step":
        return gamma ** ((step - warmup_steps) // max(step_every, 1))
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupSchedule(LRScheduler):
    """Applies `lr_factor` to every param group's peak learning rate (`initial_lr`).

    Unlike `LambdaLR`, which fixes one lambda per group at construction, this reads
    the groups on every step, so a group added mid-run with `add_param_group` (an
    unfrozen backbone) follows the same schedule from its own peak, optionally after
    a warmup of its own.
    """

    def __init__(self, optimizer: Optimizer, **factor_kwargs: Any) -> None:
        self.factor_kwargs = factor_kwargs
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        factor = lr_factor(self.last_epoch, **self.factor_kwargs)
        return [group["initial_lr"] * factor * self._ramp(group) for group in self.optimizer.param_groups]

    def _ramp(self, group: dict[str, Any]) -> float:
        start, steps = group.get("warmup_start", 0), group.get("warmup_steps", 0)
        return 1.0 if steps <= 0 else min(1.0, (self.last_epoch - start + 1) / steps)

    def add_param_group(self, group: dict[str, Any], peak_lr: float, warmup_steps: int = 0) -> None:
        """Add `group` to the optimizer at `peak_lr`, ramped up linearly over `warmup_steps` from now."""
        group.update(lr=peak_lr, initial_lr=peak_lr, warmup_start=self.last_epoch, warmup_steps=warmup_steps)
        self.optimizer.add_param_group(group)
        self.base_lrs.append(peak_lr)
        self.apply()

    def scale_peak_lr(self, factor: float) -> None:
        """Multiply every group's peak learning rate (e.g. by a learning-rate sweep's factor over the configured lr)."""
        for group in self.optimizer.param_groups:
            group["initial_lr"] *= factor
        self.base_lrs = [group["initial_lr"] for group in self.optimizer.param_groups]
        self.apply()

    def apply(self) -> None:
        """Set every group's lr for the current step now."""
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume at the saved step, but with this run's lengths: a run resumed with a larger
        `max_epochs` stretches the schedule to the new end instead of idling at its old minimum."""
        new_lengths, old_lengths = self.factor_kwargs, state_dict.get("factor_kwargs", {})
        super().load_state_dict(state_dict)
        if old_lengths != new_lengths:
            step = self.last_epoch
            old, new = lr_factor(step, **old_lengths), lr_factor(step, **new_lengths)
            rank_zero_warn(
                f"The learning-rate schedule changed since the checkpoint ({old_lengths} -> {new_lengths}); it"
                f" continues at step {step} on the new one (lr factor {old:.4g} -> {new:.4g})."
            )
            self.factor_kwargs = new_lengths
            self.apply()
