"""Lightning code as users write it, one knob per choice that a setup can make; `tests/test_generated_setups.py` draws
the knobs with Hypothesis and checks that a run stopped anywhere and resumed ends as the run never stopped.

Nothing of the project is imported: a module, a datamodule and callbacks written as Lightning's and PyTorch's docs
write them (schedulers of every kind and interval, a scheduler stepped by hand, manual optimization with one or two
optimizers, a buffer updated every step, an entry of its own in the checkpoint, state no checkpoint holds, epochs
ended early (checked one by one, not drawn), samplers, batch samplers, an IterableDataset, torchdata's
StatefulDataLoader, random flips in `__getitem__`, random masks in `collate_fn`). The
data are real: Fashion-MNIST images pooled to 7x7, 10 classes.
"""

from __future__ import annotations

import hashlib
import os
import signal
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning import Callback, LightningDataModule, LightningModule, Trainer
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import BaseFinetuning, GradientAccumulationScheduler
from torch import nn
from torch.nn import functional as F
from torch.optim import lr_scheduler
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Subset,
    SubsetRandomSampler,
    WeightedRandomSampler,
    default_collate,
    get_worker_info,
)
from torchmetrics import MeanMetric, SumMetric

from tests.plain_task import read_images

SCHEDULERS = (
    "StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "OneCycleLR",
    "LinearLR", "SequentialLR", "LambdaLR", "ReduceLROnPlateau",
)  # fmt: skip
SAMPLERS = ("shuffle", "sequential", "random", "weighted", "subset", "num_samples")
LOADERS = ("map", "batch_sampler", "iterable", "stateful", "dict")


def halve_every_two(epoch: int) -> float:
    """LambdaLR's factor (a function of the module, so that the scheduler pickles with the checkpoint's config)."""
    return 0.5 ** (epoch // 2)


def joined(batch: Any) -> Any:
    """A batch of several training loaders ({name: (features, target)}, Lightning's CombinedLoader) as one."""
    if not isinstance(batch, dict):
        return batch
    return tuple(torch.cat(parts) for parts in zip(*batch.values(), strict=True))


class GeneratedModule(LightningModule):
    def __init__(
        self,
        optimization: str = "automatic",
        returns: str = "dict",
        scheduler: str | None = None,
        interval: str = "epoch",
        frequency: int = 1,
        strict: bool = True,
        dropout: float = 0.0,
        step_buffer: bool = False,
        checkpoint_entry: bool = False,
        hook_draws: bool = False,
        batch_norm: bool = False,
        scheduled_accumulation: bool = False,
        epoch_metrics: bool = False,
        lr: float = 0.05,
        unsaved_state: bool = False,
        end_epochs_at: int | None = None,
    ) -> None:
        """
        Args:
            optimization: automatic; manual (one optimizer, its scheduler stepped by hand); manual-two (two
                optimizers, one per half of the network, as a GAN steps its generator and discriminator).
            returns: what `configure_optimizers` returns: optimizer (alone, no scheduler), list (`[opt], [sched]`),
                dict (`{"optimizer", "lr_scheduler": {...}}`).
            scheduler: a class of `torch.optim.lr_scheduler`, or None.
            interval: step or epoch, the scheduler's interval.
            frequency: the scheduler steps every `frequency` intervals.
            strict: ReduceLROnPlateau's `strict`: a missing monitored metric is an error (else skipped).
            dropout: dropout probability of the hidden layer.
            step_buffer: a buffer updated at every step (a running mean of the loss).
            checkpoint_entry: a count of trained samples saved under a checkpoint entry of its own.
            hook_draws: random numbers drawn outside the step: noise added to each training batch on the device
                (`on_after_batch_transfer`), and a draw in `on_train_batch_end` (as a stochastic schedule makes).
            batch_norm: a BatchNorm layer in the hidden layer.
            scheduled_accumulation: a GradientAccumulationScheduler of the module's (`configure_callbacks`): 2
                micro-batches a step from epoch 1.
            epoch_metrics: the epoch's mean loss logged by Lightning (`on_epoch=True`) and by a torchmetrics metric,
                and the sum of every loss so far, a torchmetrics metric gathered across epochs (never reset).
            lr: the learning rate.
            unsaved_state: the loss annealed by state no checkpoint holds: a buffer registered with `persistent=False`
                and a plain counter (`self.steps_taken += 1`), both updated every step.
            end_epochs_at: each epoch ends before its batch of this index (`on_train_batch_start` returns -1, as
                Lightning's docs end an epoch early), or None.
        """
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = optimization == "automatic"
        norm = [nn.BatchNorm1d(32)] if batch_norm else []
        self.body = nn.Sequential(nn.Linear(49, 32), *norm, nn.ReLU(), nn.Dropout(dropout))
        self.head = nn.Linear(32, 10)
        if step_buffer:
            self.register_buffer("loss_average", torch.zeros(()))
        # Kept only where the checkpoint holds it: a counter no checkpoint holds is `unsaved_state`'s, and a resume
        # names it (a line that would excuse any difference of every setup drawn without the entry).
        if checkpoint_entry:
            self.samples_seen = 0
        if unsaved_state:
            self.register_buffer("decay", torch.ones(()), persistent=False)
            self.steps_taken = 0
        if epoch_metrics:
            self.train_mean, self.loss_total = MeanMetric(), SumMetric()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(features))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        features, target = joined(batch)
        loss = F.cross_entropy(self(features), target) * self._annealing()
        self.log("train_loss", loss, on_epoch=self.hparams.epoch_metrics)
        if self.hparams.epoch_metrics:
            self.train_mean.update(loss)
            self.log("train_mean", self.train_mean, on_step=False, on_epoch=True)
            self.loss_total.update(loss.detach())
        if self.hparams.step_buffer:
            self.loss_average.mul_(0.9).add_(0.1 * loss.detach())
        if self.hparams.checkpoint_entry:
            self.samples_seen += len(target)
        if self.automatic_optimization:
            return loss
        optimizers = self.optimizers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        for optimizer in optimizers:  # manual-two: the body's step, then the head's, each on its own loss
            self.toggle_optimizer(optimizer)
            step_loss = F.cross_entropy(self(features), target) * self._annealing()
            optimizer.zero_grad()
            self.manual_backward(step_loss)
            optimizer.step()
            self.untoggle_optimizer(optimizer)
        self._step_schedulers_by_hand()
        return None

    def _annealing(self) -> torch.Tensor | float:
        """The loss's weight by `unsaved_state` (1 without), moved on at each call."""
        if not self.hparams.unsaved_state:
            return 1.0
        weight = self.decay * (1 + 1 / (1 + self.steps_taken))
        self.decay.mul_(0.98)
        self.steps_taken += 1
        return weight

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        return -1 if batch_idx == self.hparams.end_epochs_at else None

    def _step_schedulers_by_hand(self) -> None:
        """Manual optimization steps its schedulers itself: every `frequency` batches or epochs (at an epoch's last
        batch, as Lightning's docs show); ReduceLROnPlateau on the last training loss, at epoch ends."""
        schedulers = self.lr_schedulers()
        if schedulers is None:
            return
        count = self.trainer.fit_loop.epoch_loop.batch_progress.current.processed + 1
        if self.hparams.interval == "epoch":
            if not self.trainer.is_last_batch:
                return
            count = self.current_epoch + 1
        if count % self.hparams.frequency:
            return
        for scheduler in schedulers if isinstance(schedulers, list) else [schedulers]:
            if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau):
                scheduler.step(self.trainer.callback_metrics["train_loss"])
            else:
                scheduler.step()

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if not (self.hparams.hook_draws and self.trainer.training):
            return batch
        features, target = joined(batch)
        return features + 0.05 * torch.randn_like(features), target

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.hparams.hook_draws:
            torch.rand(())

    def configure_callbacks(self) -> list[Callback]:
        return [GradientAccumulationScheduler({1: 2})] if self.hparams.scheduled_accumulation else []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        features, target = batch
        logits = self(features)
        # Averaged over the DDP processes, as Lightning's docs ask for a metric that checkpoints and early stopping
        # watch: by each process's own value the processes would choose differently whether to save, each then waiting
        # in a collective the other never joins.
        self.log("val_loss", F.cross_entropy(logits, target), sync_dist=True)
        self.log("val_acc", (logits.argmax(-1) == target).float().mean(), sync_dist=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.hparams.checkpoint_entry:
            checkpoint["samples_seen"] = self.samples_seen

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.hparams.checkpoint_entry:
            self.samples_seen = checkpoint["samples_seen"]

    def _scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        name = self.hparams.scheduler
        if name == "StepLR":
            return lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        if name == "MultiStepLR":
            return lr_scheduler.MultiStepLR(optimizer, milestones=[1, 3, 6], gamma=0.5)
        if name == "ExponentialLR":
            return lr_scheduler.ExponentialLR(optimizer, gamma=0.8)
        if name == "CosineAnnealingLR":
            return lr_scheduler.CosineAnnealingLR(optimizer, T_max=8)
        if name == "CosineAnnealingWarmRestarts":
            return lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=3)
        if name == "OneCycleLR":  # its length read from the trainer, as Lightning's docs do
            return lr_scheduler.OneCycleLR(optimizer, max_lr=self.hparams.lr, total_steps=self._scheduler_steps())
        if name == "LinearLR":
            return lr_scheduler.LinearLR(optimizer, start_factor=0.2, total_iters=4)
        if name == "SequentialLR":
            warmup = lr_scheduler.LinearLR(optimizer, start_factor=0.2, total_iters=2)
            decay = lr_scheduler.ExponentialLR(optimizer, gamma=0.8)
            return lr_scheduler.SequentialLR(optimizer, [warmup, decay], milestones=[2])
        if name == "LambdaLR":
            return lr_scheduler.LambdaLR(optimizer, halve_every_two)
        if name == "ReduceLROnPlateau":
            return lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0, threshold=0.5)
        raise ValueError(f"--model.scheduler {name}: no such scheduler")

    def _scheduler_steps(self) -> int:
        """How often the scheduler steps in the whole run (OneCycleLR must know)."""
        if self.hparams.interval == "step":  # Lightning counts `frequency` in batches, accumulated or not
            batches = int(self.trainer.estimated_stepping_batches) * self.trainer.accumulate_grad_batches
            return batches // self.hparams.frequency + 1
        return max(self.trainer.max_epochs, 1) // self.hparams.frequency + 1

    def configure_optimizers(self) -> Any:
        lr = self.hparams.lr
        if self.hparams.optimization == "manual-two":
            optimizers = [
                torch.optim.Adam(self.body.parameters(), lr=lr / 10),
                torch.optim.SGD(self.head.parameters(), lr=lr, momentum=0.9),
            ]
        else:
            optimizers = [torch.optim.SGD(self.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)]
        if self.hparams.returns == "optimizer" or self.hparams.scheduler is None:
            return optimizers[0] if len(optimizers) == 1 else optimizers
        schedulers = [self._scheduler(optimizer) for optimizer in optimizers]
        if self.hparams.returns == "list":
            return optimizers, schedulers
        configs = []
        for optimizer, scheduler in zip(optimizers, schedulers, strict=True):
            config = {"scheduler": scheduler, "interval": self.hparams.interval, "frequency": self.hparams.frequency}
            if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau):
                config |= {"monitor": "val_loss", "strict": self.hparams.strict}
            configs.append({"optimizer": optimizer, "lr_scheduler": config})
        return configs[0] if len(configs) == 1 else configs


class PooledImages(Dataset):
    """Fashion-MNIST images pooled to 7x7 features; `flip`: half of them flipped at random, in `__getitem__`."""

    def __init__(self, split: str, count: int, flip: bool) -> None:
        images = read_images(split, count).float() / 255
        self.features = F.avg_pool2d(images[:, None], 4).flatten(1)
        self.images, self.flip = images, flip
        self.labels = (self.features.sum(1) * 10 / self.features.sum(1).max()).long().clamp(max=9)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.features[index]
        if self.flip and torch.rand(()) < 0.5:
            features = features.view(7, 7).flip(-1).flatten()
        return features, self.labels[index]


class PooledStream(IterableDataset):
    """The same samples as a stream, shared out among loader workers."""

    def __init__(self, dataset: PooledImages) -> None:
        self.dataset = dataset

    def __iter__(self) -> Any:
        worker = get_worker_info()
        start, step = (worker.id, worker.num_workers) if worker else (0, 1)
        return (self.dataset[i] for i in range(start, len(self.dataset), step))


def masking_collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """torch's collate, then a random 15 % of the batch's features set to 0."""
    features, labels = default_collate(samples)
    return [features.masked_fill(torch.rand(features.shape) < 0.15, 0.0), labels]


class GeneratedData(LightningDataModule):
    def __init__(
        self,
        loader: str = "map",
        sampler: str = "shuffle",
        batch_size: int = 16,
        drop_last: bool = False,
        num_workers: int = 0,
        augment: bool = False,
        train_size: int = 112,
        collate: str = "default",
    ) -> None:
        """
        Args:
            loader: map (a DataLoader over a map-style dataset), batch_sampler (`DataLoader(batch_sampler=...)`),
                iterable (an IterableDataset), stateful (torchdata's StatefulDataLoader, shuffled), dict (two
                DataLoaders, shuffled and sequential, in a dict).
            sampler: the map-style loader's order: shuffle (`shuffle=True`), sequential (`shuffle=False`), random
                (a RandomSampler given), weighted (WeightedRandomSampler), subset (SubsetRandomSampler over 3/4 of
                the samples), num_samples (a RandomSampler drawing 3/4 of them an epoch).
            batch_size: samples a batch.
            drop_last: drop an epoch's last, incomplete batch.
            num_workers: loader worker processes.
            augment: flip half of the training images at random in `__getitem__`.
            train_size: training samples.
            collate: the training loaders' collate_fn: default (torch's), masking (a random 15 % of each batch's
                features set to 0, as a collate that masks tokens does).
        """
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        self.train = PooledImages("train", self.hparams.train_size, flip=self.hparams.augment)
        self.val = PooledImages("t10k", 48, flip=False)

    def train_dataloader(self) -> Any:
        h, data = self.hparams, self.train
        workers = {"num_workers": h.num_workers, "persistent_workers": h.num_workers > 0}
        if h.collate == "masking":
            workers["collate_fn"] = masking_collate
        if h.loader == "iterable":
            return DataLoader(PooledStream(data), batch_size=h.batch_size, **workers)
        if h.loader == "stateful":
            from torchdata.stateful_dataloader import StatefulDataLoader

            return StatefulDataLoader(data, batch_size=h.batch_size, shuffle=True, drop_last=h.drop_last, **workers)
        if h.loader == "dict":  # two loaders at once (a multi-task run), the shorter one cycled
            half = Subset(data, range(len(data) // 2))
            return {
                "shuffled": DataLoader(data, h.batch_size, shuffle=True, drop_last=h.drop_last, **workers),
                "sequential": DataLoader(half, h.batch_size // 2, drop_last=h.drop_last, **workers),
            }
        if h.loader == "batch_sampler":
            batches = BatchSampler(RandomSampler(data), h.batch_size, drop_last=h.drop_last)
            return DataLoader(data, batch_sampler=batches, **workers)
        if h.sampler in ("shuffle", "sequential"):
            return DataLoader(data, h.batch_size, shuffle=h.sampler == "shuffle", drop_last=h.drop_last, **workers)
        three_quarters = len(data) * 3 // 4
        sampler = {
            "random": lambda: RandomSampler(data),
            "weighted": lambda: WeightedRandomSampler(torch.where(data.labels < 5, 2.0, 1.0), len(data)),
            "subset": lambda: SubsetRandomSampler(range(three_quarters)),
            "num_samples": lambda: RandomSampler(data, num_samples=three_quarters),
        }[h.sampler]()
        return DataLoader(data, h.batch_size, sampler=sampler, drop_last=h.drop_last, **workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=16)


class TrainedBatches(Callback):
    """A stateful callback: a fingerprint of every epoch started and batch trained, in order, and the validation loss
    of every validation with its step (so a resumed run that trains other samples, skips a hook or logs other metrics
    differs). Under DDP it holds every process's, gathered: Lightning saves the callback states of rank 0 alone, and
    every process resumes from them."""

    def __init__(self) -> None:
        self.fingerprint = ""
        self.validations: list[tuple[int, list[float]]] = []
        # {epoch: values}: an epoch restarted at its end (max_steps) runs its on_train_epoch_end hooks again (said in
        # docs/reliability.md), which records the same values again.
        self.epoch_metrics: dict[int, list[float]] = {}

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._add(trainer, f"epoch {trainer.current_epoch}".encode())  # a user's hook at every epoch's start

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._add(trainer, joined(batch)[0].cpu().numpy().tobytes())

    def _add(self, trainer: Trainer, data: bytes) -> None:
        digest = torch.tensor(int.from_bytes(hashlib.blake2b(data, digest_size=7).digest(), "little"))
        every = trainer.strategy.all_gather(digest).cpu().numpy().tobytes()  # each process's, in rank order
        self.fingerprint = hashlib.blake2b(self.fingerprint.encode() + every, digest_size=8).hexdigest()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The epoch's values of `epoch_metrics` (Lightning's mean, torchmetrics' mean) and the sum of all losses."""
        if pl_module.hparams.get("epoch_metrics"):
            # An epoch resumed after its last batch logs neither (no batch left to log them with; the resume says so).
            missing = torch.tensor(float("nan"))
            logged = [trainer.callback_metrics.get(key, missing) for key in ("train_loss_epoch", "train_mean")]
            values = torch.stack([v.detach().float() for v in [*logged, pl_module.loss_total.compute()]])
            gathered = trainer.strategy.all_gather(values).cpu().reshape(-1).tolist()
            self.epoch_metrics[trainer.current_epoch] = gathered

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking and "val_loss" in trainer.callback_metrics:
            losses = trainer.strategy.all_gather(trainer.callback_metrics["val_loss"].detach()).reshape(-1)
            self.validations.append((trainer.global_step, losses.tolist()))

    def state_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "validations": self.validations, "epoch_metrics": self.epoch_metrics}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.fingerprint, self.validations = state_dict["fingerprint"], list(state_dict["validations"])
        self.epoch_metrics = dict(state_dict["epoch_metrics"])


class SigtermAfterBatches(Callback):
    """A real SIGTERM to this process after the `count`-th training batch it runs (from 1), as `kill` sends it; under
    DDP to the process of `rank` alone, or to every process (None: a cluster's pre-emption)."""

    def __init__(self, count: int, rank: int | None = None) -> None:
        self.count, self.rank, self.seen = count, rank, 0

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        self.seen += 1
        if self.seen == self.count and self.rank in (None, trainer.global_rank):
            os.kill(os.getpid(), signal.SIGTERM)


class SigtermInValidation(Callback):
    """A real SIGTERM in the middle of the `index`-th validation inside fit (from 0; sanity checks not counted), to the
    process of `rank` or to every process."""

    def __init__(self, index: int, rank: int | None = None) -> None:
        self.index, self.rank, self.seen = index, rank, -1

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.seen += 0 if trainer.sanity_checking else 1

    def on_validation_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if not trainer.sanity_checking and self.seen == self.index:
            self.seen = -(10**9)  # once
            if self.rank in (None, trainer.global_rank):
                os.kill(os.getpid(), signal.SIGTERM)


def outcome(trainer: Trainer) -> dict[str, Any]:
    """What a run ends with, which a resumed run must end with too."""
    module = trainer.lightning_module
    recorder = next(c for c in trainer.callbacks if isinstance(c, TrainedBatches))
    return {
        "global_step": trainer.global_step,
        "weights and buffers": module.state_dict(),
        "optimizers": [optimizer.state_dict() for optimizer in trainer.optimizers],
        "schedulers": [config.scheduler.state_dict() for config in trainer.lr_scheduler_configs],
        "samples_seen": module.samples_seen if module.hparams.get("checkpoint_entry") else None,
        "trained batches": recorder.fingerprint,
        "validations": recorder.validations,
        "epoch metrics": recorder.epoch_metrics,
    }


class RecordOutcome(Callback):
    """Each process of a DDP run saves what its run ended with (`outcome`), the training batches it ran and the
    warnings it gave (each message whole, as the in-process runs catch them), as `outcome-rank<N>.pt` in the working
    folder: the test reads them from its own process."""

    def __init__(self) -> None:
        self.warned: list[str] = []

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        show = warnings.showwarning

        def record_and_show(message: Warning | str, *args: Any, **kwargs: Any) -> None:
            self.warned.append(str(message))
            show(message, *args, **kwargs)

        warnings.showwarning = record_and_show  # the process ends with the run: nothing to put back

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        ended = outcome(trainer)
        if trainer.global_rank:
            # Buffers are each process's own: DDP copies rank 0's into every process at each forward, and a running
            # mean of the process's own loss moves on from there (a weight average averages it too). Lightning's
            # checkpoint is rank 0's, so the other processes are compared on their weights.
            del ended["weights and buffers"]
            ended["weights"] = {name: p.detach().clone() for name, p in pl_module.named_parameters()}
        batches = trainer.fit_loop.total_batch_idx + 1
        saved = {"outcome": ended, "batches": batches, "warned": self.warned}
        torch.save(saved, f"outcome-rank{trainer.global_rank}.pt")


class FreezeUntilEpoch(BaseFinetuning):
    """A user's fine-tuning, as Lightning's docs write one: the hidden layer, its BatchNorm's statistics included,
    frozen until `epoch`."""

    def __init__(self, epoch: int = 1) -> None:
        super().__init__()
        self.epoch = epoch

    def freeze_before_training(self, pl_module: LightningModule) -> None:
        self.freeze(pl_module.body, train_bn=False)

    def finetune_function(self, pl_module: LightningModule, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        if epoch == self.epoch:  # its parameters are in the optimizer already: they start to train
            self.make_trainable(pl_module.body)


class KeepEveryCheckpoint(TorchCheckpointIO):
    """Writes each checkpoint as usual, and a copy of it in `snapshots/` (numbered in the order written): what a
    hard kill (SIGKILL, a power cut) right after that write leaves on disk."""

    def __init__(self, folder: str = "snapshots") -> None:
        super().__init__()
        self.folder, self.written = Path(folder), 0

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        self.folder.mkdir(parents=True, exist_ok=True)
        super().save_checkpoint(checkpoint, self.folder / f"{self.written:03d}-{Path(path).name}")
        self.written += 1
