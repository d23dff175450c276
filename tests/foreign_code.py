"""Lightning code written the way Lightning's docs write it, which the engine must take as it is: an autoencoder with
a learning rate reduced on a plateau of `val_loss`, its manual-optimization twin, and a datamodule whose training
loader is built in each of the ways the docs show (shuffled, weighted, a batch sampler, fewer samples an epoch, a
dict of loaders) with one or two validation loaders, and predict loaders of each kind (a map-style dataset, an
IterableDataset sharded over workers, two loaders). Lightning's own demos (`lightning.pytorch.demos`) are used as
they ship."""

from __future__ import annotations

import torch
from lightning import Callback, LightningDataModule, LightningModule, Trainer
from torch import nn
from torch.nn import functional as F
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    get_worker_info,
)
from torchmetrics import MeanMetric, MinMetric

from tests.plain_task import read_images


class LitAutoEncoder(LightningModule):
    def __init__(self, lr: float = 1e-3, returns: str = "tensor", lazy: bool = False, epoch_metrics: bool = False):
        super().__init__()
        self.save_hyperparameters()
        first = nn.LazyLinear(64) if lazy else nn.Linear(28 * 28, 64)  # lazy: its shape set by the first batch
        self.encoder = nn.Sequential(first, nn.ReLU(), nn.Linear(64, 3))
        # epoch_metrics: the epoch's mean losses, as torchmetrics gathers them, and the lowest validation loss so far
        self.train_mean, self.val_mean, self.lowest_val = MeanMetric(), MeanMetric(), MinMetric()
        self.epoch_metrics = epoch_metrics
        self.decoder = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 28 * 28))
        self.input_shift = 0.0  # a curriculum's (InputShift), set as each epoch starts

    def loss(self, batch) -> torch.Tensor:
        if isinstance(batch, dict):  # a dict of training loaders: one batch of each
            return sum(self.loss(part) for part in batch.values())
        x, _ = batch
        x = x.view(x.size(0), -1) + self.input_shift
        return F.mse_loss(self.decoder(self.encoder(x)), x)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss, on_epoch=self.epoch_metrics)
        if self.epoch_metrics:  # the epoch's values, each reduced its own way
            self.log("train_worst", loss, on_step=False, on_epoch=True, reduce_fx="max")
            self.train_mean.update(loss)
            self.log("train_mean", self.train_mean, on_step=False, on_epoch=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.epoch_metrics:
            self.log("train_batches", 1.0, on_step=False, on_epoch=True, reduce_fx="sum")

    def validation_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        loss = self.loss(batch)
        self.log("val_loss", loss)
        if self.epoch_metrics:
            self.val_mean.update(loss)
            self.log("val_mean", self.val_mean)
            self.lowest_val.update(loss)

    def on_validation_epoch_end(self) -> None:
        if self.epoch_metrics:  # gathered across epochs, never reset (lightning-hydra-template's best so far)
            self.log("lowest_val", self.lowest_val.compute())

    def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0):
        x, label = batch
        code = self.encoder(x.view(x.size(0), -1))
        if self.hparams.returns == "dict":
            return {"label": label, "code": code}
        if self.hparams.returns == "tuple":
            return code, label
        if self.hparams.returns == "scalar":
            return code.sum()
        return code

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss"}}


class NoisyAutoEncoder(LitAutoEncoder):
    """A denoising autoencoder: noise on its inputs drawn from a torch.Generator of its own, seeded once."""

    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__(lr)
        self.noise = torch.Generator().manual_seed(0)

    def loss(self, batch) -> torch.Tensor:
        x, _ = batch
        x = x.view(x.size(0), -1)
        noisy = x + 0.1 * torch.randn(x.shape, generator=self.noise)
        return F.mse_loss(self.decoder(self.encoder(noisy)), x)


class InputShift(Callback):
    """A curriculum set up as each epoch starts, keeping nothing in the checkpoint: inputs shifted by 0.1 an epoch."""

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        pl_module.input_shift = 0.1 * trainer.current_epoch


class EpochValues(Callback):
    """What each epoch logged, as `callback_metrics` hold it when the next epoch starts and when training ends."""

    def __init__(self) -> None:
        self.logged: list[dict[str, float]] = []

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.logged.append({k: float(v) for k, v in sorted(trainer.callback_metrics.items()) if v.numel() == 1})

    on_train_end = on_train_epoch_start


class ManualAutoEncoder(LitAutoEncoder):
    def __init__(self, lr: float = 1e-3, accumulate: int = 1) -> None:
        super().__init__(lr)
        self.automatic_optimization = False
        self.accumulate = accumulate  # batches whose gradients each step sums, as Lightning's docs accumulate by hand

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        loss = self.loss(batch)
        self.manual_backward(loss / self.accumulate)
        if (batch_idx + 1) % self.accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class Shards(IterableDataset):
    """A dataset read as a stream, each loader worker its share, as PyTorch's docs shard an IterableDataset."""

    def __init__(self, dataset: TensorDataset) -> None:
        self.dataset = dataset

    def __iter__(self):
        worker = get_worker_info()
        first, step = (0, 1) if worker is None else (worker.id, worker.num_workers)
        return (self.dataset[i] for i in range(first, len(self.dataset), step))


class ImagesData(LightningDataModule):
    def __init__(
        self, loader: str = "shuffle", val_loaders: int = 1, batch_size: int = 16, train_size: int = 128,
        predict: str = "dataset",
    ) -> None:  # fmt: skip
        super().__init__()
        self.loader, self.val_loaders, self.batch_size, self.train_size = loader, val_loaders, batch_size, train_size
        self.predict = predict

    def setup(self, stage: str) -> None:
        images = read_images("train", self.train_size + 64).float() / 255
        labels = torch.arange(len(images)) % 10
        self.train = TensorDataset(images[: self.train_size], labels[: self.train_size])
        self.val = TensorDataset(images[self.train_size :], labels[self.train_size :])

    def train_dataloader(self):
        data, size = self.train, self.batch_size
        if self.loader == "shuffle":
            return DataLoader(data, batch_size=size, shuffle=True)
        if self.loader == "weighted":  # classes 0-4 drawn twice as often
            weights = torch.where(data.tensors[1] < 5, 2.0, 1.0)
            return DataLoader(data, batch_size=size, sampler=WeightedRandomSampler(weights, len(data)))
        if self.loader == "batch_sampler":
            return DataLoader(data, batch_sampler=BatchSampler(RandomSampler(data), size, drop_last=False))
        if self.loader == "num_samples":  # 2 batches an epoch
            return DataLoader(data, batch_size=size, sampler=RandomSampler(data, num_samples=2 * size))
        if self.loader == "dict":
            return {"a": DataLoader(data, batch_size=size, shuffle=True), "b": DataLoader(data, batch_size=size)}
        raise ValueError(f"--data.loader {self.loader}: no such loader")

    def val_dataloader(self):
        loaders = [DataLoader(self.val, batch_size=32) for _ in range(self.val_loaders)]
        return loaders[0] if self.val_loaders == 1 else loaders

    def predict_dataloader(self):
        if self.predict == "stream":
            return DataLoader(Shards(self.val), batch_size=10, num_workers=2)
        if self.predict == "two":
            return [DataLoader(self.val, batch_size=10), DataLoader(self.val, batch_size=10)]
        return DataLoader(self.val, batch_size=10)


class ShortEpochs(LitAutoEncoder):
    """Epochs ended early the way Lightning's docs show: `on_train_batch_start` returns -1 (here after `batches`)."""

    def __init__(self, lr: float = 1e-3, batches: int = 3) -> None:
        super().__init__(lr)
        self.batches = batches

    def on_train_batch_start(self, batch, batch_idx: int) -> int | None:
        return -1 if batch_idx == self.batches else None

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)  # no validation runs: nothing to plateau on
