"""k-fold cross-validation: folds partition the training data, stratified; the test split is untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_template.tasks.classification import (
    FashionMNISTDataModule,
    ImageFolderDataModule,
    TextClassificationDataModule,
)
from lightning_template.tasks.classification.data.folds import fold_split
from lightning_template.tasks.classification.data.idx import read_idx


def test_folds_partition_real_labels_stratified_and_seeded(fashion_mnist_dir: Path) -> None:
    labels = read_idx(fashion_mnist_dir / "train-labels-idx1-ubyte.gz").long()
    folds = [fold_split(labels, 3, i, seed=1234) for i in range(3)]
    vals = [set(val.tolist()) for _, val in folds]
    for (train, _), val in zip(folds, vals, strict=True):
        assert not val & set(train.tolist())  # a fold's validation samples never train
        assert len(val) + len(train) == len(labels)
    assert set().union(*vals) == set(range(len(labels))) and sum(map(len, vals)) == len(labels)  # a partition
    for _, val in folds:  # stratified: each class in proportion, within one sample
        counts = torch.bincount(labels[val], minlength=10)
        assert (counts - torch.bincount(labels, minlength=10) / 3).abs().max() <= 1
    assert torch.equal(fold_split(labels, 3, 1, seed=1234)[1], folds[1][1])  # same seed, same folds
    assert not torch.equal(fold_split(labels, 3, 1, seed=7)[1], folds[1][1])


@pytest.mark.slow
def test_in_memory_folds_replace_the_holdout_and_leave_test_alone(fashion_mnist_dir: Path) -> None:
    plain = FashionMNISTDataModule(data_dir=str(fashion_mnist_dir))
    plain.setup("fit")
    dm = FashionMNISTDataModule(data_dir=str(fashion_mnist_dir), num_folds=4, fold=3)
    dm.setup("fit")
    assert (len(dm.splits["train"]), len(dm.splits["val"])) == (45000, 15000)
    assert torch.equal(dm.splits["test"].images, plain.splits["test"].images)


def test_image_folder_folds_come_from_train_and_never_overlap(image_tree: Path) -> None:
    all_train = {p for p in (image_tree / "train").rglob("*.png")}
    seen_val: set[str] = set()
    for fold in range(3):
        dm = ImageFolderDataModule(root=str(image_tree), image_size=28, num_folds=3, fold=fold, num_workers=0)
        dm.setup("fit")
        train = {path for path, _ in dm.splits["train"].samples}
        val = {path for path, _ in dm.splits["val"].samples}
        assert not train & val and {Path(p) for p in train | val} == all_train
        assert dm.splits["val"].transform is dm.eval_transform  # no random crops on the validation fold
        assert not val & seen_val
        seen_val |= val
    assert len(seen_val) == len(all_train)


def test_text_folds_build_the_vocabulary_from_training_folds_only(tmp_path: Path) -> None:
    records = [{"text": f"common word{i}", "label": "ab"[i % 2]} for i in range(30)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    held_out = []
    for fold in range(3):
        dm = TextClassificationDataModule(train_file=str(tmp_path / "train.jsonl"), num_folds=3, fold=fold, min_freq=1)
        val_words = {r[0].split()[1] for r in dm.held_out_records}
        assert len(dm.held_out_records) == 10 and not val_words & set(dm.tokenizer.vocab)
        assert {r[1] for r in dm.held_out_records} == {"a", "b"}  # stratified by label
        held_out += [r[0] for r in dm.held_out_records]
    assert sorted(held_out) == sorted(r["text"] for r in records)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_folds": 1}, "data.num_folds=1: k-fold needs at least 2 folds"),
        ({"num_folds": 3, "fold": 3}, "data.fold=3: must be in 0..2"),
        ({"fold": 2}, "data.fold=2 needs data.num_folds"),
    ],
)
def test_bad_fold_options_are_refused_at_construction(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        FashionMNISTDataModule(**kwargs)
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        ImageFolderDataModule(**kwargs)
