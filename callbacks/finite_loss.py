"""Stops training at the first NaN or infinite loss, with what usually causes one."""

from __future__ import annotations

from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer


class NonFiniteLossError(FloatingPointError):
    pass


class FiniteLossGuard(Callback):
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        # One host sync per step: cheap next to a training step, and it stops a
        # diverged run before it writes NaN weights into the next checkpoint.
        if isinstance(loss, torch.Tensor) and not torch.isfinite(loss).item():
            raise NonFiniteLossError(
                f"Loss became {loss.item()} in epoch {trainer.current_epoch}, batch {batch_idx}"
                f" (optimizer step {trainer.global_step}). Usual causes:\n"
                "  - learning rate too high: lower --model.lr, add --model.warmup_epochs 1, "
                "clip with --trainer.gradient_clip_val 1.0;\n"
                "  - inputs not normalized or containing NaN/inf: check the datamodule's mean/std and your files;\n"
                "  - labels outside [0, num_classes) or a wrong --model.num_classes;\n"
                "  - fp16 overflow: use --trainer.precision bf16-mixed or 32.\n"
                "Find the operation with --trainer.detect_anomaly true. The checkpoints written so far are intact."
            )
