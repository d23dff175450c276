"""Text for a language model: every fortune cookie of Debian's `fortunes` (15,000 entries, 2.5 M characters of
quotations, jokes, poems and ASCII art), or any folder of text files in the same format.

    apt-get install fortunes

Entries are split, not characters: a seeded 90/5/5 shuffle of whole entries into train, validation and test, so a
held-out fortune was never seen in part. The vocabulary (vocabulary.py) is learned from the training text: its
characters (those seen at least `min_count` times; the rest read as <unk>), or byte-level BPE subwords, plus <eos>,
which ends every entry. Training and evaluation read the
entries of a split as one stream of token ids, cut into windows of `context` tokens; the model predicts each
token from the ones before it in its window. `predict` generates text from prompts: lines of `prompts_file`, or
the openings of held-out (test) entries.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Literal, NamedTuple

import torch
from lightning import LightningDataModule
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from lightning_template.engine.errors import DataError, MissingFileError
from lightning_template.tasks.language_model.vocabulary import (
    BPEVocabulary,
    CharVocabulary,
    vocabulary_from_state,
)

FORTUNES_DIR = os.environ.get("FORTUNES_DIR") or "/usr/share/games/fortunes"  # Debian's, or the folder it names


def read_entries(folder: Path) -> list[str]:
    """The entries of every fortune file in `folder` (a file with a `.dat` index beside it), in file order: the
    text between lines holding a single '%'."""
    files = sorted(p for p in folder.glob("*") if p.is_file() and p.with_name(p.name + ".dat").is_file())
    if not files:
        raise MissingFileError(
            f"--data.corpus_dir {folder}: no fortune files (each with a .dat index). Install Debian's fortunes"
            " (`apt-get install fortunes`) or give a folder of files in that format."
        )
    entries = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        entries += [entry.strip("\n") for entry in text.split("\n%\n") if entry.strip() not in ("", "%")]
    return entries


def split_entries(entries: list[str], held_out: float, seed: int) -> dict[str, list[str]]:
    """A seeded shuffle of whole entries: `held_out` of them validate, as many test, the rest train."""
    order = list(range(len(entries)))
    random.Random(seed).shuffle(order)
    size = round(held_out * len(entries))
    parts = {"val": order[:size], "test": order[size : 2 * size], "train": order[2 * size :]}
    return {split: [entries[i] for i in indices] for split, indices in parts.items()}


class TokenWindows(Dataset):
    """Non-overlapping windows of a token stream: inputs `context` ids, targets the same shifted by one."""

    def __init__(self, stream: torch.Tensor, context: int) -> None:
        self.stream, self.context = stream, context

    def __len__(self) -> int:
        return (len(self.stream) - 1) // self.context

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.context
        window = self.stream[start : start + self.context + 1]
        return window[:-1], window[1:]


class Prompt(NamedTuple):
    index: int  # its position, which seeds its generation
    ids: torch.Tensor  # as the model reads it (characters beyond the vocabulary as <unk>)
    text: str  # as the user wrote it


class Prompts(Dataset):
    def __init__(self, prompts: list[str], vocabulary: CharVocabulary) -> None:
        self.prompts, self.vocabulary = prompts, vocabulary

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> Prompt:
        text = self.prompts[index]
        return Prompt(index, torch.tensor(self.vocabulary.encode(text) or [self.vocabulary.eos_id]), text)


def prompt_batch(samples: list[Prompt]) -> list[Prompt]:
    """Prompts of different lengths stay a list: each is generated on its own."""
    return samples


class FortunesDataModule(LightningDataModule):
    model_facts = ("vocab_size", "max_length")  # handed to the model's arguments of these names (train.py)

    def __init__(
        self,
        corpus_dir: str = FORTUNES_DIR,
        context: int = 128,
        batch_size: int = 32,
        held_out: float = 0.05,
        split_seed: int = 0,
        min_count: int = 5,
        tokenizer: Literal["chars", "bpe"] = "chars",
        bpe_vocab: int = 1024,
        num_workers: int = 0,
        prompts_file: str | None = None,
        num_prompts: int = 8,
        prompt_length: int = 24,
    ) -> None:
        """
        Args:
            corpus_dir: Folder of fortune files (entries between lines holding a single '%'; a `.dat` index beside
                each file, as `strfile` writes it).
            context: Tokens the model sees at once (its windows; linked to the model as `max_length`).
            batch_size: Windows per batch on each device.
            held_out: Share of the entries that validate, and as many that test.
            split_seed: Seed of the split of entries.
            min_count: Characters rarer than this in the training text read as <unk> (`chars`).
            tokenizer: `chars`: a token per character; `bpe`: byte-level BPE subwords (HF tokenizers, the `lm`
                group), a few characters each. Either is learned from the training text.
            bpe_vocab: Tokens of the BPE vocabulary (`bpe`).
            num_workers: DataLoader workers; 0 is fastest for windows of an in-memory stream.
            prompts_file: `predict` continues each line of this file (an empty line starts a new fortune); without
                it, the openings of held-out test entries.
            num_prompts: How many test entries give a prompt when there is no prompts_file.
            prompt_length: Characters of each test entry's opening used as its prompt.
        """
        super().__init__()
        self.save_hyperparameters()
        self.corpus_dir, self.context, self.batch_size = Path(corpus_dir), context, batch_size
        self.held_out, self.split_seed, self.min_count, self.num_workers = held_out, split_seed, min_count, num_workers
        self.tokenizer, self.bpe_vocab = tokenizer, bpe_vocab
        self.prompts_file, self.num_prompts, self.prompt_length = prompts_file, num_prompts, prompt_length
        self._splits: dict[str, list[str]] | None = None
        # From the training text, or from a checkpoint; BPEVocabulary is a CharVocabulary with subwords.
        self._vocabulary: CharVocabulary | None = None
        self._characters_per_token: dict[str, float] = {}
        self.datasets: dict[str, Dataset] = {}

    @property
    def splits(self) -> dict[str, list[str]]:
        if self._splits is None:
            self._splits = split_entries(read_entries(self.corpus_dir), self.held_out, self.split_seed)
        return self._splits

    @property
    def vocabulary(self) -> CharVocabulary:
        if self._vocabulary is None:
            train = self.splits["train"]
            self._vocabulary = (
                BPEVocabulary.train(train, self.bpe_vocab)
                if self.tokenizer == "bpe"
                else CharVocabulary.build(train, self.min_count)
            )
        return self._vocabulary

    def characters_per_token(self, split: str) -> float:
        """Characters per target token of the split's windows (1 for characters): bits per token over it are bits
        per character, the n-gram baseline's measure."""
        if split not in self._characters_per_token:
            windows = self.datasets[split]
            targets = windows.stream[1 : len(windows) * windows.context + 1]
            self._characters_per_token[split] = self.vocabulary.characters(targets) / len(targets)
        return self._characters_per_token[split]

    # Facts handed to the model (model_facts).
    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    @property
    def max_length(self) -> int:
        return self.context

    def state_dict(self) -> dict[str, Any]:
        """What the model was trained with (its vocabulary and context): a checkpoint alone then generates."""
        return {**self.vocabulary.state(), "context": self.context}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._vocabulary = vocabulary_from_state(state_dict)
        self.tokenizer = state_dict.get("tokenizer", "chars")
        self.context = int(state_dict["context"])

    def setup(self, stage: str) -> None:
        if stage == "predict":
            prompts = self.prompts()
            if unknown := sorted(set().union(*(self.vocabulary.unknown(text) for text in prompts))):
                rank_zero_warn(
                    f"The prompts hold {len(unknown)} characters the model never saw in training, read as <unk>:"
                    f" {''.join(unknown)!r} (the predictions CSV keeps the prompts as written)."
                )
            self.datasets["predict"] = Prompts(prompts, self.vocabulary)
            return
        for split in {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}[stage]:
            if split not in self.datasets:
                self.datasets[split] = TokenWindows(self.vocabulary.stream(self.splits[split]), self.context)

    def prompts(self) -> list[str]:
        if self.prompts_file is None:
            return [entry[: self.prompt_length] for entry in self.splits["test"][: self.num_prompts]]
        path = Path(self.prompts_file)
        if not path.is_file():
            raise MissingFileError(f"--data.prompts_file {path}: file not found (one prompt per line).")
        prompts = path.read_text(encoding="utf-8").splitlines()
        if not prompts:
            raise DataError(f"--data.prompts_file {path}: the file is empty; write one prompt per line.")
        return prompts

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.datasets["train"], batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.datasets["val"], batch_size=self.batch_size, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.datasets["test"], batch_size=self.batch_size, num_workers=self.num_workers)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.datasets["predict"], batch_size=8, collate_fn=prompt_batch)
