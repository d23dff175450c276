"""Samplers and loaders that make runs reproducible, resumable and exact under DDP.

The samplers are `DistributedSampler`s, so Lightning uses them as they are instead of
injecting its own, and calls `set_epoch` on them every epoch.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch
from lightning import Trainer
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler


def world(trainer: Trainer | None) -> tuple[int, int]:
    """(world size, rank) of the run, (1, 0) outside a Trainer."""
    return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)


def global_seed() -> int:
    """The seed `seed_everything` was called with (train.py's --seed_everything)."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class EpochSampler(DistributedSampler):
    """A shuffle whose order is a function of (global seed, epoch) alone, resumable mid-epoch.

    The order does not depend on how many random numbers were drawn before, so a
    resumed run sees the same batches as an uninterrupted one. Under DDP each rank
    gets its own shard of the same permutation.
    """

    _skip = 0

    def skip_next(self, samples: int) -> None:
        """Drop the first `samples` indices of the next pass (the batches a stopped run already did)."""
        self._skip = samples

    def epoch_indices(self) -> Iterator[int]:
        return super().__iter__()

    def __iter__(self) -> Iterator[int]:
        skip, self._skip = self._skip, 0
        return itertools.islice(self.epoch_indices(), skip, None)


def epoch_seeded_sampler(dataset: Sized, trainer: Trainer | None) -> EpochSampler:
    world_size, rank = world(trainer)
    return EpochSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=global_seed())  # type: ignore[arg-type]


class EvalShardSampler(DistributedSampler):
    """Rank r evaluates samples r, r + world, r + 2 world, ...: every sample exactly once.

    Lightning's default pads the shards with repeated samples so all ranks get the
    same count, which skews validation and test metrics slightly; torchmetrics
    syncs counts across ranks, so unequal shards are exact.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)  # type: ignore[arg-type]
        self.num_samples = len(range(rank, len(dataset), num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(self.dataset), self.num_replicas))  # type: ignore[arg-type]


def eval_sampler(dataset: Sized, trainer: Trainer | None) -> EvalShardSampler | None:
    world_size, rank = world(trainer)
    return EvalShardSampler(dataset, world_size, rank) if world_size > 1 else None


def loader_sampler(dataset: Sized, trainer: Trainer | None, shuffle: bool) -> DistributedSampler | None:
    return epoch_seeded_sampler(dataset, trainer) if shuffle else eval_sampler(dataset, trainer)


def make_loader(
    dataset: Dataset,
    trainer: Trainer | None,
    shuffle: bool,
    batch_size: int,
    collate_fn: Callable[[Any], Any] | None = None,
    num_workers: int = 0,
    pin_memory: bool = False,
    sampler: Sampler | None = None,
) -> DataLoader:
    """A DataLoader with our samplers (or `sampler`) and its own generator.

    The loader draws its worker base seed from that generator instead of the global
    RNG, which stays reserved for the training step (see callbacks.ExactResume).
    """
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler or loader_sampler(dataset, trainer, shuffle),  # type: ignore[arg-type]
        generator=torch.Generator(),
        collate_fn=collate_fn,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
    )


class SplitLoaders:
    """The four `*_dataloader` hooks of a LightningDataModule, from one `loader(split, shuffle)`."""

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        raise NotImplementedError

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.loader("test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self.loader("predict", shuffle=False)
