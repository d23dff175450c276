"""Two-stage fine-tuning: train the classifier on a frozen network, then unfreeze the rest.

Works with any model of this project: it freezes everything but the network's
`get_classifier()` (the seam of `models/seam.py`'s `ClassifierNet`), so a ResNet from ImageNet weights,
 a ViT or a SimpleCNN from an earlier run's checkpoint are fine-tuned the same way.
Stage 1 only makes sense on trained features: a model without `--model.weights` is refused.

Written for the failure modes of Lightning's `BackboneFinetuning`:
- the stage is part of the checkpoint, and resuming in stage 2 restores the same
  trainable set, param groups, learning rates and optimizer state;
- under DDP the backbone was frozen when the model was wrapped, so DDP does not
  all-reduce its gradients: the engine's `ThawedParameterSync`, which train.py installs
  in every run, averages them across ranks (as it does for Lightning's `BackboneFinetuning`);
- the backbone gets its own named param groups (decay / no decay) that the model's
  schedule follows (TensorBoard shows `lr-<Optimizer>/head` and `lr-<Optimizer>/backbone`);
- "frozen" includes BatchNorm: its running statistics stay fixed unless `train_bn`.
"""

from __future__ import annotations

from typing import Any, Literal

from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import BaseFinetuning
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_template.engine.errors import ConfigError, InterfaceError
from lightning_template.engine.process_group import ThawedParameterSync
from lightning_template.tasks.optim import WarmupSchedule, steps_per_epoch


class TwoStageFinetuning(Callback):
    single_per_run = True  # in stacked configs, a later one replaces an earlier one (engine/cli.py)

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
            raise ConfigError("TwoStageFinetuning: set unfreeze_at_epoch, patience, or both.")
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

    def __repr__(self) -> str:
        settings = ("unfreeze_at_epoch", "patience", "backbone_lr_ratio")
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)}' for k in settings)})"

    @property
    def state_key(self) -> str:
        return self._generate_state_key(unfreeze_at_epoch=self.unfreeze_at_epoch, patience=self.patience)

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("unfrozen", "unfrozen_at_epoch", "plateaued", "best", "wait")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key, value in state_dict.items():
            setattr(self, key, value)

    @staticmethod
    def _backbone(pl_module: LightningModule) -> list[nn.Parameter]:
        """What stage 2 trains besides the classifier: the network's `backbone_parameters()`."""
        net = getattr(pl_module, "net", None)
        if not callable(getattr(net, "backbone_parameters", None)) or not callable(
            getattr(pl_module, "parameter_groups", None)
        ):
            raise InterfaceError(
                f"TwoStageFinetuning needs a ClassificationModule whose `net` has the classifier seam"
                " (lightning_template/tasks/classification/models/seam.py: get_classifier, backbone_parameters);"
                f" {type(pl_module).__name__} has none."
            )
        return net.backbone_parameters()

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        unfreezing = [c for c in trainer.callbacks if isinstance(c, (TwoStageFinetuning, BaseFinetuning))]
        if len(unfreezing) > 1:  # each would add the backbone to the optimizer: torch refuses at the second
            raise ConfigError(
                f"{len(unfreezing)} callbacks unfreeze the backbone: {', '.join(map(repr, unfreezing))}. Keep one"
                " (in stacked configs, a later TwoStageFinetuning replaces an earlier one)."
            )
        # Frozen before DDP wraps the model (also on resume, which restores the stage
        # later): DDP then never reduces backbone gradients; the engine's callback does.
        if trainer.world_size > 1 and not any(isinstance(c, ThawedParameterSync) for c in trainer.callbacks):
            raise ConfigError(
                "TwoStageFinetuning under DDP needs the engine's ThawedParameterSync"
                " (lightning_template.engine) among the Trainer's callbacks, listed first (train.py installs it):"
                " without it each process trains its own backbone."
            )
        for parameter in self._backbone(pl_module):
            parameter.requires_grad_(False)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Here, not in `setup`: Lightning knows the checkpoint a run resumes from (trainer.ckpt_path) only once it
        # has restored the callbacks, after `setup`. A resumed run has trained weights whatever --model.weights says.
        if pl_module.hparams.get("weights") is None and trainer.ckpt_path is None:
            raise ConfigError(
                "TwoStageFinetuning: the model starts from random weights (--model.weights is null), so stage 1"
                " would train a classifier on random features. Give --model.weights (a torchvision weights name for"
                " ResNet, or a .pth/.ckpt file), or train from scratch without the callback: drop the preset that"
                " adds it, or replace the job's callbacks with --trainer.callbacks=[]."
            )
        if len(trainer.optimizers) != 1:
            raise ConfigError(f"TwoStageFinetuning supports one optimizer, got {len(trainer.optimizers)}.")
        scheduler = self._scheduler(trainer)
        if scheduler is not None and not isinstance(scheduler, WarmupSchedule):
            raise ConfigError(
                f"TwoStageFinetuning: the scheduler {type(scheduler).__name__} cannot schedule a param group added"
                " mid-run. Use the model's own schedule (--model.schedule/--model.warmup_epochs)."
            )
        if not any(group.get("name") == "head" for group in trainer.optimizers[0].param_groups):
            raise ConfigError(
                "TwoStageFinetuning: the optimizer has no param group named 'head'. Let the model build the optimizer"
                " from `parameter_groups` (ClassificationModule.configure_optimizers)."
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
            for module in pl_module.net.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.patience is None or self.unfrozen or self.plateaued or trainer.sanity_checking:
            return
        current = trainer.callback_metrics.get(self.monitor)
        if current is None:
            logged = sorted(trainer.callback_metrics)
            raise ConfigError(f"TwoStageFinetuning: monitor '{self.monitor}' was not logged; logged: {logged}.")
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
        for parameter in self._backbone(pl_module):
            parameter.requires_grad_(True)
        pl_module.net.train()
        self.unfrozen = True
        optimizer = trainer.optimizers[0]
        head = next(group for group in optimizer.param_groups if group.get("name") == "head")
        peak_lr = head.get("initial_lr", head["lr"]) * self.backbone_lr_ratio
        scheduler = self._scheduler(trainer)
        for group in pl_module.parameter_groups("backbone"):
            if scheduler is None:
                optimizer.add_param_group({**group, "lr": peak_lr})
            else:
                warmup_steps = round(self.backbone_warmup_epochs * steps_per_epoch(trainer))
                scheduler.add_param_group(group, peak_lr, warmup_steps)
