"""Hugging Face encoders (the hf extra): tiny random BERT, DistilBERT and RoBERTa encoders with tokenizers trained
here, saved by save_pretrained, on real fortunes. Each is two-stage fine-tuned (with and without LoRA), resumes
exactly after a SIGTERM in either stage, and predicts from its checkpoint alone; what cannot work is refused in one
line."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from huggingface_hub import constants
from lightning import Trainer, seed_everything
from lightning.pytorch.utilities.model_summary import summarize

from lightning_template.engine import ResumeCheckpoint, exact_resume
from lightning_template.engine.cli import ProjectCLI
from lightning_template.engine.errors import ProjectError
from lightning_template.hf_models import HFClassifier, HFTextDataModule, MaskedLMPretraining, MaskedTextDataModule
from lightning_template.tasks.classification import TwoStageFinetuning
from lightning_template.tasks.classification.models.pretrained import PROXY_VARIABLES

from tests.conftest import ROOT
from tests.helpers import SignalAtBatch, same_state
from tests.hf_models.encoders import FAMILIES, saved_encoder


@pytest.fixture(scope="module")
def encoders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("encoders")


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory, fortunes_dir: Path) -> Path:
    """48 training and 16 validation fortunes of the three topics: 6 batches of 8 an epoch."""
    folder = tmp_path_factory.mktemp("texts")
    for split, count in (("train", 48), ("val", 16)):
        lines = (fortunes_dir / f"{split}.jsonl").read_text().splitlines()[:count]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def data(encoder: Path, texts: Path) -> HFTextDataModule:
    files = {f"{split}_file": str(texts / f"{split}.jsonl") for split in ("train", "val")}
    return HFTextDataModule(tokenizer=str(encoder), max_length=32, batch_size=8, **files)


def fit(encoder: Path, texts: Path, directory: Path, *callbacks: Any, lora: int = 0, ckpt_path: Path | None = None):
    datamodule = data(encoder, texts)
    seed_everything(3)
    model = HFClassifier(
        num_classes=datamodule.num_classes, backbone=str(encoder), vocab_size=datamodule.vocab_size,
        pad_id=datamodule.pad_id, max_length=32, lora_rank=lora, warmup_epochs=0.5,
    )  # fmt: skip
    trainer = Trainer(
        max_epochs=2, limit_train_batches=3, limit_val_batches=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True, num_sanity_val_steps=0,
        callbacks=[*exact_resume(), ResumeCheckpoint(dirpath=directory), TwoStageFinetuning(unfreeze_at_epoch=1,
                   backbone_warmup_epochs=0.5), *callbacks],
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer, model


def trained(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> set[str]:
    return {name for name in before if not torch.equal(before[name], after[name])}


def check_stages_and_resume(encoder: Path, texts: Path, tmp_path: Path, lora: int) -> None:
    """Stage 1 trains the head alone; stage 2 the encoder too (with LoRA: its adapters alone); a SIGTERM in the
    middle of either stage, then the resume, ends bitwise where the uninterrupted run ends."""
    seed_everything(3)
    start = {
        k: v.clone() for k, v in HFClassifier(backbone=str(encoder), num_classes=3, lora_rank=lora).state_dict().items()
    }
    full_trainer, full = fit(encoder, texts, tmp_path / "full", lora=lora)
    moved, parameters = trained(start, full.state_dict()), {f"net.{name}" for name, _ in full.net.named_parameters()}
    adapters = {name for name in parameters if "lora_" in name}
    # With LoRA the encoder's own weights stay the folder's: the adapters and the head train; otherwise everything.
    assert moved == (adapters | {"net.head.weight", "net.head.bias"} if lora else parameters)
    for epoch in (0, 1):
        directory = tmp_path / f"stage-{epoch + 1}"
        with contextlib.suppress(SystemExit):  # Lightning's graceful stop
            fit(encoder, texts, directory, SignalAtBatch(epoch, 1, signal.SIGTERM), lora=lora)
        resumed_trainer, resumed = fit(encoder, texts, directory, lora=lora, ckpt_path=directory / "last.ckpt")
        assert same_state(full.state_dict(), resumed.state_dict()), f"stage {epoch + 1}"
        groups = [(g["name"], g["lr"]) for g in resumed_trainer.optimizers[0].param_groups]
        assert groups == [(g["name"], g["lr"]) for g in full_trainer.optimizers[0].param_groups]


def cli_run(*args: str) -> None:
    ProjectCLI(args=[*args, "--trainer.enable_progress_bar=false"])


@pytest.mark.slow
@pytest.mark.parametrize("lora", [0, 4])
@pytest.mark.parametrize("family", FAMILIES)
def test_two_stages_and_lora_train_what_they_should_and_resume_exactly_after_sigterm(
    family: str, lora: int, encoders: Path, texts: Path, tmp_path: Path
) -> None:
    check_stages_and_resume(saved_encoder(family, encoders), texts, tmp_path, lora)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_predicts_and_validates_from_its_checkpoint_alone(
    family: str, encoders: Path, texts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's run, then `predict|validate --ckpt_path <file>` with the encoder's folder gone: the checkpoint's
    tokenizer and encoder configuration, the same predictions."""
    monkeypatch.chdir(tmp_path)
    encoder = shutil.copytree(saved_encoder(family, encoders), tmp_path / "encoder")
    files = [f"--data.{split}_file={texts / f'{split}.jsonl'}" for split in ("train", "val")]
    cli_run(
        "fit", f"--config={ROOT / 'configs/hf_fortunes.yaml'}", f"--model.backbone={encoder}",
        f"--data.tokenizer={encoder}", *files, "--data.test_file=null", "--test_after_fit=false",
        "--trainer.max_epochs=2", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
        "--data.batch_size=8", "--data.max_length=32",
        "--trainer.callbacks.init_args.unfreeze_at_epoch=1",
    )  # fmt: skip
    checkpoint = next((tmp_path / "logs").glob("hf_fortunes/version_0/checkpoints/last.ckpt"))
    inputs = tmp_path / "texts.txt"
    inputs.write_text("Computers are faster than ever.\nThe captain beamed down.\n")
    predict = ["predict", f"--ckpt_path={checkpoint}"]
    job = [
        f"--config={ROOT / 'configs/hf_fortunes.yaml'}",
        f"--model.backbone={encoder}",
        f"--data.tokenizer={encoder}",
    ]
    cli_run(*predict, *job, *files, f"--data.predict_file={inputs}", "--predictions.output_file=with-folder.csv")
    shutil.rmtree(encoder)
    cli_run(*predict, f"--data.predict_file={inputs}", "--predictions.output_file=alone.csv")
    cli_run("validate", f"--ckpt_path={checkpoint}")
    rows = (tmp_path / "alone.csv").read_text()
    assert rows == (tmp_path / "with-folder.csv").read_text() and len(rows.splitlines()) == 3


def test_pooling_and_lora_targets_follow_the_family(encoders: Path) -> None:
    for family, pooling, target in (
        ("bert", "cls", "query"),
        ("distilbert", "cls", "q_lin"),
        ("roberta", "cls", "value"),
    ):
        model = HFClassifier(backbone=str(saved_encoder(family, encoders)), num_classes=3, lora_rank=2)
        assert model.net.pooling == pooling
        assert any(f"{target}.lora_A" in name for name, _ in model.named_parameters())
    mean = HFClassifier(backbone=str(saved_encoder("bert", encoders)), num_classes=3, pooling="mean")
    assert mean.net.pooling == "mean"


def refusal(build: Any) -> str:
    with pytest.raises(ProjectError) as refused:
        build()
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_what_cannot_work_is_refused_in_one_line(
    encoders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import GPT2Config

    bert = saved_encoder("bert", encoders)
    decoder = tmp_path / "gpt2"
    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(decoder)
    message = refusal(lambda: HFClassifier(backbone=str(decoder)))
    assert message.startswith(f"--model.backbone {decoder}: a gpt2 model, not an encoder")
    no_tokenizer = tmp_path / "no-tokenizer"
    shutil.copytree(bert, no_tokenizer, ignore=shutil.ignore_patterns("tokenizer*"))
    message = refusal(lambda: HFTextDataModule(tokenizer=str(no_tokenizer)).build_tokenizer())
    assert f"--data.tokenizer {no_tokenizer}: no tokenizer files (tokenizer.json" in message
    (tmp_path / "no-config").mkdir()
    message = refusal(lambda: HFClassifier(backbone=str(tmp_path / "no-config")))
    assert "no config.json in the folder" in message
    message = refusal(lambda: HFClassifier(backbone=str(bert), max_length=512))
    assert "--data.max_length 512: the encoder" in message and "positions for 132 tokens" in message
    message = refusal(lambda: HFClassifier(backbone=str(bert), vocab_size=10_000))
    assert "--data.tokenizer has 10000 tokens" in message

    # A hub name, offline and not in the cache: where to put the files.
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    message = refusal(lambda: HFClassifier(backbone="google-bert/bert-base-uncased"))
    assert "--model.backbone google-bert/bert-base-uncased: no such folder, not in the Hugging Face cache" in message
    assert "hf download google-bert/bert-base-uncased --local-dir models/bert-base-uncased" in message


def test_a_checkpoint_carries_the_tokenizer_and_the_encoder_configuration(encoders: Path, texts: Path) -> None:
    encoder = saved_encoder("roberta", encoders)
    datamodule = data(encoder, texts)
    state = json.loads(json.dumps(datamodule.state_dict(), default=lambda b: b.decode()))
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(state["tokenizer_files"])
    restored = HFTextDataModule(tokenizer="elsewhere")
    restored.load_state_dict(datamodule.state_dict())
    text = "Beam me up, Scotty!"
    assert restored.tokenizer.encode(text, 32) == datamodule.tokenizer.encode(text, 32) and restored.pad_id == 1
    model = HFClassifier(backbone=str(encoder), num_classes=3)
    again = HFClassifier(backbone="elsewhere", encoder=model.hparams.encoder, weights=None, num_classes=3)
    assert again.state_dict().keys() == model.state_dict().keys() and again.net.pooling == "cls"


def pretrain(texts: Path, directory: Path, *callbacks: Any, ckpt_path: Path | None = None):
    files = {f"{split}_file": str(texts / f"{split}.jsonl") for split in ("train", "val")}
    datamodule = MaskedTextDataModule(max_vocab=200, max_length=32, batch_size=8, **files)
    seed_everything(3)
    model = MaskedLMPretraining(
        encoder_dir=str(directory / "encoder"), vocab_size=datamodule.vocab_size, pad_id=datamodule.pad_id,
        max_length=32, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
    )  # fmt: skip
    trainer = Trainer(
        max_epochs=2, limit_train_batches=3, limit_val_batches=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True, num_sanity_val_steps=0,
        callbacks=[*exact_resume(), ResumeCheckpoint(dirpath=directory), *callbacks],
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return model


@pytest.mark.slow
def test_pretraining_resumes_exactly_and_writes_the_encoder_the_classifier_takes(texts: Path, tmp_path: Path) -> None:
    full = pretrain(texts, tmp_path / "full")
    directory = tmp_path / "stopped"
    with contextlib.suppress(SystemExit):  # Lightning's graceful stop
        pretrain(texts, directory, SignalAtBatch(1, 1, signal.SIGTERM))
    resumed = pretrain(texts, directory, ckpt_path=directory / "last.ckpt")
    assert same_state(full.state_dict(), resumed.state_dict())
    folder = tmp_path / "full" / "encoder"
    classifier = HFClassifier(backbone=str(folder), num_classes=3, max_length=32)
    encoder, pretrained = classifier.net.encoder.state_dict(), full.model.bert.state_dict()
    assert encoder.keys() <= pretrained.keys() and all(torch.equal(encoder[k], pretrained[k]) for k in encoder)
    tokenizer = HFTextDataModule(tokenizer=str(folder)).build_tokenizer()
    assert tokenizer.encode("Computers are fast.", 32)[0] == tokenizer.tokenizer.cls_token_id


@pytest.mark.parametrize(
    ("flags", "lora", "pretrained"),
    [
        ([f"--config={ROOT / 'configs/presets/hf_lora.yaml'}"], 8, True),
        (["--model.weights=null", "--trainer.callbacks=[]"], 0, False),
    ],
    ids=["lora", "scratch"],
)
def test_the_job_takes_lora_or_trains_from_scratch_in_one_flag(
    flags: list[str], lora: int, pretrained: bool, encoders: Path, texts: Path, tmp_path: Path, monkeypatch
) -> None:
    """LoRA in place of two stages (configs/presets/hf_lora.yaml), and the same encoder freshly initialized."""
    monkeypatch.chdir(tmp_path)
    encoder = saved_encoder("bert", encoders)
    files = [f"--data.{split}_file={texts / f'{split}.jsonl'}" for split in ("train", "val")]
    job = [
        f"--config={ROOT / 'configs/hf_fortunes.yaml'}",
        f"--model.backbone={encoder}",
        f"--data.tokenizer={encoder}",
    ]
    cli = ProjectCLI(args=[*job, *files, *flags, "--trainer.logger=false"], run=False)
    assert cli.model.hparams.lora_rank == lora and not any(
        isinstance(c, TwoStageFinetuning) for c in cli.trainer.callbacks
    )
    from transformers import AutoModel

    saved = AutoModel.from_pretrained(encoder).state_dict()
    weight = "embeddings.word_embeddings.weight"
    built = {k.removeprefix("base_model.model."): v for k, v in cli.model.net.encoder.state_dict().items()}
    assert torch.equal(built[weight], saved[weight]) is pretrained


def test_the_model_summary_counts_the_flops_of_one_text(encoders: Path) -> None:
    model = HFClassifier(backbone=str(saved_encoder("bert", encoders)), num_classes=3, max_length=32)
    assert model.example_input_array.shape == (1, 32) and summarize(model).total_flops > 0
