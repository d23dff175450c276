"""The transformer classifier: attention math, padding masks, tokenizer, text data, predict."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from lightning import seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_template.tasks.classification import TransformerClassifier
from lightning_template.tasks.classification.data.text import (
    BucketSampler,
    TextClassificationDataModule,
    WordTokenizer,
)
from lightning_template.tasks.classification.models.transformer import MultiHeadSelfAttention


@pytest.mark.parametrize("use_sdpa", [True, False], ids=["sdpa", "explicit"])
def test_attention_matches_torch_multihead_attention(use_sdpa: bool) -> None:
    torch.manual_seed(0)
    reference = torch.nn.MultiheadAttention(48, num_heads=6, batch_first=True).eval()
    ours = MultiHeadSelfAttention(48, num_heads=6, use_sdpa=use_sdpa).eval()
    ours.qkv.load_state_dict({"weight": reference.in_proj_weight, "bias": reference.in_proj_bias})
    ours.proj.load_state_dict(reference.out_proj.state_dict())
    x = torch.randn(4, 9, 48)
    padding = torch.zeros(4, 9, dtype=torch.bool)
    padding[1, 6:] = padding[3, 2:] = True
    expected, _ = reference(x, x, x, key_padding_mask=padding)
    torch.testing.assert_close(ours(x, padding), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours(x), reference(x, x, x)[0], atol=1e-5, rtol=1e-5)


def test_masked_position_cannot_leak_into_others() -> None:
    torch.manual_seed(0)
    attention = MultiHeadSelfAttention(32, num_heads=4).eval()
    x = torch.randn(2, 6, 32)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[:, 4] = True
    changed = x.clone()
    changed[:, 4] = 1e4 * torch.randn(2, 32)  # anything at the masked position
    torch.testing.assert_close(
        attention(changed, padding)[:, [0, 1, 2, 3, 5]], attention(x, padding)[:, [0, 1, 2, 3, 5]]
    )
    assert not torch.allclose(attention(changed)[:, 0], attention(x)[:, 0])  # unmasked, it would leak


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_appending_padding_does_not_change_logits(pooling: str) -> None:
    torch.manual_seed(0)
    model = TransformerClassifier(
        num_classes=3, vocab_size=50, pad_id=0, max_length=32, dim=32, depth=2, pooling=pooling
    )
    model.eval()
    tokens = torch.tensor([[5, 9, 13, 2, 7]])
    padded = torch.cat([tokens, torch.zeros(1, 8, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded), model(tokens), atol=1e-5, rtol=1e-5)
        batch = torch.tensor([[5, 9, 13, 2, 7], [4, 4, 0, 0, 0]])  # in a batch with a shorter sequence
        torch.testing.assert_close(model(batch)[0], model(tokens)[0], atol=1e-5, rtol=1e-5)


def test_patch_input_for_images() -> None:
    model = TransformerClassifier(num_classes=10, input_shape=(1, 28, 28), patch_size=7, dim=32, depth=1)
    assert model(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    with pytest.raises(ValueError, match="not divisible by patch_size=5"):
        TransformerClassifier(input_shape=(1, 28, 28), patch_size=5)


def test_tokenizer_round_trips_known_words() -> None:
    texts = ["The cat sat on the mat.", "A dog sat, then the dog ran!"]
    tokenizer = WordTokenizer.build(texts, max_vocab=100, min_freq=1)
    ids = tokenizer.encode("The dog sat on the mat!", max_length=50)
    assert tokenizer.decode(ids) == "the dog sat on the mat !"
    assert tokenizer.encode("zebra", 5) == [tokenizer.unk_id]
    assert len(tokenizer.encode(" ".join(["cat"] * 40), max_length=16)) == 16
    assert tokenizer.vocab[:2] == ["<pad>", "<unk>"] and tokenizer.vocab[2] == "the"  # most frequent first


def test_bucketing_shards_ranks_and_cuts_padding() -> None:
    lengths = [int(x) for x in torch.randint(1, 120, (1000,), generator=torch.Generator().manual_seed(0))]
    per_rank = [list(BucketSampler(lengths, 16, 50, seed=3, shard=(2, r))) for r in (0, 1)]
    assert math.ceil(len(per_rank[0]) / 16) == math.ceil(len(per_rank[1]) / 16) == 32  # steps per rank: equal
    assert set(per_rank[0]) | set(per_rank[1]) == set(range(1000))

    def padding_waste(order: list[int]) -> float:
        batches = [order[i : i + 16] for i in range(0, len(order), 16)]
        return sum(max(lengths[j] for j in b) * len(b) - sum(lengths[j] for j in b) for b in batches) / sum(lengths)

    bucketed = list(BucketSampler(lengths, 16, 50, seed=3))
    shuffled = torch.randperm(1000, generator=torch.Generator().manual_seed(3)).tolist()
    assert padding_waste(bucketed) < 0.2 * padding_waste(shuffled)
    sampler = BucketSampler(lengths, 16, 50, seed=3)
    sampler.set_epoch(1)
    assert list(sampler) != bucketed  # a new order every epoch ...
    sampler.set_epoch(0)
    assert list(sampler) == bucketed  # ... that depends only on (seed, epoch)


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_text_file_errors_name_the_file_and_fix(tmp_path: Path) -> None:
    train = _write_jsonl(tmp_path / "train.jsonl", [{"sentence": "hello there", "label": "greeting"}])
    with pytest.raises(ValueError, match=r"train\.jsonl:1: the record has no column \['text'\].*--data.text_column"):
        TextClassificationDataModule(train_file=str(train))
    train = _write_jsonl(tmp_path / "train.jsonl", [{"text": "hello there", "label": "greeting"}])
    val = _write_jsonl(tmp_path / "val.jsonl", [{"text": "bye", "label": "farewell"}])
    dm = TextClassificationDataModule(train_file=str(train), val_file=str(val))
    with pytest.raises(ValueError, match=r"val\.jsonl: labels \['farewell'\] do not occur in the training labels"):
        dm.setup("fit")


@pytest.mark.parametrize(
    ("name", "content", "line"),
    [
        ("short_row.csv", "text,label\nhello there,greeting\nbye now\nsee you,farewell\n", 3),
        ("empty_cell.csv", "text,label\nhello there,greeting\nsee you,farewell\nbye now, \n", 4),
        ("empty_cell.tsv", "text\tlabel\nhello there\tgreeting\nbye now\t\n", 3),
        ("null.jsonl", '{"text": "hi", "label": "greeting"}\n\n{"text": "bye", "label": null}\n', 3),
    ],
    ids=["short_csv_row", "empty_csv_cell", "empty_tsv_cell", "jsonl_null"],
)
def test_a_record_without_label_is_refused_by_file_and_line(tmp_path: Path, name: str, content: str, line: int) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=rf"{name}:{line}: 'label' is missing or empty"):
        TextClassificationDataModule(train_file=str(tmp_path / name))


def test_a_label_that_is_a_json_number_is_a_class(tmp_path: Path) -> None:
    train = _write_jsonl(tmp_path / "train.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 1}])
    assert TextClassificationDataModule(train_file=str(train), val_file=str(train)).class_names == ["0", "1"]


def test_vocabulary_and_labels_survive_a_checkpoint(tmp_path: Path, fortunes_dir: Path, quick_trainer) -> None:
    seed_everything(0)
    dm = TextClassificationDataModule(train_file=str(fortunes_dir / "train.jsonl"), batch_size=16)
    model = TransformerClassifier(num_classes=dm.num_classes, vocab_size=dm.vocab_size, dim=32, depth=1)
    quick_trainer(callbacks=[ModelCheckpoint(dirpath=tmp_path)], limit_train_batches=3).fit(model, datamodule=dm)
    state = torch.load(next(tmp_path.glob("*.ckpt")), weights_only=True)["TextClassificationDataModule"]
    restored = TextClassificationDataModule()
    restored.load_state_dict(state)  # as train.py does when given --ckpt_path, before the model is built
    assert restored.tokenizer.vocab == dm.tokenizer.vocab and restored.class_names == ["computers", "food", "startrek"]
    text = "Star Trek's captain ate the computer"
    assert restored.tokenizer.encode(text, 20) == dm.tokenizer.encode(text, 20)
    # Resuming `fit`: the training files give the data, the checkpoint the vocabulary.
    resumed = TextClassificationDataModule(train_file=str(fortunes_dir / "train.jsonl"))
    resumed.load_state_dict(state)
    resumed.setup("fit")
    assert resumed.tokenizer.vocab == dm.tokenizer.vocab and len(resumed.splits["val"]) == len(dm.held_out_records)
