"""Any Hugging Face encoder (BERT, DistilBERT, RoBERTa, DeBERTa, ModernBERT, ...) as a text classifier of this
project: its tokens pooled by the family's convention, a new head for the data's classes, two-stage fine-tuned
(`TwoStageFinetuning`) or with LoRA (`--model.lora_rank 8`), like every model here.

The encoder answers the project's network seam (`tasks/classification/models/seam.py`): the head is the classifier,
`backbone_parameters()` is the encoder's (or, with LoRA, the adapters' alone: the encoder's own weights stay frozen).
The batch is the text datamodule's: token ids padded with the tokenizer's padding id, which the attention masks out.
A checkpoint holds the encoder's configuration (hyper-parameter `encoder`) and the datamodule the tokenizer's files,
so `validate`, `test` and `predict --ckpt_path <file>` rebuild both without the backbone's folder.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import AutoConfig

from lightning_template.engine.errors import ConfigError
from lightning_template.hf_models.encoders import (
    default_lora_targets,
    default_pooling,
    encoder_config,
    load_encoder,
)
from lightning_template.tasks.classification.models.base import ClassificationModule, one_sequence
from lightning_template.tasks.classification.models.seam import ClassifierNet

# RoBERTa's family numbers positions after the padding id: that many fewer positions for tokens.
POSITION_OFFSET_FAMILIES = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert"}


class HFNet(ClassifierNet):
    classifier_name = "head"

    def __init__(self, encoder: nn.Module, num_classes: int, pooling: str, pad_id: int) -> None:
        super().__init__()
        self.encoder, self.pooling, self.pad_id = encoder, pooling, pad_id
        self.head = nn.Linear(encoder.config.hidden_size, num_classes)

    def forward_features(self, inputs: torch.Tensor) -> torch.Tensor:
        mask = inputs != self.pad_id
        hidden = self.encoder(input_ids=inputs, attention_mask=mask.long()).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]
        keep = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return features if pre_logits else self.head(features)

    def backbone_parameters(self) -> list[nn.Parameter]:
        adapters = [p for name, p in self.encoder.named_parameters() if "lora_" in name]
        return adapters or super().backbone_parameters()

    def merged(self) -> HFNet:
        """With LoRA, a copy whose encoder has the adapters merged into its weights (peft's merge_and_unload): the
        plain encoder, as fast as one never adapted."""
        if not isinstance(self.encoder, PeftModel):
            return self
        merged = copy.deepcopy(self)
        merged.encoder = merged.encoder.merge_and_unload()
        return merged


class HFClassifier(ClassificationModule):
    def __init__(
        self,
        num_classes: int = 2,
        backbone: str = "bert-base-uncased",
        weights: str | None = "backbone",
        pooling: Literal["auto", "cls", "mean"] = "auto",
        vocab_size: int | None = None,
        pad_id: int | None = None,
        max_length: int = 128,
        lora_rank: int = 0,
        lora_alpha: float = 16.0,
        lora_dropout: float = 0.1,
        lora_targets: list[str] | None = None,
        encoder: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            num_classes: Number of output classes (linked from the datamodule).
            backbone: The encoder: a folder written by `save_pretrained` (config.json, the weights; its tokenizer is
                the datamodule's --data.tokenizer), or a Hugging Face hub name (from the cache, else downloaded).
            weights: The encoder's trained weights: `backbone` (its own), another folder of the same architecture,
                or null: the architecture freshly initialized (training from scratch).
            pooling: `cls` (the first token), `mean` (of the non-padding tokens), or `auto`: the family's own (cls
                for BERT, DistilBERT, RoBERTa and their kin; the config's classifier_pooling; mean otherwise).
            vocab_size: Tokens of the tokenizer (linked from the datamodule): checked against the encoder's.
            pad_id: The padding token's id (linked from the datamodule), masked out of the attention.
            max_length: Most tokens per text (linked from the datamodule): checked against the positions.
            lora_rank: LoRA's rank; 0: no LoRA (the whole encoder is trained, or unfrozen by TwoStageFinetuning).
            lora_alpha: LoRA's scale numerator (the update is scaled by lora_alpha / lora_rank).
            lora_dropout: Dropout on LoRA's input.
            lora_targets: The modules LoRA adapts; None: the attention's query and value of the family.
            encoder: The encoder's configuration, set by the model itself (what a checkpoint rebuilds it from).
            **kwargs: Optimizer and schedule settings of `ClassificationModule`.
        """
        config = AutoConfig.for_model(**encoder) if encoder else encoder_config(backbone)
        check_sizes(config, backbone, vocab_size, max_length)
        model = load_encoder(backbone if weights == "backbone" else str(weights), config, weights is not None)
        if lora_rank:
            targets = lora_targets or default_lora_targets(config, backbone)
            lora = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=targets)
            model = get_peft_model(model, lora)
        chosen = default_pooling(config) if pooling == "auto" else pooling
        pad = config.pad_token_id if pad_id is None else pad_id
        super().__init__(HFNet(model, num_classes, chosen, pad), weights=weights, **kwargs)
        self.example_input_array = one_sequence(max_length, pad)  # one text: the summary's FLOPs and sizes
        self.hparams["encoder"] = config.to_diff_dict()

    def load_weights(self, weights: str) -> None:
        """Nothing left to load: the encoder was loaded from `weights` (`encoders.load_encoder`)."""


def check_sizes(config: Any, backbone: str, vocab_size: int | None, max_length: int) -> None:
    """The tokenizer's ids and the texts' length fit the encoder's embeddings."""
    if vocab_size is not None and vocab_size > config.vocab_size:
        raise ConfigError(
            f"--data.tokenizer has {vocab_size} tokens, the encoder --model.backbone {backbone} {config.vocab_size}:"
            " give the tokenizer saved with the encoder (the same folder)."
        )
    positions = getattr(config, "max_position_embeddings", None)
    if positions and config.model_type in POSITION_OFFSET_FAMILIES:
        positions -= config.pad_token_id + 1
    if positions and max_length > positions:
        raise ConfigError(
            f"--data.max_length {max_length}: the encoder {backbone} has positions for {positions} tokens; set"
            f" --data.max_length {positions} or less."
        )
