"""The loaders of the shipped datamodules: the training split through the engine's `EpochSampler` (its order from
(seed, epoch), so that a resumed run continues it without the engine rebuilding the loader), a sample's random
transforms seeded by its own seed (`seeded_sample`), evaluation splits sharded without padding under DDP, and the four
`*_dataloader` hooks from one method.

Your own datamodule needs none of this: a plain `DataLoader` gets the same guarantees (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from typing import Any, TypeVar

import torch
from lightning import Trainer
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, get_worker_info

from lightning_template.engine.sampling import derive_seed, global_seed, training_sampler, world

T = TypeVar("T")


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


def seeded_sample(get_item: Callable[[int], T], index: int | tuple[int, int]) -> T:
    """`get_item(index)`, with torch's generator seeded by the sample's own seed if the sampler gave one.

    Random transforms in DataLoader workers then depend on (seed, epoch, sample) alone: not on
    the number of workers, on which worker got the sample, or on where a resumed run restarted.
    """
    if not isinstance(index, tuple):
        return get_item(index)
    sample, seed = index
    if get_worker_info() is not None:  # a worker process: its generator serves these samples alone
        torch.default_generator.manual_seed(seed)
        return get_item(sample)
    with torch.random.fork_rng(devices=[]):  # the main process (num_workers=0): training's own stream is kept
        # The CPU generator only (what fork_rng restores): torch.manual_seed would also reseed CUDA's, and costs
        # a stack trace per sample while CUDA is not initialized (every DataLoader worker).
        torch.default_generator.manual_seed(seed)
        return get_item(sample)


def make_loader(
    dataset: Dataset,
    trainer: Trainer | None,
    shuffle: bool,
    batch_size: int,
    collate_fn: Callable[[Any], Any] | None = None,
    num_workers: int = 0,
    pin_memory: bool = False,
    sampler: Sampler | None = None,
    sample_seeds: bool = False,
) -> DataLoader:
    """A DataLoader with our samplers (or `sampler`): `EpochSampler` to train, `EvalShardSampler` under DDP.

    `sample_seeds`: the training sampler hands each sample its own seed (see `seeded_sample`),
    for datasets that augment in workers. The loader's worker seeds come from its own seeded
    generator, never from the global one that `lightning_template.engine.ExactResume` reserves for the step.
    """
    world_size, rank = world(trainer)
    if sampler is None and shuffle:
        sampler = training_sampler(dataset, batch_size, trainer, sample_seeds)  # type: ignore[arg-type]
    elif sampler is None and world_size > 1:
        sampler = EvalShardSampler(dataset, world_size, rank)  # type: ignore[arg-type]
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        generator=torch.Generator().manual_seed(derive_seed(global_seed(), rank)),
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
