"""Stops training at the first NaN or infinite loss or gradient, before it reaches the weights.

The loss of each micro-batch and the gradients are checked before the optimizer step, with
one host sync per step (per device), so the step that would have written NaN into the weights never happens, and
`ResumeCheckpoint` writes no checkpoint for a run stopped this way: `last.ckpt` stays the
last good one. With fp16 loss scaling an infinite gradient is expected now and then: the
scaler skips that step itself, so only a loss that stays non-finite stops the run (each micro-batch's loss is
read then). Under DDP the ranks agree on the decision in one collective.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer

from lightning_template.engine.errors import ProjectError
from lightning_template.engine.lightning_internals import batch_index, flag_non_finite

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


# torch's fused check of gradients for fp16 loss scaling (GradScaler's), exact for these on every device: on CUDA it
# has no bfloat16 kernel and reads float64 as float32.
FUSED_DTYPES = (torch.float16, torch.float32)


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether no element of `tensors` is NaN or infinite, read once per device. Float16 and float32 tensors go
    through torch's fused check, which with a scale of 1 writes each value back as it was; other dtypes through
    their largest magnitudes. Of a sharded tensor, this rank's part (the caller combines the ranks' verdicts)."""
    fused: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    other: dict[torch.device, list[torch.Tensor]] = {}
    for tensor in tensors:
        if hasattr(tensor, "to_local"):  # a DTensor (FSDP2, tensor parallelism)
            tensor = tensor.to_local()
        if tensor.is_sparse:  # nn.Embedding(sparse=True)
            tensor = tensor.coalesce().values()
        if tensor.dtype in FUSED_DTYPES and type(tensor) is torch.Tensor:
            fused.setdefault((tensor.device, tensor.dtype), []).append(tensor)
        else:
            other.setdefault(tensor.device, []).append(tensor)
    found: dict[torch.device, torch.Tensor] = {}
    for device in {device for device, _ in fused} | set(other):
        found[device] = torch.zeros(1, dtype=torch.float32, device=device)
    for (device, _), group in fused.items():
        flag_non_finite(group, found[device])
    for device, group in other.items():
        # Their largest magnitude (no sum of squares to overflow): fused per dtype where torch can, NaN if any is.
        largest = torch.nn.utils.get_total_norm(group, norm_type=math.inf)
        found[device] += largest.isfinite().logical_not()
    return not any(flag.item() for flag in found.values())


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
            self.losses.append((loss.detach(), batch_index(trainer)))
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
        batch = batch_index(trainer) if batch is None else batch
        raise NonFiniteLossError(
            f"{what} in epoch {trainer.current_epoch}, batch_idx {batch} (optimizer step {trainer.global_step})."
            f" {ADVICE}"
        )
