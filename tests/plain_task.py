"""A user's own task, written as plain Lightning: nothing of the project is imported or subclassed.

Regression on real images: from a Fashion-MNIST image pooled to 7x7, an MLP predicts how much of the image is ink
(the share of pixels above half intensity). The dataset flips half of the images at random in `__getitem__` (as
torchvision transforms do, in loader workers or not); the model logs `train_loss` and `val_loss` only.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch
from lightning import LightningDataModule, LightningModule
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torchmetrics import MeanSquaredError


def read_images(split: str, count: int) -> torch.Tensor:
    """The first `count` images of a split: only they are decompressed, not the whole file. From Debian's copy or
    the folder FASHION_MNIST_DIR names (as the tests set it)."""
    folder = Path(os.environ.get("FASHION_MNIST_DIR") or "/usr/share/datasets/fashion-mnist")
    with gzip.open(folder / f"{split}-images-idx3-ubyte.gz") as f:
        f.read(16)  # the IDX header: magic number and three sizes
        data = np.frombuffer(f.read(count * 28 * 28), dtype=np.uint8)
    return torch.from_numpy(data.reshape(-1, 28, 28).copy())


class InkDataset(Dataset):
    def __init__(self, images: torch.Tensor, flip: bool, pool: int = 4) -> None:
        self.images, self.flip, self.pool = images.float() / 255, flip, pool

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        if self.flip and torch.rand(()) < 0.5:
            image = image.flip(-1)
        features = nn.functional.avg_pool2d(image[None], self.pool).flatten()
        return features, (image > 0.5).float().mean()[None]


class InkStream(IterableDataset):
    """The same samples as a stream: a loader that cannot be skipped into."""

    def __init__(self, dataset: InkDataset) -> None:
        self.dataset = dataset

    def __iter__(self):
        return (self.dataset[i] for i in range(len(self.dataset)))


class RegressionData(LightningDataModule):
    # What the model is told about the data, by the data: train.py passes it to Regressor's `num_features`.
    model_facts = ("num_features",)

    def __init__(
        self, batch_size: int = 32, num_workers: int = 0, drop_last: bool = False, shuffle: bool = True,
        stream: bool = False, train_size: int = 1000, pool: int = 4,
    ) -> None:  # fmt: skip
        super().__init__()
        self.batch_size, self.num_workers, self.drop_last, self.shuffle = batch_size, num_workers, drop_last, shuffle
        self.stream, self.train_size, self.pool = stream, train_size, pool

    @property
    def num_features(self) -> int:
        return (28 // self.pool) ** 2  # the image pooled in squares of `pool` pixels

    def setup(self, stage: str) -> None:
        self.train = InkDataset(read_images("train", self.train_size), flip=True, pool=self.pool)
        self.val = InkDataset(read_images("t10k", 256), flip=False, pool=self.pool)

    def train_dataloader(self) -> DataLoader:
        if self.stream:
            return DataLoader(InkStream(self.train), batch_size=self.batch_size)
        return DataLoader(
            self.train, batch_size=self.batch_size, shuffle=self.shuffle, drop_last=self.drop_last,
            num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
        )  # fmt: skip

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=64)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=64)


class Regressor(LightningModule):
    def __init__(
        self,
        num_features: int = 49,
        hidden: int = 32,
        lr: float = 0.01,
        dropout: float = 0.1,
        nan_at_step: int = -1,
        sync_val_loss: bool = True,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(num_features, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        features, target = batch
        loss = nn.functional.mse_loss(self(features), target)
        if self.global_step == self.hparams.nan_at_step:
            loss = loss * float("nan")
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        features, target = batch
        # sync_dist: under DDP, the mean over every process's batches (else each process logs its own shard's)
        self.log("val_loss", nn.functional.mse_loss(self(features), target), sync_dist=self.hparams.sync_val_loss)

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class MetricRegressor(Regressor):
    """Gathers its validation loss in a torchmetrics metric and logs what `compute()` gives, the same in every DDP
    process, as a plain tensor without sync_dist (as torchmetrics' docs do); its cosine schedule's config names a
    monitor, which Lightning reads for plateau schedulers alone."""

    def __init__(
        self, num_features: int = 49, hidden: int = 32, lr: float = 0.01, dropout: float = 0.1, nan_at_step: int = -1
    ) -> None:
        super().__init__(num_features, hidden, lr, dropout, nan_at_step)
        self.val_mse = MeanSquaredError()

    def validation_step(self, batch, batch_idx: int) -> None:
        features, target = batch
        self.val_mse.update(self(features), target)

    def on_validation_epoch_end(self) -> None:
        self.log("val_loss", self.val_mse.compute())
        self.val_mse.reset()

    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "monitor": "val_loss"}}


class EpochLoggedRegressor(Regressor):
    """Logs its training loss once an epoch (`train_mse`, known only when the epoch ends)."""

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_mse", loss, on_step=False, on_epoch=True)
        return loss


class DataLoaderIterRegressor(Regressor):
    """Takes its batches from Lightning's `dataloader_iter` itself: they skip the module's batch hooks."""

    def training_step(self, dataloader_iter) -> torch.Tensor:
        (features, target), _, _ = next(dataloader_iter)
        loss = nn.functional.mse_loss(self(features), target)
        self.log("train_loss", loss, batch_size=len(target))
        return loss
