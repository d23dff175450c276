"""Learning-rate schedule: linear warmup, then cosine, step or constant, stepped once per optimizer step."""

from __future__ import annotations

import math
from typing import Literal

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

ScheduleName = Literal["cosine", "step", "constant"]


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
    """Applies `lr_factor` to every param group's `initial_lr`.

    Unlike `LambdaLR`, which fixes one lambda per group at construction, this reads
    the groups on every step, so a group added later (e.g. an unfrozen backbone)
    follows the same schedule from its own base learning rate.
    """

    def __init__(self, optimizer: Optimizer, **factor_kwargs) -> None:
        self.factor_kwargs = factor_kwargs
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        factor = lr_factor(self.last_epoch, **self.factor_kwargs)
        return [
            group.setdefault("initial_lr", group["lr"]) * factor * self._ramp(group)
            for group in self.optimizer.param_groups
        ]

    def _ramp(self, group: dict) -> float:
        """Extra linear warmup of a group added mid-run (keys `ramp_start`, `ramp_steps`)."""
        if group.get("ramp_steps", 0) <= 0:
            return 1.0
        return min(1.0, (self.last_epoch - group["ramp_start"] + 1) / group["ramp_steps"])

    def apply(self) -> None:
        """Set every group's lr for the current step now, e.g. right after adding a group."""
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
