"""The project's text datamodule (CSV, TSV or JSONL of text and label) with a pretrained encoder's tokenizer.

Everything else is `TextClassificationDataModule`'s: each split tokenized once, at setup, and kept for every epoch
and the test after fit; batches padded to their longest text, texts of similar length batched together. The
tokenizer's files go into every checkpoint (the datamodule's state), so evaluating or predicting from it needs
neither the training files nor the tokenizer's folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_template.hf_models.encoders import load_tokenizer, tokenizer_files, tokenizer_from_files
from lightning_template.tasks.classification.data.text import TextClassificationDataModule


class PretrainedTokenizer:
    """A Hugging Face tokenizer with the interface of the datamodule's `WordTokenizer`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id

    def encode(self, text: str, max_length: int) -> list[int]:
        """The text's ids, with the encoder's special tokens ([CLS] ... [SEP]), at most max_length of them."""
        return self.tokenizer(text, truncation=True, max_length=max_length)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def __len__(self) -> int:
        return len(self.tokenizer)


class HFTextDataModule(TextClassificationDataModule):
    def __init__(
        self, tokenizer: str = "bert-base-uncased", max_length: int = 128, batch_size: int = 32, **kwargs: Any
    ) -> None:
        """
        Args:
            tokenizer: The encoder's tokenizer: the folder `save_pretrained` wrote (the model's --model.backbone),
                or a Hugging Face hub name.
            max_length: Texts are truncated to this many tokens, special tokens included.
            batch_size: Texts per batch on each device.
            **kwargs: The files, columns and splits of `TextClassificationDataModule` (its max_vocab and min_freq
                are unused: the tokenizer is the encoder's).
        """
        self.tokenizer_name = tokenizer
        super().__init__(max_length=max_length, batch_size=batch_size, **kwargs)

    def build_tokenizer(self) -> PretrainedTokenizer:  # type: ignore[override]
        return PretrainedTokenizer(load_tokenizer(self.tokenizer_name))

    def state_dict(self) -> dict[str, Any]:
        files = tokenizer_files(self.tokenizer.tokenizer)
        return {"tokenizer_files": files, "class_names": self.class_names, "max_length": self.max_length}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        tokenizer = PretrainedTokenizer(tokenizer_from_files(state_dict["tokenizer_files"]))
        self._learned = tokenizer, list(state_dict["class_names"])  # type: ignore[assignment]
        self.max_length = state_dict["max_length"]

    def serving_spec(self) -> dict[str, Any]:
        """How a served model reads a text, of kind `hf_text` (what reads the project's own tokenizer, kind `text`,
        refuses it): the classes, and the tokenizer as its tokenizer.json, which the `tokenizers` library runs without
        transformers or torch, truncated to max_length on the tokenizer's side, as `encode` does."""
        tokenizer = self.tokenizer.tokenizer
        return {
            "kind": "hf_text", "class_names": list(self.class_names), "max_length": self.max_length,
            "pad_id": self.pad_id, "truncation_side": tokenizer.truncation_side,
            "tokenizer": tokenizer.backend_tokenizer.to_str(),
        }  # fmt: skip
