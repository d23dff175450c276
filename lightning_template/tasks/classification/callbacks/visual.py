"""Logs beyond scalars: what the network is fed, where it errs, and how its weights move.

- `AugmentedBatchImages`: one grid of training images exactly as the network sees them
  (after augmentation), once per run: "look at your data after augmentation".
- `ConfusionMatrixImage`: the validation confusion matrix after every validation, as a
  heat-map image and as a table with class names.
- `WeightHistograms` (optional, costs time): weight histograms per epoch and gradient
  histograms every n steps, to find the layer that explodes or dies.

Images and tables go to every configured logger, each in its own way (`log_image`, `log_table`: TensorBoard images
and text, MLflow artifacts, W&B media and tables, PNG/CSV files next to a CSVLogger's metrics.csv); the histograms
are TensorBoard's own. Nothing is logged without a logger (e.g. under fast_dev_run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_warn
from torchmetrics.classification import MulticlassConfusionMatrix
from torchvision.utils import make_grid, save_image


def _hwc_uint8(image: torch.Tensor) -> Any:
    return (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()


def log_image(trainer: Trainer, key: str, image: torch.Tensor, step: int) -> None:
    """A [C, H, W] image in 0..1 to every logger of the run (rank 0 only)."""
    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(key, image, step)
        elif isinstance(logger, MLFlowLogger):
            logger.experiment.log_image(logger.run_id, _hwc_uint8(image), artifact_file=f"{key}/step_{step:07d}.png")
        elif isinstance(logger, WandbLogger):
            logger.log_image(key=key, images=[_hwc_uint8(image)], step=step)
        elif logger.log_dir:
            path = Path(logger.log_dir) / "images" / key / f"step_{step:07d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            save_image(image, path)


def log_table(trainer: Trainer, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
    """A table to every logger of the run (rank 0 only)."""
    if not trainer.is_global_zero:
        return
    markdown = "\n".join(
        ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        + ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    )
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_text(key, markdown, step)
        elif isinstance(logger, MLFlowLogger):
            logger.experiment.log_text(logger.run_id, markdown, f"{key}/step_{step:07d}.md")
        elif isinstance(logger, WandbLogger):
            logger.log_text(key=key, columns=columns, data=[list(map(str, row)) for row in rows], step=step)
        elif logger.log_dir:
            path = Path(logger.log_dir) / "tables" / key / f"step_{step:07d}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(",".join(map(str, line)) for line in [columns, *rows]) + "\n")


def tensorboard(trainer: Trainer) -> Any | None:
    """The SummaryWriter of the run's TensorBoard logger, on rank 0 only."""
    if not trainer.is_global_zero:
        return None
    return next((lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)


class AugmentedBatchImages(Callback):
    def __init__(self, max_images: int = 64) -> None:
        """
        Args:
            max_images: How many images of the first training batch go into the grid.
        """
        self.max_images = max_images
        self.logged = False

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.logged:
            return
        self.logged = True
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        if not (trainer.loggers and trainer.is_global_zero) or not (
            isinstance(images, torch.Tensor) and images.dim() == 4 and images.is_floating_point()
        ):
            return  # no logger, or not an image batch (e.g. token ids)
        grid = make_grid(images[: self.max_images].detach().float().cpu(), nrow=8, normalize=True, scale_each=True)
        log_image(trainer, "train/augmented_batch", grid, trainer.global_step)


class ConfusionMatrixImage(Callback):
    def __init__(self, cell_pixels: int = 24) -> None:
        """
        Args:
            cell_pixels: Side of one matrix cell in the image.
        """
        self.cell_pixels = cell_pixels
        self.matrix: MulticlassConfusionMatrix | None = None
        self.supported = True  # False once validation_step turned out not to return EvalOutput

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.supported:
            self.matrix = MulticlassConfusionMatrix(pl_module.num_classes).to(pl_module.device)

    def on_validation_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx=0
    ) -> None:
        if self.matrix is None:
            return
        if not (isinstance(outputs, dict) and {"logits", "targets"} <= outputs.keys()):
            rank_zero_warn(
                "ConfusionMatrixImage: no confusion matrix for this run, because validation_step does not return"
                " lightning_template.tasks.classification.models.base.EvalOutput ({'logits', 'targets'});"
                f" {type(pl_module).__name__} returned"
                f" {type(outputs).__name__}."
            )
            self.matrix, self.supported = None, False
            return
        self.matrix.update(outputs["logits"], outputs["targets"])

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.matrix is None or trainer.sanity_checking:
            return
        counts = self.matrix.compute().cpu()  # synced across DDP ranks
        if not (trainer.loggers and trainer.is_global_zero):
            return
        rates = counts.float() / counts.sum(dim=1, keepdim=True).clamp_min(1)  # row-normalized: recall per class
        heat = rates.repeat_interleave(self.cell_pixels, 0).repeat_interleave(self.cell_pixels, 1)
        # Blue-to-red heat map: a bright diagonal is a good classifier.
        image = torch.stack([heat, 0.2 * torch.ones_like(heat), 1 - heat])
        log_image(trainer, "val/confusion_matrix", image, trainer.global_step)
        names = list(getattr(trainer.datamodule, "class_names", range(len(counts))))
        rows = [[name, *(int(c) for c in row)] for name, row in zip(names, counts, strict=True)]
        log_table(trainer, "val/confusion_matrix", ["true \\ predicted", *map(str, names)], rows, trainer.global_step)


class WeightHistograms(Callback):
    def __init__(self, gradient_every_n_steps: int = 100) -> None:
        """
        Args:
            gradient_every_n_steps: Log gradient histograms every this many optimizer steps.
        """
        self.gradient_every_n_steps = gradient_every_n_steps

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        writer = tensorboard(trainer)
        if writer is None or trainer.global_step % self.gradient_every_n_steps:
            return
        for name, parameter in pl_module.named_parameters():
            if parameter.grad is not None:
                writer.add_histogram(f"gradients/{name}", parameter.grad.detach().cpu(), trainer.global_step)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        writer = tensorboard(trainer)
        if writer is None:
            return
        for name, parameter in pl_module.named_parameters():
            writer.add_histogram(f"weights/{name}", parameter.detach().cpu(), trainer.global_step)
