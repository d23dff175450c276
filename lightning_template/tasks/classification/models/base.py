"""The training logic every classifier shares: loss, metrics, logging, optimizer, schedule, weights.

A model is a `ClassificationModule` given a network with the seam of
`models/seam.py`'s `ClassifierNet` (a plain `nn.Module`, so it can be exported, compiled or reused without
Lightning):

    class SimpleCNN(ClassificationModule):
        def __init__(self, num_classes: int = 10, ..., **kwargs):
            super().__init__(SimpleCNNNet(num_classes, ...), **kwargs)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypedDict

import torch
from lightning import Callback, LightningModule
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from lightning_template.engine.errors import InterfaceError
from lightning_template.tasks.classification.callbacks.visual import AugmentedBatchImages, ConfusionMatrixImage
from lightning_template.tasks.classification.data.contract import ClassificationData, ServableData
from lightning_template.tasks.classification.input_spec import SPEC_KEY
from lightning_template.tasks.classification.models.pretrained import load_pretrained, read_state_dict
from lightning_template.tasks.classification.models.seam import ClassifierNet
from lightning_template.tasks.optim import (
    ScheduleName,
    WarmupSchedule,
    check_run_length,
    optimizer_from_spec,
    optimizer_spec,
    steps_per_epoch,
)

Part = Literal["head", "backbone"]
PREDICTIONS_KEY = "train_predictions"  # the checkpoint's entry of the epoch's predictions so far


def one_sequence(max_length: int, pad_id: int | None) -> torch.Tensor:
    """A text model's example_input_array: one sequence of `max_length` tokens, none of them padding (the model
    summary counts the FLOPs of its forward)."""
    return torch.full((1, max_length), 1 if pad_id == 0 else 0)


class EvalOutput(TypedDict):
    """What `validation_step` and `test_step` return, for callbacks such as `ConfusionMatrixImage`."""

    logits: torch.Tensor
    targets: torch.Tensor


class ClassificationModule(LightningModule):
    def __init__(
        self,
        net: ClassifierNet,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        schedule: ScheduleName = "cosine",
        warmup_epochs: float = 0.0,
        min_lr_ratio: float = 0.0,
        step_epochs: float = 10.0,
        step_gamma: float = 0.1,
        label_smoothing: float = 0.0,
        weights: str | None = None,
        compile: bool = False,
        channels_last: bool = False,
    ) -> None:
        """
        Args:
            net: The network (built by the subclass from its own arguments).
            optimizer: Any `torch.optim` optimizer with its arguments, e.g. `--model.optimizer torch.optim.SGD
                --model.optimizer.lr 0.05 --model.optimizer.momentum 0.9`. Its `lr` is the peak learning rate;
                its `weight_decay` applies to weight matrices and conv kernels only (not to biases, norms,
                embeddings or positions).
            schedule: After warmup: `cosine` decay to `min_lr_ratio` x lr at the last step,
                `step` (multiply by `step_gamma` every `step_epochs`), or `constant`.
            warmup_epochs: Linear warmup length in epochs (fractions allowed).
            min_lr_ratio: Final learning rate of the cosine schedule, as a fraction of `lr`.
            step_epochs: Epochs between learning-rate drops of the `step` schedule.
            step_gamma: Factor of each drop of the `step` schedule.
            label_smoothing: Cross-entropy label smoothing.
            weights: Start from trained weights: a state dict or a checkpoint of any run of this project
                (everything but the classifier is loaded; the input conv is adapted to the channel count).
            compile: Compile the network (`self.net`, not the LightningModule) with torch.compile.
            channels_last: Store conv weights and image batches NHWC (faster convolutions on recent GPUs).
        """
        super().__init__()
        # How the network runs (compiled, NHWC) is not what it is: a checkpoint does not fix it, and one trained
        # either way is evaluated either way.
        self.save_hyperparameters(ignore=["net", "compile", "channels_last"])
        self.compile_net, self.channels_last = compile, channels_last
        self.hparams["optimizer"] = optimizer_spec(self.hparams["optimizer"])  # the CLI gives its config already
        self.net = net
        self.make_optimizer = optimizer_from_spec(optimizer)
        self.num_classes = net.get_classifier().out_features
        if weights is not None:
            self.load_weights(weights)
        self.loss_fn = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        # One metric object per stage: torchmetrics accumulates over the epoch and
        # syncs its state across DDP ranks, so val/test numbers are exact, not a
        # mean of per-rank means. Loss uses a sample-weighted mean for the same reason.
        self.train_acc = MulticlassAccuracy(self.num_classes, average="micro")
        self.train_predictions: list[
            tuple[torch.Tensor, torch.Tensor]
        ] = []  # (predicted, true) of this epoch's batches
        self.val_acc = MulticlassAccuracy(self.num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(self.num_classes, average="micro")
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    def load_weights(self, weights: str) -> None:
        """Load `weights` into the network, all but the classifier. Override to accept other sources."""
        load_pretrained(self.net, read_state_dict(Path(weights)), weights)

    def configure_model(self) -> None:
        # Runs once per process before DDP wraps the model, so the wrapper sees the final
        # network. In-place `compile()` keeps state_dict keys, so checkpoints stay loadable
        # into an uncompiled model.
        if self.channels_last:
            self.net.to(memory_format=torch.channels_last)
        if self.compile_net and not getattr(self, "_compiled", False):
            self.net.compile()
            self._compiled = True
            rank_zero_info("torch.compile: model.net compiled once in this process (DDP wraps it afterwards).")
        if self.compile_net:  # the summary's forward of one sample would compile the network once more
            self.example_input_array = None

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return self.net(inputs)

    def logged_by_lightning(self) -> bool:
        """Whether Lightning writes this training step's logged values to the loggers: every `log_every_n_steps`
        optimizer steps, and where the run stops. Lightning counts the batches that stepped; with one optimizer and
        automatic optimization, that is `global_step`."""
        every, trainer = self.trainer.log_every_n_steps, self.trainer
        return every > 0 and ((trainer.global_step + 1) % every == 0 or trainer.should_stop)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        logits = self(inputs)
        loss = self.loss_fn(logits, targets)
        # Counted into train_acc at the epoch's end, all at once: a metric's update costs as much as a small step.
        self.train_predictions.append((logits.detach().argmax(dim=-1), targets))
        # Only in the steps whose values Lightning writes (every `log_every_n_steps`) and the epoch's last (the
        # console's epoch line): each `self.log` call costs as much as a small step.
        if self.trainer.is_last_batch or self.logged_by_lightning():
            # sync_dist: under DDP the mean over the processes, which a callback may monitor (the overfit preset)
            self.log("train_loss", loss, prog_bar=True, sync_dist=True)
        if self.trainer.is_last_batch:
            predicted, labels = zip(*self.train_predictions, strict=True)
            self.train_predictions.clear()
            self.train_acc.update(*(torch.cat([t.to(logits.device) for t in part]) for part in (predicted, labels)))
            # Logged once per epoch (Lightning computes, syncs across ranks and resets the metric at the epoch's
            # end): handing the metric to `self.log` in every step costs more than a small step. Logged in
            # the last step, not in on_train_epoch_end, which runs after the callbacks' (the console's epoch line).
            self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def on_train_epoch_start(self) -> None:
        self.train_predictions.clear()  # an epoch cut short (max_steps, an error) never reached its end

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> EvalOutput:
        inputs, targets = batch
        logits = self(inputs)
        loss_metric, acc_metric = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_acc")
        loss_metric(self.loss_fn(logits, targets), weight=len(targets))
        acc_metric(logits, targets)
        self.log(f"{stage}_loss", loss_metric, prog_bar=True)
        self.log(f"{stage}_acc", acc_metric, prog_bar=True)
        return EvalOutput(logits=logits.detach(), targets=targets)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> EvalOutput:
        return self._evaluate(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> EvalOutput:
        return self._evaluate(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(inputs).softmax(dim=-1)

    def prediction_rows(self, probabilities: torch.Tensor, indices: list[int]) -> list[dict[str, Any]]:
        """A row of the predictions CSV per sample (engine/predictions.py): the input (a file path, the text itself),
        the predicted class name, its probability and every class's."""
        datamodule = self.trainer.datamodule
        if not isinstance(datamodule, ClassificationData):
            raise InterfaceError(
                "Predictions of a classifier need a datamodule with the ClassificationData interface"
                " (tasks/classification/data/contract.py: class_names, predict_inputs());"
                f" got {type(datamodule).__name__}."
            )
        names = datamodule.class_names
        probabilities = probabilities.float().cpu()
        confidence, predicted = probabilities.max(dim=-1)
        return [
            {"input": text, "prediction": names[label], "probability": f"{p:.6f}",
             **{f"p_{name}": f"{v:.6f}" for name, v in zip(names, row, strict=True)}}
            for text, label, p, row in zip(
                datamodule.predict_inputs(indices), predicted.tolist(), confidence.tolist(), probabilities.tolist(),
                strict=True,
            )
        ]  # fmt: skip

    def configure_callbacks(self) -> list[Callback]:
        """What a classifier's runs show beyond scalars: the augmented training batch and the confusion matrix
        (once per Trainer: `test` after `fit` keeps fit's)."""
        if any(isinstance(callback, ConfusionMatrixImage) for callback in self.trainer.callbacks):
            return []
        return [AugmentedBatchImages(), ConfusionMatrixImage()]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # How raw inputs become this model's inputs (image size and normalization, or the tokenizer), so that
        # a deployed model reads them as evaluation did, without the training data.
        if isinstance(self.trainer.datamodule, ServableData):
            checkpoint[SPEC_KEY] = self.trainer.datamodule.serving_spec()
        # The epoch's predictions so far, which train_acc counts at its end: a run resumed in the middle of the epoch
        # counts the whole epoch's.
        checkpoint[PREDICTIONS_KEY] = [(predicted.cpu(), true.cpu()) for predicted, true in self.train_predictions]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Under DDP each process has its own, and the checkpoint holds rank 0's: each counts from the resume.
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            self.train_predictions = list(checkpoint.get(PREDICTIONS_KEY, []))

    def parameter_groups(self, part: Part) -> list[dict[str, Any]]:
        """The trainable parameters of the classifier (`head`) or of the rest (`backbone`), as a group
        that decays (matrices, conv kernels) and one that does not (`<part>_no_decay`: biases, norms,
        embeddings, positions). `name` is what the LR monitor shows."""
        in_classifier = {id(p) for p in self.net.get_classifier().parameters()}
        exempt = self.net.no_weight_decay()
        decay, no_decay = [], []
        for name, parameter in self.net.named_parameters():
            if parameter.requires_grad and (id(parameter) in in_classifier) == (part == "head"):
                (no_decay if parameter.ndim < 2 or name in exempt else decay).append(parameter)
        groups = [
            {"params": decay, "name": part},
            {"params": no_decay, "name": f"{part}_no_decay", "weight_decay": 0.0},
        ]
        return [group for group in groups if group["params"]]

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        optimizer = self.make_optimizer(self.parameter_groups("head") + self.parameter_groups("backbone"))
        check_run_length(hp.schedule, self.trainer.max_epochs, self.trainer.max_steps)
        total_steps = self.trainer.estimated_stepping_batches  # also sets up the train loader
        per_epoch = steps_per_epoch(self.trainer)
        scheduler = WarmupSchedule(
            optimizer,
            total_steps=int(min(total_steps, 2**62)),
            warmup_steps=round(hp.warmup_epochs * per_epoch),
            schedule=hp.schedule,
            min_lr_ratio=hp.min_lr_ratio,
            step_every=round(hp.step_epochs * per_epoch),
            gamma=hp.step_gamma,
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
