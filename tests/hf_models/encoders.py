"""Tiny encoders of three families as `save_pretrained` writes them, with a tokenizer trained here on a few texts:
the Hugging Face extra's tests and its job config run offline."""

from __future__ import annotations

from pathlib import Path

import torch

FAMILIES = ("bert", "distilbert", "roberta")
TEXTS = [
    "Computers are fast and programs are slow.", "The cat sat on the mat.", "Politicians promise, voters forget.",
    "Science is organized knowledge.", "Work expands to fill the time available.", "Eat your vegetables.",
]  # fmt: skip


def _tokenizer(family: str, texts: list[str]):
    """The project's WordPiece tokenizer (BERT's special tokens), or a byte-level BPE one (RoBERTa's) trained on
    `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from lightning_template.hf_models.pretraining import train_wordpiece

    if family != "roberta":
        return train_wordpiece(texts, 200)
    order = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids: padding is 1
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=300, special_tokens=order, initial_alphabet=alphabet)
    )
    ends = [(token, tokenizer.token_to_id(token)) for token in ("<s>", "</s>")]
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=ends)
    specials = dict(zip(["bos_token", "pad_token", "eos_token", "unk_token", "mask_token"], order, strict=True))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, cls_token="<s>", sep_token="</s>", **specials)


def saved_encoder(family: str, folder: Path, texts: list[str] | None = None) -> Path:
    """`folder`/<family>/: a randomly initialized tiny encoder (2 layers of width 32) of `family` (seeded) and its
    tokenizer, both written by save_pretrained."""
    from transformers import AutoConfig, AutoModel

    target = folder / family
    if (target / "config.json").is_file():
        return target
    tokenizer = _tokenizer(family, texts or TEXTS)
    sizes = {"bert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
             "roberta": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
             "distilbert": dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64)}  # fmt: skip
    config = AutoConfig.for_model(
        family, vocab_size=len(tokenizer), max_position_embeddings=132, pad_token_id=tokenizer.pad_token_id,
        **sizes[family],
    )  # fmt: skip
    with torch.random.fork_rng():  # the caller's random stream must not depend on whether the folder existed
        torch.manual_seed(5)
        AutoModel.from_config(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
