"""Two-stage fine-tuning through the model seam: ResNet (BatchNorm), ViT, resume, DDP and fp16."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_template.engine import ResumeCheckpoint, ThawedParameterSync, exact_resume
from lightning_template.engine.cli import ProjectCLI
from lightning_template.engine.errors import ConfigError
from lightning_template.tasks.classification import (
    FashionMNISTDataModule,
    ResNetClassifier,
    SimpleCNN,
    TransformerClassifier,
    TwoStageFinetuning,
)

from tests.conftest import ROOT, save_random_weights
from tests.helpers import StopAfterEpoch, event_tags, same_state


@pytest.fixture(scope="module")
def resnet_weights(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(save_random_weights(ResNetClassifier, tmp_path_factory.mktemp("w") / "resnet18.pth"))


def _resnet_fit(
    quick_trainer, weights: str, finetuning: TwoStageFinetuning, max_epochs: int, *callbacks, ckpt_path=None, **kw
) -> tuple[Trainer, ResNetClassifier]:
    seed_everything(0)
    model = ResNetClassifier(input_shape=(1, 28, 28), weights=weights, **kw.pop("model", {}))
    trainer = quick_trainer(
        max_epochs=max_epochs, log_every_n_steps=1, callbacks=[finetuning, *exact_resume(), *callbacks], **kw
    )
    trainer.fit(model, datamodule=FashionMNISTDataModule(batch_size=32), ckpt_path=ckpt_path)
    return trainer, model


def _frozen_part(model: LightningModule) -> dict[str, torch.Tensor]:
    classifier = model.net.classifier_name
    return {k: v.clone() for k, v in model.net.state_dict().items() if not k.startswith(f"{classifier}.")}


@pytest.mark.slow
def test_stage_one_leaves_backbone_and_batchnorm_bitwise_unchanged(quick_trainer, resnet_weights) -> None:
    before = _frozen_part(ResNetClassifier(input_shape=(1, 28, 28), weights=resnet_weights))
    _, model = _resnet_fit(quick_trainer, resnet_weights, TwoStageFinetuning(unfreeze_at_epoch=5), 2)
    after = _frozen_part(model)
    assert any("running_mean" in k for k in after)  # BatchNorm buffers are part of the check
    assert same_state(before, after)


@pytest.mark.slow
def test_train_bn_lets_batchnorm_statistics_move(quick_trainer, resnet_weights) -> None:
    before = _frozen_part(ResNetClassifier(input_shape=(1, 28, 28), weights=resnet_weights))
    _, model = _resnet_fit(quick_trainer, resnet_weights, TwoStageFinetuning(unfreeze_at_epoch=5, train_bn=True), 1)
    after = _frozen_part(model)
    assert not torch.equal(before["bn1.running_mean"], after["bn1.running_mean"])
    assert torch.equal(before["bn1.weight"], after["bn1.weight"]) and torch.equal(
        before["conv1.weight"], after["conv1.weight"]
    )


@pytest.mark.slow
def test_unfreezing_adds_named_backbone_groups_at_the_ratio(tmp_path: Path, quick_trainer, resnet_weights) -> None:
    logger = TensorBoardLogger(tmp_path, name="ft")
    finetuning = TwoStageFinetuning(unfreeze_at_epoch=1, backbone_lr_ratio=0.25, backbone_warmup_epochs=1)
    trainer, model = _resnet_fit(
        quick_trainer, resnet_weights, finetuning, 2, LearningRateMonitor(), logger=logger, limit_train_batches=5,
        accumulate_grad_batches=2, model=dict(optimizer=torch.optim.AdamW, schedule="constant"),
    )  # fmt: skip
    groups = {g["name"]: g for g in trainer.optimizers[0].param_groups}
    assert list(groups) == ["head", "head_no_decay", "backbone", "backbone_no_decay"]
    assert groups["head"]["lr"] == 1e-3 and groups["backbone"]["initial_lr"] == pytest.approx(0.25e-3)
    assert groups["backbone_no_decay"]["weight_decay"] == 0.0 and groups["backbone"]["weight_decay"] == 0.01
    # 5 batches with accumulation 2 are 3 optimizer steps per epoch (the last window is short): one
    # definition of an epoch's steps for the model's schedule and the backbone's warmup.
    assert groups["backbone"]["warmup_steps"] == 3
    assert groups["backbone"]["lr"] == pytest.approx(0.25e-3 * 3 / 3)  # at the end of its warmup epoch
    assert all(p.requires_grad for p in model.parameters()) and finetuning.unfrozen_at_epoch == 1
    assert {"lr-AdamW/head", "lr-AdamW/backbone"} <= event_tags(Path(logger.log_dir))


@pytest.mark.slow
def test_plateau_of_the_monitored_metric_triggers_unfreezing(quick_trainer, resnet_weights) -> None:
    # lr=0: val_loss never improves after the first validation, so patience=1 fires after epoch 1.
    finetuning = TwoStageFinetuning(unfreeze_at_epoch=None, patience=1, monitor="val_loss")
    _resnet_fit(quick_trainer, resnet_weights, finetuning, 3, model=dict(optimizer=lambda p: torch.optim.SGD(p, 0.0)))
    assert finetuning.plateaued and finetuning.unfrozen_at_epoch == 2


@pytest.mark.slow
def test_resnet_resumed_in_stage_one_matches_an_uninterrupted_run(
    tmp_path: Path, quick_trainer, resnet_weights
) -> None:
    """Frozen BatchNorm across a resume, then unfreezing; SimpleCNN in every stage: tests/test_resume.py's matrix."""

    def run(directory: Path, *callbacks, ckpt_path=None) -> tuple[Trainer, ResNetClassifier]:
        finetuning = TwoStageFinetuning(unfreeze_at_epoch=1, backbone_warmup_epochs=0.5)
        return _resnet_fit(
            quick_trainer, resnet_weights, finetuning, 3, ResumeCheckpoint(dirpath=directory), *callbacks,
            ckpt_path=ckpt_path, model=dict(warmup_epochs=0.5),
        )  # fmt: skip

    full_trainer, full = run(tmp_path / "full")
    run(tmp_path / "cut", StopAfterEpoch(0))  # unfreezing happens at the start of epoch 1
    resumed_trainer, resumed = run(tmp_path / "cut", ckpt_path=str(tmp_path / "cut" / "last.ckpt"))
    assert same_state(full.state_dict(), resumed.state_dict())
    full_groups, resumed_groups = full_trainer.optimizers[0].param_groups, resumed_trainer.optimizers[0].param_groups
    assert [(g["name"], g["lr"]) for g in full_groups] == [(g["name"], g["lr"]) for g in resumed_groups]


@pytest.mark.slow
def test_vit_from_a_checkpoint_trains_its_head_then_everything(
    tmp_path: Path, quick_trainer, fashion_mnist_dir
) -> None:
    kwargs = dict(input_shape=(1, 28, 28), patch_size=7, dim=32, depth=1)
    weights = str(save_random_weights(TransformerClassifier, tmp_path / "vit.pt", **kwargs))
    model = TransformerClassifier(num_classes=10, weights=weights, **kwargs)
    loaded = _frozen_part(model)
    finetuning = TwoStageFinetuning(unfreeze_at_epoch=1)
    quick_trainer(max_epochs=1, callbacks=[finetuning]).fit(model, datamodule=FashionMNISTDataModule(batch_size=32))
    assert same_state(loaded, _frozen_part(model))  # stage 1: only the head moved
    trainer = quick_trainer(max_epochs=2, callbacks=[finetuning])
    trainer.fit(model, datamodule=FashionMNISTDataModule(batch_size=32))
    after = _frozen_part(model)
    assert not torch.equal(loaded["pos_embed"], after["pos_embed"]) and finetuning.unfrozen
    names = {g["name"]: g["weight_decay"] for g in trainer.optimizers[0].param_groups}
    assert names["backbone_no_decay"] == 0.0  # pos_embed, cls_token, norms, biases


@pytest.mark.slow
def test_a_resumed_run_needs_no_weights_its_checkpoint_has_them(tmp_path: Path, quick_trainer, fashion_mnist_dir):
    """`--ckpt_path` builds the model without --model.weights (the checkpoint replaces them): the random-weights
    refusal is for new runs only, in stage 1 and in stage 2."""
    weights = str(save_random_weights(SimpleCNN, tmp_path / "weights.pt"))

    def fit(model: SimpleCNN, directory: Path, *callbacks, ckpt_path: Path | None = None) -> Trainer:
        finetuning = TwoStageFinetuning(unfreeze_at_epoch=1)
        trainer = quick_trainer(max_epochs=3, callbacks=[finetuning, ResumeCheckpoint(dirpath=directory), *callbacks])
        trainer.fit(model, datamodule=FashionMNISTDataModule(batch_size=32), ckpt_path=ckpt_path)
        return trainer

    for stop_after, stage in ((0, "stage-1"), (1, "stage-2")):
        fit(SimpleCNN(weights=weights), tmp_path / stage, StopAfterEpoch(stop_after))
        resumed = fit(SimpleCNN(), tmp_path / stage, ckpt_path=tmp_path / stage / "last.ckpt")
        assert resumed.global_step == 12, stage


def test_under_ddp_a_trainer_without_the_engines_gradient_sync_is_refused() -> None:
    """A Trainer built by hand: DDP (not launched here) would leave the backbone's gradients unaveraged."""
    ddp = {"accelerator": "cpu", "devices": 2, "strategy": "ddp", "logger": False}
    trainer = Trainer(**ddp, callbacks=[TwoStageFinetuning()])
    with pytest.raises(ConfigError, match="needs the engine's ThawedParameterSync"):
        trainer.callbacks[0].setup(trainer, SimpleCNN(), "fit")
    trainer = Trainer(**ddp, callbacks=[ThawedParameterSync(), TwoStageFinetuning()])
    trainer.callbacks[1].setup(trainer, SimpleCNN(), "fit")


@pytest.mark.slow
def test_refuses_random_weights_and_models_without_the_seam(quick_trainer, fashion_mnist_dir) -> None:
    with pytest.raises(ValueError, match=r"random weights \(--model.weights is null\)"):
        quick_trainer(callbacks=[TwoStageFinetuning()]).fit(SimpleCNN(), datamodule=FashionMNISTDataModule())

    class NoSeam(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(784, 10)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0].flatten(1).float()).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(TypeError, match="needs a ClassificationModule whose `net` has the classifier seam"):
        quick_trainer(callbacks=[TwoStageFinetuning()]).fit(NoSeam(), datamodule=FashionMNISTDataModule())


def _ddp_finetune(tmp_path: Path, *flags: str) -> tuple[dict, dict]:
    weights = save_random_weights(SimpleCNN, tmp_path / "weights.pt")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(ROOT / "tests/scripts/ddp_finetune.py"), str(tmp_path), str(weights), *flags]
    subprocess.run(command, check=True, env=env, timeout=300, cwd=tmp_path)
    return torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")


@pytest.mark.slow
@pytest.mark.processes
def test_without_the_backbone_all_reduce_ddp_replicas_drift(tmp_path: Path, fashion_mnist_dir) -> None:
    """What the engine's ThawedParameterSync prevents (Lightning #20340): each rank trains its own backbone. The fp16
    test below shows the replicas identical with it."""
    rank0, rank1 = _ddp_finetune(tmp_path, "--without-backbone-sync")
    assert rank0["groups"] == ["head", "head_no_decay", "backbone", "backbone_no_decay"]
    backbone = [k for k in rank0["state"] if not k.startswith("fc.")]
    assert any(not torch.equal(rank0["state"][k], rank0["initial"][k]) for k in backbone)  # it trained
    assert not all(torch.equal(rank0["state"][k], rank1["state"][k]) for k in backbone)


@pytest.mark.slow
@pytest.mark.processes
def test_fp16_overflow_on_one_rank_is_skipped_by_every_rank(tmp_path: Path, fashion_mnist_dir) -> None:
    rank0, rank1 = _ddp_finetune(tmp_path, "--fp16-inf")
    assert rank0["scales"] == rank1["scales"]  # both ranks saw the overflow and halved the loss scale
    assert rank0["scales"][-1] < rank0["scales"][0]
    assert all(torch.isfinite(v).all() for v in rank0["state"].values())
    backbone = [k for k in rank0["state"] if not k.startswith("fc.")]
    assert any(not torch.equal(rank0["state"][k], rank0["initial"][k]) for k in backbone)  # it trained
    assert same_state(rank0["state"], rank1["state"])  # the replicas stayed identical


def test_stacked_configs_keep_the_later_finetuning(tmp_path: Path, monkeypatch, resnet_weights) -> None:
    """transfer.yaml on resnet_finetune.yaml: both bring a TwoStageFinetuning; the preset's replaces the job's."""
    monkeypatch.chdir(tmp_path)
    for name in ("cat", "dog"):
        (tmp_path / "images" / "train" / name).mkdir(parents=True)
    configs = [f"--config={ROOT / 'configs' / name}" for name in ("resnet_finetune.yaml", "presets/transfer.yaml")]
    cli = ProjectCLI(args=[*configs, f"--model.weights={resnet_weights}", "--data.root=images"], run=False)
    finetuning = [c for c in cli.trainer.callbacks if isinstance(c, TwoStageFinetuning)]
    assert [(c.unfreeze_at_epoch, c.backbone_lr_ratio, c.train_bn) for c in finetuning] == [(2, 1.0, True)]


def test_two_unfreezing_callbacks_are_refused_before_the_first_step(tmp_path: Path, quick_trainer) -> None:
    model = SimpleCNN(weights=str(save_random_weights(SimpleCNN, tmp_path / "cnn.pt")))
    trainer = quick_trainer(callbacks=[TwoStageFinetuning(), TwoStageFinetuning(unfreeze_at_epoch=2)])
    message = r"2 callbacks unfreeze the backbone: TwoStageFinetuning\(unfreeze_at_epoch=5, .*\), TwoStageFin.*=2,"
    with pytest.raises(ValueError, match=message):
        trainer.fit(model, datamodule=FashionMNISTDataModule())
    assert trainer.global_step == 0
