"""Pretraining a small encoder here, by masked-language modelling on your own texts, for `HFClassifier` to fine-tune:
a job of the project (`configs/hf_pretrain.yaml`: exact resume, checkpoints, the NaN guard), whose last weights and
tokenizer are written with `save_pretrained` into `--model.encoder_dir`, a folder `--model.backbone` takes.

The tokenizer is a WordPiece one with BERT's special tokens, trained on the training texts (none is downloaded), or
the one of `--data.tokenizer` when given. Masking is BERT's: 15 % of the tokens that are not special, of which 80 %
become [MASK], 10 % a random token and 10 % stay; it draws from torch's generator, which exact resume restores.
Validation masks with a generator of its own seeded per batch, so every validation scores the same masks.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch
from lightning import LightningModule
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from transformers import AutoConfig, AutoModelForMaskedLM, PreTrainedTokenizerFast

from lightning_template.hf_models.data import HFTextDataModule, PretrainedTokenizer
from lightning_template.tasks.optim import WarmupSchedule, optimizer_from_spec, optimizer_spec, steps_per_epoch

SPECIAL_TOKENS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                  "mask_token": "[MASK]"}  # fmt: skip


def train_wordpiece(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A lower-casing WordPiece tokenizer, [CLS] text [SEP] as BERT's: every character seen (alone and as a word's
    continuation, `##c`), then the most frequent words, ties in alphabetical order (`tokenizers`' own trainer breaks
    ties in a random order: another run, another vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer, splitter = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    counts = Counter(w for text in texts for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(text)))
    characters = sorted({c for word in counts for c in word})
    words = sorted((w for w in counts if len(w) > 1), key=lambda w: (-counts[w], w))
    pieces = [*SPECIAL_TOKENS.values(), *characters, *(f"##{c}" for c in characters), *words][:vocab_size]
    tokenizer = Tokenizer(models.WordPiece({piece: i for i, piece in enumerate(pieces)}, unk_token="[UNK]"))
    tokenizer.normalizer, tokenizer.pre_tokenizer, tokenizer.decoder = normalizer, splitter, decoders.WordPiece()
    ends = [(token, pieces.index(token)) for token in ("[CLS]", "[SEP]")]
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=ends)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS)


class MaskedTextDataModule(HFTextDataModule):
    def __init__(self, tokenizer: str | None = None, max_vocab: int = 8000, **kwargs: Any) -> None:
        """
        Args:
            tokenizer: An encoder's tokenizer (a folder or hub name); None: WordPiece built from the training texts.
            max_vocab: The size of that WordPiece vocabulary (at most).
            **kwargs: The files and batches of `HFTextDataModule` (the texts' labels, if any, are not used).
        """
        super().__init__(tokenizer=tokenizer or "", max_vocab=max_vocab, **kwargs)

    def build_tokenizer(self) -> PretrainedTokenizer:
        if self.tokenizer_name:
            return super().build_tokenizer()
        return PretrainedTokenizer(train_wordpiece([text for text, _ in self.train_records], self.max_vocab))


class MaskedLMPretraining(LightningModule):
    def __init__(
        self,
        encoder_dir: str = "models/fortunes-bert",
        family: str = "bert",
        vocab_size: int = 8000,
        pad_id: int = 0,
        max_length: int = 128,
        hidden_size: int = 128,
        num_layers: int = 4,
        num_heads: int = 4,
        intermediate_size: int = 512,
        mask_probability: float = 0.15,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        warmup_epochs: float = 1.0,
    ) -> None:
        """
        Args:
            encoder_dir: Where the encoder and its tokenizer are written (save_pretrained) when fit ends.
            family: The architecture, a model type of transformers' AutoConfig (bert, roberta, ...).
            vocab_size: Tokens of the tokenizer (linked from the datamodule).
            pad_id: The padding token's id (linked from the datamodule).
            max_length: Most tokens per text (linked from the datamodule): the encoder's positions.
            hidden_size: Width of the token representations.
            num_layers: Transformer layers.
            num_heads: Attention heads per layer.
            intermediate_size: Hidden width of each layer's MLP.
            mask_probability: Share of the (non-special) tokens the model must restore.
            optimizer: The optimizer and its settings (weight decay skips biases and norms).
            warmup_epochs: Linear warmup, then cosine decay to 0 at the last step.
        """
        super().__init__()
        self.save_hyperparameters()
        self.hparams["optimizer"] = optimizer_spec(self.hparams["optimizer"])
        self.make_optimizer = optimizer_from_spec(optimizer)
        config = AutoConfig.for_model(
            family, vocab_size=vocab_size, pad_token_id=pad_id, max_position_embeddings=max_length + pad_id + 2,
            hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
            intermediate_size=intermediate_size,
        )  # fmt: skip
        self.model = AutoModelForMaskedLM.from_config(config)

    def masked(self, tokens: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
        """(inputs, labels): BERT's masking of `tokens`; labels are -100 where nothing is to restore."""
        tokenizer = self.trainer.datamodule.tokenizer.tokenizer
        special = torch.isin(tokens, torch.tensor(tokenizer.all_special_ids, device=tokens.device))
        draw = torch.rand((3, *tokens.shape), generator=generator, device=tokens.device)
        chosen = (draw[0] < self.hparams.mask_probability) & ~special
        labels = tokens.masked_fill(~chosen, -100)
        random_tokens = (draw[2] * len(tokenizer)).long()
        inputs = torch.where(chosen & (draw[1] < 0.8), tokenizer.mask_token_id, tokens)
        inputs = torch.where(chosen & (draw[1] >= 0.9), random_tokens, inputs)
        return inputs, labels

    def loss(self, tokens: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
        inputs, labels = self.masked(tokens, generator)
        output = self.model(input_ids=inputs, attention_mask=(tokens != self.hparams.pad_id).long(), labels=labels)
        restored = (output.logits.argmax(-1) == labels)[labels != -100].float().mean()
        return output.loss, restored

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, _ = self.loss(batch[0])
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, restored = self.loss(batch[0], torch.Generator(batch[0].device).manual_seed(batch_idx))
        self.log_dict({"val_loss": loss, "val_acc": restored}, prog_bar=True, batch_size=len(batch[0]))

    def configure_optimizers(self) -> dict[str, Any]:
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]  # biases, norms
        optimizer = self.make_optimizer(
            [{"params": decay, "name": "encoder"}, {"params": no_decay, "name": "no_decay", "weight_decay": 0.0}]
        )
        total = int(self.trainer.estimated_stepping_batches)
        warmup = round(self.hparams.warmup_epochs * steps_per_epoch(self.trainer))
        scheduler = WarmupSchedule(optimizer, total_steps=total, warmup_steps=warmup, schedule="cosine")
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    @rank_zero_only
    def on_train_end(self) -> None:
        folder = Path(self.hparams.encoder_dir)
        self.model.save_pretrained(folder)
        self.trainer.datamodule.tokenizer.tokenizer.save_pretrained(folder)
        rank_zero_info(f"encoder and tokenizer saved to {folder}: --model.backbone {folder} --data.tokenizer {folder}")
