"""How text becomes token ids: characters (`CharVocabulary`), or byte-level BPE subwords (`BPEVocabulary`, HF
`tokenizers`), both learned from the training text alone. Id 0 is <eos>, which ends every entry, id 1 <unk>.

A subword covers a few characters, so the same model and the same step see more text: measured in bits per
character, it learns more in the same time (docs/language_model.md). A vocabulary's `state()` goes into every
checkpoint, so that a checkpoint alone generates text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from lightning_template.engine.errors import ConfigError, MissingPackageError

EOS, UNK = "<eos>", "<unk>"


def _check_specials(tokens: Sequence[str]) -> None:
    """Ids 0 and 1 are <eos> and <unk> in every vocabulary: a checkpoint's that differs is another datamodule's."""
    if list(tokens[:2]) != [EOS, UNK]:
        raise ConfigError("The checkpoint's vocabulary does not start with <eos>, <unk>: not this datamodule's.")


class CharVocabulary:
    eos_id, unk_id = 0, 1

    def __init__(self, chars: Sequence[str]) -> None:
        self.tokens = [EOS, UNK, *chars]
        self.ids = {char: i for i, char in enumerate(self.tokens)}

    @classmethod
    def build(cls, texts: Sequence[str], min_count: int) -> CharVocabulary:
        """The characters seen at least `min_count` times (the rest read as <unk>)."""
        counts = Counter(char for text in texts for char in text)
        return cls(sorted(char for char, count in counts.items() if count >= min_count))

    def encode(self, text: str) -> list[int]:
        return [self.ids.get(char, self.unk_id) for char in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.tokens[i] if i > self.unk_id else ("\ufffd" if i == self.unk_id else "") for i in ids)

    def unknown(self, text: str) -> set[str]:
        """The characters of `text` read as <unk>."""
        return set(text) - self.ids.keys()

    def characters(self, ids: torch.Tensor) -> int:
        """How many characters the ids stand for (<eos> counts as one, as the n-gram baseline counts it)."""
        return len(ids)

    def state(self) -> dict[str, Any]:
        return {"tokenizer": "chars", "tokens": self.tokens}

    def stream(self, entries: Sequence[str]) -> torch.Tensor:
        """The entries as one tensor of ids, each followed by <eos>."""
        return torch.tensor([i for entry in entries for i in (*self.encode(entry), self.eos_id)], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.tokens)


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise MissingPackageError(
            "--data.tokenizer bpe needs HF `tokenizers`: uv sync --inexact --extra lm (or --data.tokenizer chars)."
        ) from None
    return tokenizers


class BPEVocabulary(CharVocabulary):
    """Byte-level BPE: any text encodes (no <unk>), merges learned from the training text up to `size` tokens."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
        _check_specials(self.tokens)

    @classmethod
    def train(cls, texts: Sequence[str], size: int) -> BPEVocabulary:
        tk = _tokenizers()
        tokenizer = tk.Tokenizer(tk.models.BPE(unk_token=UNK))
        tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(
            vocab_size=size, special_tokens=[EOS, UNK], initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )  # fmt: skip
        tokenizer.train_from_iterator(texts, trainer)
        return cls(tokenizer)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids if i != self.eos_id])

    def unknown(self, text: str) -> set[str]:
        return set()  # bytes: every character encodes

    def characters(self, ids: torch.Tensor) -> int:
        ids = ids.tolist()
        return len(self.decode(ids)) + ids.count(self.eos_id)

    def state(self) -> dict[str, Any]:
        return {"tokenizer": "bpe", "bpe": self.tokenizer.to_str()}

    def stream(self, entries: Sequence[str]) -> torch.Tensor:
        encoded = self.tokenizer.encode_batch(list(entries))
        return torch.tensor([i for entry in encoded for i in (*entry.ids, self.eos_id)], dtype=torch.long)


def vocabulary_from_state(state: dict[str, Any]) -> CharVocabulary:
    """The vocabulary a checkpoint was trained with (`state()`; a checkpoint without `tokenizer` is of characters)."""
    if state.get("tokenizer", "chars") == "bpe":
        return BPEVocabulary(_tokenizers().Tokenizer.from_str(state["bpe"]))
    _check_specials(state["tokens"])
    return CharVocabulary(list(state["tokens"])[2:])
