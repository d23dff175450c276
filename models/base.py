"""The training logic every classifier shares: loss, metrics, logging, optimizer and schedule.

A model subclasses `ClassificationModule`, builds its network as `self.net` (a plain
`nn.Module` that maps a batch of inputs to logits) and inherits everything else.
Keeping the network a plain module means it can be exported, compiled or reused
without Lightning.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from lightning import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from models.schedule import ScheduleName, WarmupSchedule


class ClassificationModule(LightningModule):
    net: nn.Module

    def __init__(
        self,
        num_classes: int,
        optimizer: Literal["adamw", "sgd"] = "adamw",
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        momentum: float = 0.9,
        schedule: ScheduleName = "cosine",
        warmup_epochs: float = 0.0,
        min_lr_ratio: float = 0.0,
        step_epochs: float = 10.0,
        step_gamma: float = 0.1,
        label_smoothing: float = 0.0,
        compile: bool = False,
        channels_last: bool = False,
    ) -> None:
        """
        Args:
            num_classes: Number of output classes (linked from the datamodule).
            optimizer: `adamw` (decoupled weight decay) or `sgd` (Nesterov momentum).
            lr: Peak learning rate, reached at the end of warmup.
            weight_decay: Weight decay; for AdamW it is decoupled from the gradient.
            momentum: SGD momentum (unused by AdamW).
            schedule: After warmup: `cosine` decay to `min_lr_ratio` x lr at the last step,
                `step` (multiply by `step_gamma` every `step_epochs`), or `constant`.
            warmup_epochs: Linear warmup length in epochs (fractions allowed).
            min_lr_ratio: Final learning rate of the cosine schedule, as a fraction of `lr`.
            step_epochs: Epochs between learning-rate drops of the `step` schedule.
            step_gamma: Factor of each drop of the `step` schedule.
            label_smoothing: Cross-entropy label smoothing.
            compile: Compile the network (`self.net`, not the LightningModule) with torch.compile.
            channels_last: Store conv weights and image batches NHWC (faster convolutions on recent GPUs).
        """
        super().__init__()
        self.save_hyperparameters()
        self.num_classes = num_classes
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        # One metric object per stage: torchmetrics accumulates over the epoch and
        # syncs its state across DDP ranks, so val/test numbers are exact, not a
        # mean of per-rank means. Loss uses a sample-weighted mean for the same reason.
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    def configure_model(self) -> None:
        # Runs once per process before DDP wraps the model, so the wrapper sees the final
        # network. In-place `compile()` keeps state_dict keys, so checkpoints stay loadable
        # into an uncompiled model.
        if self.hparams.channels_last:
            self.net.to(memory_format=torch.channels_last)
        if self.hparams.compile and not getattr(self, "_compiled", False):
            self.net.compile()
            self._compiled = True
            rank_zero_info("torch.compile: model.net compiled once in this process (DDP wraps it afterwards).")

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.hparams.channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return self.net(inputs)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        logits = self(inputs)
        loss = self.loss_fn(logits, targets)
        self.train_acc(logits, targets)
        # Logged tensors stay on the device; Lightning only reads them every
        # `log_every_n_steps`, so there is no host sync per step.
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> dict[str, torch.Tensor]:
        inputs, targets = batch
        logits = self(inputs)
        loss_metric, acc_metric = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_acc")
        loss_metric(self.loss_fn(logits, targets), weight=len(targets))
        acc_metric(logits, targets)
        self.log(f"{stage}_loss", loss_metric, prog_bar=True)
        self.log(f"{stage}_acc", acc_metric, prog_bar=True)
        return {"logits": logits.detach(), "targets": targets}  # for callbacks, e.g. the confusion matrix

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        return self._evaluate(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        return self._evaluate(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(inputs).softmax(dim=-1)

    def parameter_groups(self) -> list[dict[str, Any]]:
        """Param groups for the optimizer; `name` is what the LR monitor shows. Override to split."""
        return [{"params": [p for p in self.parameters() if p.requires_grad], "name": "all"}]

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        groups = self.parameter_groups()
        if hp.optimizer == "adamw":
            optimizer = torch.optim.AdamW(groups, lr=hp.lr, weight_decay=hp.weight_decay)
        else:
            optimizer = torch.optim.SGD(
                groups, lr=hp.lr, momentum=hp.momentum, nesterov=True, weight_decay=hp.weight_decay
            )
        total_steps = self.trainer.estimated_stepping_batches  # also sets up the train loader
        if math.isinf(total_steps) and hp.schedule == "cosine":
            raise ValueError("model.schedule=cosine needs a finite run: set trainer.max_epochs or trainer.max_steps.")
        steps_per_epoch = max(math.ceil(self.trainer.num_training_batches / self.trainer.accumulate_grad_batches), 1)
        scheduler = WarmupSchedule(
            optimizer,
            total_steps=int(min(total_steps, 2**62)),
            warmup_steps=round(hp.warmup_epochs * steps_per_epoch),
            schedule=hp.schedule,
            min_lr_ratio=hp.min_lr_ratio,
            step_every=round(hp.step_epochs * steps_per_epoch),
            gamma=hp.step_gamma,
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
