"""k-fold cross-validation splits: stratified, seeded, and the same on every machine.

With `--data.num_folds K --data.fold i` a datamodule validates on fold i of its training data
and trains on the other K-1 folds; the test split is never touched. Run all K folds, one run each, and report
their mean ± std.
"""

from __future__ import annotations

import torch

from lightning_template.engine.errors import ConfigError


def check_fold(num_folds: int | None, fold: int) -> None:
    """Fail at construction, naming the option, before any data is read."""
    if num_folds is None:
        if fold != 0:
            raise ConfigError(f"data.fold={fold} needs data.num_folds (e.g. --data.num_folds 5).")
        return
    if num_folds < 2:
        raise ConfigError(f"data.num_folds={num_folds}: k-fold needs at least 2 folds (or leave it unset).")
    if not 0 <= fold < num_folds:
        raise ConfigError(f"data.fold={fold}: must be in 0..{num_folds - 1} for data.num_folds={num_folds}.")


def fold_split(labels: torch.Tensor, num_folds: int, fold: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train_indices, val_indices) of `labels` for fold `fold` of `num_folds`.

    Each class is shuffled with `seed` and dealt round-robin into the folds (class after class, so
    fold sizes differ by at most one and every fold holds each class in proportion). The folds
    partition the data: each sample is validated on in exactly one fold.
    """
    if len(labels) < num_folds:
        raise ConfigError(f"data.num_folds={num_folds}: only {len(labels)} training samples.")
    generator = torch.Generator().manual_seed(seed)
    dealt = []
    for label in torch.unique(labels).tolist():
        members = torch.nonzero(labels == label).flatten()
        dealt.append(members[torch.randperm(len(members), generator=generator)])
    order = torch.cat(dealt)
    assignment = torch.arange(len(order)) % num_folds
    val = order[assignment == fold].sort().values
    train = order[assignment != fold].sort().values
    return train, val
