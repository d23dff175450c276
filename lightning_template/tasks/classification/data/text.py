"""Text classification from CSV, TSV or JSONL files, with a tokenizer built from the training set.

Tokenizer: word level (lower-cased words and punctuation marks), vocabulary from the
training file by frequency. It needs no network or pretrained files, and it makes
short sequences: attention cost grows with the square of the length, and a
byte-level tokenizer would make sequences ~5x longer for the same text. Words never
seen in training map to <unk>. The vocabulary and label names are saved in every
checkpoint (the datamodule's `state_dict`), so `predict` works from a checkpoint
without the training file.

Batches are padded per batch to their longest sequence, and sequences of similar
length are batched together (`BucketSampler`) so little compute is spent on padding.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning import LightningDataModule, Trainer
from torch.utils.data import DataLoader, Dataset

from lightning_template.engine.errors import ConfigError, DataError, MissingFileError
from lightning_template.engine.sampling import EpochSampler, global_seed
from lightning_template.tasks.classification.data.folds import check_fold, fold_split
from lightning_template.tasks.classification.input_spec import TOKEN_PATTERN, split_words
from lightning_template.tasks.loaders import SplitLoaders, make_loader


class WordTokenizer:
    PAD, UNK = "<pad>", "<unk>"
    pad_id, unk_id = 0, 1

    def __init__(self, vocab: Sequence[str]) -> None:
        if list(vocab[:2]) != [self.PAD, self.UNK]:
            raise ConfigError("vocab must start with <pad>, <unk>")
        self.vocab = list(vocab)
        self.ids = {word: i for i, word in enumerate(self.vocab)}

    @staticmethod
    def split(text: str) -> list[str]:
        return split_words(text)

    @classmethod
    def build(cls, texts: Sequence[str], max_vocab: int, min_freq: int) -> WordTokenizer:
        counts = Counter(word for text in texts for word in cls.split(text))
        # Most frequent first; ties broken alphabetically so the vocabulary is reproducible.
        words = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        return cls([cls.PAD, cls.UNK, *words[: max_vocab - 2]])

    def encode(self, text: str, max_length: int) -> list[int]:
        ids = [self.ids.get(word, self.unk_id) for word in self.split(text)][:max_length]
        return ids or [self.unk_id]  # an empty text still gets one token

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.vocab[i] for i in ids if i != self.pad_id)

    def __len__(self) -> int:
        return len(self.vocab)


def read_records(path: Path, text_column: str, label_column: str | None) -> list[tuple[str, str | None]]:
    """(text, label) pairs from .csv, .tsv, .jsonl or (texts only) .txt with one text per line."""
    if not path.is_file():
        raise MissingFileError(f"{path}: file not found.")
    suffix = path.suffix.lower()
    if suffix == ".txt":
        return [(line, None) for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    rows: list[tuple[int, dict[str, Any]]] = []  # (line number, record): errors point at the line
    if suffix in {".csv", ".tsv"}:
        # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8") is not part of the first column's name.
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ",")
            rows = [(reader.line_num, row) for row in reader]
    elif suffix in {".jsonl", ".json"}:
        for number, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), start=1):
            if line.strip():
                try:
                    rows.append((number, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise ConfigError(f"{path}:{number}: not a JSON object ({err}).") from err
    else:
        raise ConfigError(f"{path}: unsupported file type {suffix!r}; use .csv, .tsv, .jsonl or .txt.")
    columns = [text_column] + ([label_column] if label_column else [])
    for number, row in rows:
        missing = [c for c in columns if c not in row]
        if missing:
            raise DataError(
                f"{path}:{number}: the record has no column {missing}; it has {sorted(row)}."
                " Set --data.text_column / --data.label_column."
            )
        # A short CSV row (DictReader's None), an empty cell or JSON null would otherwise become a class "None" or "".
        blank = [c for c in columns if row[c] is None or (c == label_column and str(row[c]).strip() == "")]
        if blank:
            raise ConfigError(
                f"{path}:{number}: {blank[0]!r} is missing or empty; give every record one, or remove it."
            )
    return [(str(row[text_column]), str(row[label_column]) if label_column else None) for _, row in rows]


class EncodedTexts(Dataset):
    def __init__(self, ids: list[list[int]], labels: list[int]) -> None:
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[list[int], int]:
        return self.ids[index], self.labels[index]


class PadCollate:
    """Pads a batch to its longest sequence (a class, so DataLoader workers can pickle it)."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, batch: list[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor]:
        longest = max(len(ids) for ids, _ in batch)
        tokens = torch.full((len(batch), longest), self.pad_id, dtype=torch.long)
        for row, (ids, _) in enumerate(batch):
            tokens[row, : len(ids)] = torch.tensor(ids)
        return tokens, torch.tensor([label for _, label in batch])


class BucketSampler(EpochSampler):
    """Shuffles, then orders each window of `batch_size * multiplier` samples by length.

    Consecutive `batch_size` indices (what the DataLoader batches together) then have
    similar lengths, and the batches are shuffled so lengths do not trend within an
    epoch. The one short batch (when the data is not a multiple of the batch size) comes
    last, so every other batch is full and no sample is repeated within a batch. Whole
    batches are dealt out to ranks; the order depends only on (seed, epoch).
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        multiplier: int,
        trainer: Trainer | None = None,
        seed: int = 0,
        shard: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(lengths, batch_size, trainer, seed, shard=shard)
        self.lengths, self.multiplier = lengths, multiplier
        batches = math.ceil(len(lengths) / batch_size)
        self.batches_per_rank = math.ceil(batches / self.num_replicas)
        self.num_samples = self.batches_per_rank * batch_size  # the loader's length: batches per rank

    def epoch_indices(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        window = self.batch_size * self.multiplier
        ordered = []
        for start in range(0, len(order), window):
            ordered += sorted(order[start : start + window], key=self.lengths.__getitem__)
        batches = [ordered[i : i + self.batch_size] for i in range(0, len(ordered), self.batch_size)]
        full = [b for b in batches if len(b) == self.batch_size]
        short = [b for b in batches if len(b) < self.batch_size]
        batches = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()] + short
        # DDP needs the same number of batches on every rank: repeat whole batches, as DistributedSampler pads.
        padding = self.batches_per_rank * self.num_replicas - len(batches)
        batches += (full or short) * (padding // max(len(full or short), 1) + 1)
        batches = batches[: self.batches_per_rank * self.num_replicas]
        return [index for batch in batches[self.rank :: self.num_replicas] for index in batch]

    def __len__(self) -> int:
        return self.num_samples


class TextClassificationDataModule(SplitLoaders, LightningDataModule):
    model_facts = ("num_classes", "vocab_size", "pad_id", "max_length")  # handed to the model (train.py)

    def __init__(
        self,
        train_file: str | None = None,
        val_file: str | None = None,
        test_file: str | None = None,
        predict_file: str | None = None,
        text_column: str = "text",
        label_column: str = "label",
        val_fraction: float = 0.1,
        split_seed: int = 1234,
        num_folds: int | None = None,
        fold: int = 0,
        max_length: int = 128,
        max_vocab: int = 20000,
        min_freq: int = 2,
        batch_size: int = 64,
        bucket_multiplier: int = 50,
        num_workers: int = 0,
    ) -> None:
        """
        Args:
            train_file: Training texts and labels (.csv, .tsv or .jsonl); builds vocabulary and label set.
            val_file: Validation file; if absent, `val_fraction` of train_file is held out (fixed, seeded).
            test_file: Test file with labels.
            predict_file: Texts to classify: .txt (one per line) or a file with `text_column`.
            text_column: Column/key holding the text.
            label_column: Column/key holding the label (any string; mapped to ids in sorted order).
            val_fraction: Share of train_file held out for validation when there is no val_file.
            split_seed: Seed of that hold-out (and of the folds).
            num_folds: k-fold cross-validation: split train_file into this many folds, stratified by
                label, and validate on fold `fold` (replaces `val_fraction`; needs no val_file).
            fold: Which fold validates (0..num_folds-1); the other folds train.
            max_length: Texts are truncated to this many tokens.
            max_vocab: Vocabulary size cap (the most frequent words, plus <pad> and <unk>).
            min_freq: Words rarer than this in train_file become <unk>.
            batch_size: Sequences per batch on each device.
            bucket_multiplier: Length-sorting window, in batches (1 = no bucketing).
            num_workers: DataLoader workers; 0 is fastest for in-memory token lists.
        """
        super().__init__()
        self.save_hyperparameters()
        self.files = {"train": train_file, "val": val_file, "test": test_file, "predict": predict_file}
        self.text_column, self.label_column = text_column, label_column
        self.val_fraction, self.split_seed = val_fraction, split_seed
        check_fold(num_folds, fold)
        if num_folds is not None and val_file is not None:
            raise ConfigError("data.num_folds takes the validation folds from train_file: remove --data.val_file.")
        self.max_length = max_length
        self.max_vocab, self.min_freq = max_vocab, min_freq
        self.batch_size, self.bucket_multiplier, self.num_workers = batch_size, bucket_multiplier, num_workers
        self.splits: dict[str, EncodedTexts] = {}
        self.predict_texts: list[str] = []
        self.train_records: list[tuple[str, str | None]] = []
        self.held_out_records: list[tuple[str, str | None]] = []
        # Vocabulary and labels: learned from the training records when first asked for (train.py links them into
        # the model), or given by a checkpoint's `load_state_dict` before that (then no training file is needed).
        self._learned: tuple[WordTokenizer, list[str]] | None = None
        if train_file is not None:
            self.train_records = read_records(Path(train_file), text_column, label_column)
            if val_file is None:  # held out before the vocabulary is built: no validation word may leak into it
                held_out = self._held_out(num_folds, fold)
                records = self.train_records
                self.held_out_records = [r for i, r in enumerate(records) if i in held_out]
                self.train_records = [r for i, r in enumerate(records) if i not in held_out]

    def _learn(self) -> tuple[WordTokenizer, list[str]]:
        if self._learned is None:
            if not self.train_records:
                raise ConfigError(
                    "TextClassificationDataModule needs --data.train_file (or --ckpt_path of a trained run)."
                )
            labels = sorted({label for _, label in self.train_records + self.held_out_records})
            self._learned = self.build_tokenizer(), labels
        return self._learned

    def build_tokenizer(self) -> WordTokenizer:
        """The tokenizer learned from the training texts; a subclass may bring its own (a pretrained model's)."""
        return WordTokenizer.build([text for text, _ in self.train_records], self.max_vocab, self.min_freq)

    @property
    def tokenizer(self) -> WordTokenizer:
        return self._learn()[0]

    @property
    def class_names(self) -> list[str]:
        return self._learn()[1]

    def _held_out(self, num_folds: int | None, fold: int) -> set[int]:
        """Indices of train_file held out for validation: fold `fold`, or a seeded `val_fraction`."""
        if num_folds is not None:
            names = sorted({label for _, label in self.train_records})
            labels = torch.tensor([names.index(label) for _, label in self.train_records])
            return set(fold_split(labels, num_folds, fold, self.split_seed)[1].tolist())
        order = torch.randperm(len(self.train_records), generator=torch.Generator().manual_seed(self.split_seed))
        return set(order[: max(1, round(self.val_fraction * len(order)))].tolist())

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_id

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def state_dict(self) -> dict[str, Any]:
        return {"vocab": self.tokenizer.vocab, "class_names": self.class_names, "max_length": self.max_length}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._learned = WordTokenizer(state_dict["vocab"]), list(state_dict["class_names"])
        self.max_length = state_dict["max_length"]

    def _encode(self, records: list[tuple[str, str | None]], source: str, with_labels: bool) -> EncodedTexts:
        label_ids = {name: i for i, name in enumerate(self.class_names)}
        unknown = sorted({label for _, label in records if with_labels and label not in label_ids})
        if unknown:
            raise ConfigError(
                f"{source}: labels {unknown[:10]} do not occur in the training labels {self.class_names}."
            )
        ids = [self.tokenizer.encode(text, self.max_length) for text, _ in records]
        labels = [label_ids[label] if with_labels else -1 for _, label in records]  # type: ignore[index]
        return EncodedTexts(ids, labels)

    def _read(self, split: str, with_labels: bool = True) -> list[tuple[str, str | None]]:
        return read_records(Path(self.files[split]), self.text_column, self.label_column if with_labels else None)

    def setup(self, stage: str) -> None:
        if stage == "predict":
            if self.files["predict"] is None:
                raise ConfigError("predict needs --data.predict_file (a .txt with one text per line, or .csv/.jsonl).")
            records = self._read("predict", with_labels=False)
            self.splits["predict"] = self._encode(records, self.files["predict"], with_labels=False)
            self.predict_texts = [text for text, _ in records]
            return
        if self.train_records and "train" not in self.splits:
            self.splits["train"] = self._encode(self.train_records, self.files["train"], with_labels=True)
            if self.held_out_records:
                self.splits["val"] = self._encode(self.held_out_records, self.files["train"], with_labels=True)
        for split in ("val", "test"):
            if self.files[split] is not None and split not in self.splits:
                self.splits[split] = self._encode(self._read(split), self.files[split], with_labels=True)

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        if split not in self.splits:
            raise ConfigError(f"No {split} data: set --data.{split}_file.")
        dataset = self.splits[split]
        bucketing = None
        if shuffle:
            lengths = [len(ids) for ids in dataset.ids]
            bucketing = BucketSampler(lengths, self.batch_size, self.bucket_multiplier, self.trainer, global_seed())
        return make_loader(
            dataset,
            self.trainer,
            shuffle,
            self.batch_size,
            PadCollate(self.pad_id),
            self.num_workers,
            sampler=bucketing,
        )

    def predict_inputs(self, indices: Sequence[int]) -> list[str]:
        """The raw texts behind predicted samples, for writing predictions next to their inputs."""
        return [self.predict_texts[i] for i in indices]

    def serving_spec(self) -> dict[str, Any]:
        """How a served model reads a text: this tokenizer's vocabulary and rules (input_spec.py)."""
        tokenizer = self.tokenizer
        return {
            "kind": "text", "class_names": list(self.class_names), "vocab": tokenizer.vocab,
            "token_pattern": TOKEN_PATTERN.pattern, "lowercase": True, "max_length": self.max_length,
            "pad_id": tokenizer.pad_id, "unk_id": tokenizer.unk_id,
        }  # fmt: skip
