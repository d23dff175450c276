"""Stops training at the first NaN or infinite loss or gradient, before it reaches the weights.

The loss of each micro-batch and the gradients are checked before the optimizer step, with
one host sync per step, so the step that would have written NaN into the weights never happens, and
`ResumeCheckpoint` writes no checkpoint for a run stopped this way: `last.ckpt` stays the
last good one. With fp16 loss scaling an infinite gradient is expected now and then: the
scaler skips that step itself, so only a loss that stays non-finite stops the run.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer

from lightning_template.engine.errors import ProjectError

ADVICE = (
    "Usual causes:\n"
    "  - learning rate too high: lower --model.optimizer.lr, add --model.warmup_epochs 1, "
    "clip with --trainer.gradient_clip_val 1.0;\n"
    "  - inputs not normalized or containing NaN/inf: check the datamodule's mean/std and your files;\n"
    "  - labels outside [0, num_classes) or a wrong --model.num_classes;\n"
    "  - fp16 overflow: use --trainer.precision bf16-mixed or 32.\n"
    "Find the operation with --config configs/presets/anomaly.yaml. The weights were not updated by this step and"
    " the checkpoints written so far are intact: resume with --ckpt_path last after the fix."
)


class NonFiniteLossError(ProjectError, FloatingPointError):
    pass


def _grad_scaler(trainer: Trainer) -> Any:
    return getattr(trainer.precision_plugin, "scaler", None)


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether no element of `tensors` is NaN or infinite, read once per device: torch's own check of gradients for
    fp16 loss scaling (GradScaler's), one pass over the tensors, which a scale of 1 leaves as they are."""
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        by_kind.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    found: dict[torch.device, torch.Tensor] = {}
    for (device, _), group in by_kind.items():
        if device not in found:
            found[device] = torch.zeros(1, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(group, found[device], _unit_scale(device))
    return not any(flag.item() for flag in found.values())


@functools.cache
def _unit_scale(device: torch.device) -> torch.Tensor:
    return torch.ones(1, device=device)


class FiniteLossGuard(Callback):
    def __init__(self, scaled_patience: int = 20) -> None:
        """
        Args:
            scaled_patience: With fp16 loss scaling, stop only after this many non-finite losses in a row
                (each one is a step the scaler skips).
        """
        self.scaled_patience = scaled_patience
        self.non_finite_in_a_row = 0
        self.losses: list[tuple[torch.Tensor, int]] = []  # (loss, batch_idx) of the micro-batches since the last step

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        if _grad_scaler(trainer) is None:
            # Read with the gradients: one host sync per optimizer step.
            self.losses.append((loss.detach(), trainer.fit_loop.epoch_loop.batch_idx))
            return
        # Under fp16 loss scaling a non-finite loss is a step the scaler skips: counted per micro-batch. Under DDP
        # every rank stops together (a rank that stopped alone would leave the others waiting in the all-reduce).
        finite = bool(torch.isfinite(loss).item())
        if trainer.world_size > 1:
            finite = trainer.strategy.reduce_boolean_decision(finite, all=True)
        if finite:
            self.non_finite_in_a_row = 0
            return
        self.non_finite_in_a_row += 1
        if self.non_finite_in_a_row >= self.scaled_patience:
            self._stop(trainer, f"Loss became {loss.item()}")

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if _grad_scaler(trainer) is not None:
            return  # the scaler has checked the gradients and skips the step itself
        losses, self.losses = self.losses, []
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        # Copies of the losses: the check writes back what it reads, and a loss may be saved in a retained graph.
        finite = all_finite([loss.clone() for loss, _ in losses] + grads)
        if trainer.world_size > 1:  # every rank stops together, also when only one rank's loss is non-finite
            finite = trainer.strategy.reduce_boolean_decision(finite, all=True)
        if finite:
            return
        for loss, batch in losses:  # the micro-batch of the accumulated step
            if not loss.isfinite():
                self._stop(trainer, f"Loss became {loss.item()}", batch)
        self._stop(trainer, "A gradient became non-finite (the loss was finite)")

    @staticmethod
    def _stop(trainer: Trainer, what: str, batch: int | None = None) -> None:
        batch = trainer.fit_loop.epoch_loop.batch_idx if batch is None else batch
        raise NonFiniteLossError(
            f"{what} in epoch {trainer.current_epoch}, batch_idx {batch} (optimizer step {trainer.global_step})."
            f" {ADVICE}"
        )
