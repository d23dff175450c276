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
    """A WordPiece tokenizer (BERT's special tokens) or a byte-level BPE one (RoBERTa's), trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if family == "roberta":
        specials = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                    "cls_token": "<s>", "sep_token": "</s>", "mask_token": "<mask>"}  # fmt: skip
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tokenizer.decoder = decoders.ByteLevel()
        order = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids: padding is 1
        trainer = trainers.BpeTrainer(
            vocab_size=300, special_tokens=order, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        first, last = "<s>", "</s>"
    else:
        specials = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                    "mask_token": "[MASK]"}  # fmt: skip
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        order = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=order)
        first, last = "[CLS]", "[SEP]"
    tokenizer.train_from_iterator(texts, trainer)
    ids = {token: tokenizer.token_to_id(token) for token in (first, last)}
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}", special_tokens=list(ids.items())
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **specials)


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
