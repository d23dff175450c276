"""Samplers and loaders that make runs reproducible, resumable and exact under DDP.

The samplers are `DistributedSampler`s, so Lightning uses them as they are instead of
injecting its own.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable, Iterator, Sized
from typing import Any

import numpy as np
import torch
from lightning import Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.seed import isolate_rng
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from lightning_template.engine.errors import ConfigError
from lightning_template.engine.lightning_internals import batches_done, epoch_counts, replaces_samplers

SAMPLERS = ("sampler", "batch_sampler")  # a DataLoader's attributes that order its batches


def world(trainer: Trainer | None) -> tuple[int, int]:
    """(world size, rank) of the run, (1, 0) outside a Trainer."""
    return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)


def global_seed() -> int:
    """The seed `seed_everything` was called with (train.py's --seed_everything)."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def derive_seed(*parts: int) -> int:
    """A seed for (seed, epoch, rank, sample, ...): independent streams, the same on every machine."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def seed_host(seed: int) -> None:
    """Python's `random`, NumPy's global generator and torch's CPU generator, seeded by `seed`."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    # Not torch.manual_seed: while CUDA is not initialized (every CPU run) it records a stack trace per call for a
    # deferred CUDA seeding, which costs more than a small training step. The same states, without that.
    torch.default_generator.manual_seed(seed)


class ResumesFromLoop:
    """The contract of a resumable training sampler or loader: each time iteration starts, it continues from the
    Trainer's fit-loop position (`fit_position(self.trainer)`), so a run resumed in the middle of an epoch skips
    exactly the batches it already trained. `ExactResume` refuses a mid-epoch resume through anything else.

    Implemented by `EpochSampler` (every map-style datamodule, through `make_loader`), and by any loader that
    reads a stream of chunks by its position. Subclasses set `trainer` and, if their batches depend on the
    loader's worker count, say so with `worker_dependent = True` (a resume with another count is then refused)."""

    trainer: Trainer | None
    worker_dependent: bool = False


def inside_an_epoch(trainer: Trainer) -> bool:
    """Whether the fit loop has started an epoch it has not processed (else its batch counts are the finished
    epoch's)."""
    epochs = epoch_counts(trainer)
    return epochs.started > epochs.processed


def fit_position(trainer: Trainer | None) -> tuple[int, int] | None:
    """(epoch, batches of it already trained) by the Trainer's fit loop, restored from a checkpoint
    when resuming; None outside `fit`."""
    if trainer is None or trainer.state.fn != TrainerFn.FITTING:
        return None
    epochs = epoch_counts(trainer)
    # The epoch is the one the trainer counts (`current_epoch`, epochs completed): a run restarted with `max_steps`
    # from a checkpoint at an epoch's last batch has that epoch processed twice by Lightning's counters.
    return epochs.completed, batches_done(trainer) if inside_an_epoch(trainer) else 0


class EpochSampler(DistributedSampler, ResumesFromLoop):
    """A shuffle whose order is a function of (seed, epoch) alone, resumable in the middle of an epoch.

    The epoch and the batches already trained in it are read from the Trainer's fit loop when
    iteration starts, not from `set_epoch` (which Lightning calls only after the DataLoader's
    workers have prefetched, Lightning #21938). A resumed run thus skips exactly the batches it
    already trained, in the right epoch, provided the iterator is created after the loop was
    restored: `lightning_template.engine.ExactResume` starts it again at train start when workers prefetched
    earlier. Under DDP each rank gets its own shard of the same permutation.
    """

    def __init__(
        self,
        dataset: Sized,
        batch_size: int,
        trainer: Trainer | None = None,
        seed: int = 0,
        sample_seeds: bool = False,
        shard: tuple[int, int] | None = None,
        shuffle: bool = True,
    ) -> None:
        """`shard`: (world size, rank), by default the trainer's. `shuffle=False`: the dataset's order (sharded)."""
        world_size, rank = shard or world(trainer)
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed)  # type: ignore[arg-type]
        self.batch_size, self.trainer, self.sample_seeds = batch_size, trainer, sample_seeds

    def epoch_indices(self, epoch: int) -> list[int]:
        self.set_epoch(epoch)
        return list(super().__iter__())

    def __iter__(self) -> Iterator[Any]:
        epoch, batches_done = fit_position(self.trainer) or (self.epoch, 0)
        indices = self.epoch_indices(epoch)[batches_done * self.batch_size :]
        if self.sample_seeds:
            return iter([(i, derive_seed(self.seed, epoch, i)) for i in indices])
        return iter(indices)


class OverfitSampler(EpochSampler, SequentialSampler):
    """An `EpochSampler` in the dataset's order that Lightning takes for its own under `--trainer.overfit_batches`:
    Lightning puts a plain SequentialSampler in place of any other there, which cannot skip the batches a run resumed
    in the middle of an epoch already trained (it trained them again)."""


def training_sampler(
    dataset: Sized, batch_size: int, trainer: Trainer | None, sample_seeds: bool = False, shuffle: bool = True
) -> EpochSampler:
    """The training sampler of a loader the engine or a task builds: an `EpochSampler` seeded by the run's seed, an
    `OverfitSampler` under `--trainer.overfit_batches` (Lightning trains on the first batches, in the dataset's
    order, and keeps a sampler of that order)."""
    overfit = trainer is not None and trainer.overfit_batches > 0
    kind = OverfitSampler if overfit else EpochSampler
    return kind(dataset, batch_size, trainer, global_seed(), sample_seeds=sample_seeds, shuffle=shuffle and not overfit)


class SeededBatches(Dataset):
    """A map-style dataset whose batches are fetched and collated with the random state of their first sample's seed.

    Random transforms in `__getitem__` and in the loader's `collate_fn` (a random crop or mask of the batch) then
    depend on (seed, epoch, batch) alone: not on the number of loader workers, on which worker fetched the batch, or
    on where a resumed run restarted. Its indices are the (index, seed) pairs of an `EpochSampler(sample_seeds=True)`
    (plain indices, from a sampler Lightning puts in for `--trainer.overfit_batches`, are fetched unseeded); its
    batches come collated (the loader's `collate_fn` is `collated_already`); every other attribute is the dataset's.
    """

    def __init__(self, dataset: Dataset, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.dataset, self.collate_batch = dataset, collate_fn

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "collate_batch"):  # not set yet (unpickling in a worker)
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, index: tuple[int, int] | int) -> Any:
        if not isinstance(index, tuple):
            return self.dataset[index]
        with isolate_rng(include_cuda=False):
            seed_host(index[1])
            return self.dataset[index[0]]

    def __getitems__(self, indices: list[tuple[int, int]] | list[int]) -> Any:
        if not isinstance(indices[0], tuple):
            return self.collate_batch([self.dataset[i] for i in indices])
        positions, seed = [index for index, _ in indices], indices[0][1]
        # The main process's own streams are not touched by data loading (a fetch that raises ends the run).
        with isolate_rng(include_cuda=False):
            seed_host(seed)
            if callable(getattr(self.dataset, "__getitems__", None)):
                samples = self.dataset.__getitems__(positions)
            else:
                samples = [self.dataset[i] for i in positions]
            return self.collate_batch(samples)


def collated_already(batch: Any) -> Any:
    """The collate function of a loader over `SeededBatches`, which collates its batches itself."""
    return batch


def is_stateful_dataloader(loader: Any) -> bool:
    """torchdata's StatefulDataLoader (a DataLoader subclass with `state_dict`), recognized without importing it."""
    return type(loader).__name__ == "StatefulDataLoader" and type(loader).__module__.startswith("torchdata.")


def shuffles(sampler: Any) -> bool | None:
    """True for a full shuffle (torch's RandomSampler, or torchdata's twin), False for the dataset's order, None for
    any other sampler."""
    if type(sampler) is SequentialSampler:
        return False
    random = isinstance(sampler, RandomSampler) or (
        type(sampler).__name__ == "RandomSampler" and type(sampler).__module__.startswith("torchdata.")
    )
    return True if random else None


def not_rebuildable(loader: Any) -> str | None:
    """Why `loader` cannot be rebuilt with an `EpochSampler` giving the same batches, or None if it can: every
    argument of its sampler must be one the rebuilt loader honours (a full shuffle or the dataset's order)."""
    if isinstance(loader, (dict, list, tuple)):
        return f"the training loaders are a {type(loader).__name__} of {len(loader)} (Lightning's CombinedLoader)"
    if not isinstance(loader, DataLoader):
        return f"the training loader is a {type(loader).__name__}, not one DataLoader"
    if type(loader) is not DataLoader and not is_stateful_dataloader(loader):
        return f"the training loader is a {type(loader).__name__} (a DataLoader subclass)"
    if isinstance(loader.dataset, IterableDataset):
        return f"the training loader reads an IterableDataset ({type(loader.dataset).__name__})"
    if loader.batch_size is None and loader.batch_sampler is not None:  # DataLoader(batch_sampler=...)
        return f"the training loader's batches come from its batch_sampler (a {type(loader.batch_sampler).__name__})"
    if loader.batch_size is None:
        return "the training loader does not batch (batch_size=None)"
    sampler = loader.sampler
    if shuffles(sampler) is None:
        return f"the training loader's order comes from a {type(sampler).__name__}"
    if shuffles(sampler) and sampler.replacement:
        return "the training loader's RandomSampler draws with replacement"
    if shuffles(sampler) and sampler.num_samples != len(loader.dataset):  # type: ignore[arg-type]
        return (
            f"the training loader's RandomSampler draws num_samples={sampler.num_samples} of the"
            f" {len(loader.dataset)} samples an epoch"  # type: ignore[arg-type]
        )
    return None


def continues_by_itself(loader: Any) -> bool:
    """A `ResumesFromLoop` sampler or loader, or one with `state_dict` (which Lightning restores), but not torchdata's
    StatefulDataLoader over a map-style dataset (see `resumable_loader`)."""
    if any(isinstance(x, ResumesFromLoop) for x in (loader, *(getattr(loader, a, None) for a in SAMPLERS))):
        return True
    stateful = callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))
    return stateful and not (is_stateful_dataloader(loader) and not isinstance(loader.dataset, IterableDataset))


def refuse_batch_sampler_under_ddp(loader: Any, trainer: Trainer) -> None:
    """DataLoader(batch_sampler=BatchSampler(...)): under DDP Lightning drops the BatchSampler for its distributed
    sampler and keeps the loader's batch_size, None, so 1."""
    given = type(getattr(loader, "batch_sampler", None)) is BatchSampler and loader.batch_size is None
    if given and trainer.world_size > 1 and replaces_samplers(trainer):
        raise ConfigError(
            "The training DataLoader takes a torch BatchSampler (batch_sampler=...): under DDP Lightning replaces"
            " it with its distributed sampler and trains on batches of 1. Give the DataLoader batch_size= and"
            " sampler= (or shuffle=) instead, or set --trainer.use_distributed_sampler false and shard it yourself."
        )


def resumable_loader(loader: Any, trainer: Trainer) -> tuple[Any, str | None]:
    """The training loader, made to continue exactly from the Trainer's position when it can be; and, when it
    cannot, why (one line).

    A `DataLoader` over a map-style dataset with a plain shuffled or sequential order (`shuffle=True/False`, any
    batch size, `drop_last`, workers) is built again with the same settings, an `EpochSampler` (the same order
    under DDP, each rank its shard, seeded by `--seed_everything` rather than a `generator` of the loader's) and
    `SeededBatches`; any other sampler or batch sampler is kept, with the reason (`not_rebuildable`). A loader that
    already continues by itself (a `ResumesFromLoop` sampler or loader, or one with `state_dict`, which Lightning
    restores) is kept as it is, except torchdata's StatefulDataLoader over a map-style dataset: rebuilt too, since its
    restored state starts the next epoch in another order than a run never stopped (and Lightning does not restore
    it when `configure_optimizers` reads `trainer.estimated_stepping_batches`, Lightning #20550).
    """
    if continues_by_itself(loader):
        return loader, None
    refuse_batch_sampler_under_ddp(loader, trainer)
    if why := not_rebuildable(loader):
        return loader, why
    sampler = training_sampler(
        loader.dataset, loader.batch_size, trainer, sample_seeds=True, shuffle=bool(shuffles(loader.sampler))
    )
    workers = loader.num_workers
    rebuilt = DataLoader(
        SeededBatches(loader.dataset, loader.collate_fn), batch_size=loader.batch_size, sampler=sampler,
        drop_last=loader.drop_last, num_workers=workers, collate_fn=collated_already, pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context if workers else None,
        generator=torch.Generator().manual_seed(derive_seed(global_seed(), trainer.global_rank)),
        prefetch_factor=loader.prefetch_factor if workers else None, persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device, in_order=loader.in_order,
    )  # fmt: skip
    return rebuilt, None
