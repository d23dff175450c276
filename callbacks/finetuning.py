"""Two-stage fine-tuning: train the new head on a frozen backbone, then unfreeze the backbone.

Written for the failure modes of Lightning's `BackboneFinetuning`:
- the stage is part of the checkpoint, and resuming in stage 2 restores the same
  trainable set, param groups, learning rates and optimizer state;
- under DDP the backbone was frozen when the model was wrapped, so DDP does not
  all-reduce its gradients; this callback averages them across ranks itself, so the
  replicas cannot drift apart;
- the backbone gets its own named param group that the model's schedule follows
  (TensorBoard shows `lr-<Optimizer>/head` and `lr-<Optimizer>/backbone`);
- "frozen" includes BatchNorm: its running statistics stay fixed unless `train_bn`.

The model must expose `backbone` and `head` modules (see `models/resnet.py`).
"""

from __future__ import annotations

from typing import Any, Literal

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from models.schedule import WarmupSchedule


class TwoStageFinetuning(Callback):
    def __init__(
        self,
        unfreeze_at_epoch: int | None = 5,
        patience: int | None = None,
        monitor: str = "val_loss",
        mode: Literal["min", "max"] = "min",
        min_delta: float = 0.0,
        backbone_lr_ratio: float = 0.1,
        backbone_warmup_epochs: float = 0.0,
        train_bn: bool = False,
    ) -> None:
        """
        Args:
            unfreeze_at_epoch: Unfreeze the backbone at the start of this epoch (0-based); None to rely on `patience`.
            patience: Also unfreeze once `monitor` has not improved for this many validations (the head has
                levelled off); None to rely on `unfreeze_at_epoch`.
            monitor: Metric watched by `patience`.
            mode: `min` if lower `monitor` is better, `max` otherwise.
            min_delta: Smallest change of `monitor` that counts as an improvement.
            backbone_lr_ratio: Backbone learning rate as a fraction of the head's.
            backbone_warmup_epochs: Ramp the backbone learning rate up linearly over this many epochs.
            train_bn: Let BatchNorm layers of the frozen backbone keep updating their running statistics
                (their affine weights stay frozen).
        """
        if unfreeze_at_epoch is None and patience is None:
            raise ValueError("TwoStageFinetuning: set unfreeze_at_epoch, patience, or both.")
        self.unfreeze_at_epoch = unfreeze_at_epoch
        self.patience = patience
        self.monitor = monitor
        self.mode = mode
        self.min_delta = min_delta
        self.backbone_lr_ratio = backbone_lr_ratio
        self.backbone_warmup_epochs = backbone_warmup_epochs
        self.train_bn = train_bn
        # State saved in checkpoints.
        self.unfrozen = False
        self.unfrozen_at_epoch: int | None = None
        self.plateaued = False
        self.best: float | None = None
        self.wait = 0

    @property
    def state_key(self) -> str:
        return self._generate_state_key(unfreeze_at_epoch=self.unfreeze_at_epoch, patience=self.patience)

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("unfrozen", "unfrozen_at_epoch", "plateaued", "best", "wait")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key, value in state_dict.items():
            setattr(self, key, value)

    @staticmethod
    def _seam(pl_module: LightningModule) -> tuple[nn.Module, nn.Module]:
        backbone, head = getattr(pl_module, "backbone", None), getattr(pl_module, "head", None)
        if not isinstance(backbone, nn.Module) or not isinstance(head, nn.Module):
            raise TypeError(
                f"TwoStageFinetuning needs a model with `backbone` and `head` modules (see models/resnet.py);"
                f" {type(pl_module).__name__} has none."
            )
        return backbone, head

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        backbone, _ = self._seam(pl_module)
        # Frozen before DDP wraps the model (also on resume, which restores the stage
        # later): DDP then never reduces backbone gradients, and we do it ourselves.
        backbone.requires_grad_(False)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if len(trainer.optimizers) != 1:
            raise ValueError(f"TwoStageFinetuning supports one optimizer, got {len(trainer.optimizers)}.")
        scheduler = self._scheduler(trainer)
        if scheduler is not None and not isinstance(scheduler, WarmupSchedule):
            raise ValueError(
                f"TwoStageFinetuning: the scheduler {type(scheduler).__name__} cannot schedule a param group added"
                " mid-run. Use the model's own schedule (--model.schedule/--model.warmup_epochs)."
            )
        if not any(group.get("name") == "head" for group in trainer.optimizers[0].param_groups):
            raise ValueError(
                "TwoStageFinetuning: the optimizer has no param group named 'head'. Let the model build the optimizer"
                " (`ClassificationModule.configure_optimizers`) rather than an optimizer given on the command line."
            )
        if self.unfrozen:  # resumed in stage 2: same trainable set and groups, before the optimizer state loads
            self._unfreeze(trainer, pl_module)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.unfrozen:
            return
        reached_epoch = self.unfreeze_at_epoch is not None and trainer.current_epoch >= self.unfreeze_at_epoch
        if reached_epoch or self.plateaued:
            self._unfreeze(trainer, pl_module)
            self.unfrozen_at_epoch = trainer.current_epoch
            rank_zero_info(
                f"TwoStageFinetuning: backbone unfrozen at epoch {trainer.current_epoch}"
                f" ({'plateau of ' + self.monitor if self.plateaued else 'scheduled'}),"
                f" backbone lr = {self.backbone_lr_ratio} x head lr."
            )

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        # Lightning switches the whole model to train mode every epoch; frozen BatchNorm stays in eval.
        if not self.unfrozen and not self.train_bn:
            backbone, _ = self._seam(pl_module)
            for module in backbone.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if not self.unfrozen or trainer.world_size == 1:
            return
        backbone, _ = self._seam(pl_module)
        grads = [p.grad for p in backbone.parameters() if p.grad is not None]
        if grads:  # one all-reduce for the whole backbone
            averaged = trainer.strategy.reduce(_flatten_dense_tensors(grads), reduce_op="mean")
            for grad, synced in zip(grads, _unflatten_dense_tensors(averaged, grads), strict=True):
                grad.copy_(synced)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.patience is None or self.unfrozen or self.plateaued or trainer.sanity_checking:
            return
        current = trainer.callback_metrics.get(self.monitor)
        if current is None:
            logged = sorted(trainer.callback_metrics)
            raise KeyError(f"TwoStageFinetuning: monitor '{self.monitor}' was not logged; logged: {logged}.")
        value = float(current)
        improved = self.best is None or (
            value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta
        )
        self.best, self.wait = (value, 0) if improved else (self.best, self.wait + 1)
        self.plateaued = self.wait >= self.patience

    @staticmethod
    def _scheduler(trainer: Trainer) -> Any:
        configs = trainer.lr_scheduler_configs
        return configs[0].scheduler if configs else None

    def _unfreeze(self, trainer: Trainer, pl_module: LightningModule) -> None:
        backbone, _ = self._seam(pl_module)
        backbone.requires_grad_(True)
        backbone.train()
        self.unfrozen = True
        optimizer = trainer.optimizers[0]
        head_group = next(group for group in optimizer.param_groups if group.get("name") == "head")
        lr = head_group.get("initial_lr", head_group["lr"]) * self.backbone_lr_ratio
        group: dict[str, Any] = {"params": list(backbone.parameters()), "name": "backbone", "lr": lr, "initial_lr": lr}
        scheduler = self._scheduler(trainer)
        if scheduler is not None and self.backbone_warmup_epochs > 0:
            steps_per_epoch = max(trainer.num_training_batches // trainer.accumulate_grad_batches, 1)
            group["ramp_start"] = scheduler.last_epoch
            group["ramp_steps"] = round(self.backbone_warmup_epochs * steps_per_epoch)
        optimizer.add_param_group(group)
        if scheduler is not None:
            scheduler.apply()
