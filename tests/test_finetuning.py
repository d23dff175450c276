"""ResNet fine-tuning: the two-stage callback, weight loading, and DDP, on real Fashion-MNIST."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision
from lightning import Trainer, seed_everything
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from callbacks import ExactResume, TwoStageFinetuning
from datamodules import FashionMNISTDataModule
from models import ResNetClassifier, SimpleCNN
from models.resnet import WeightsError
from tests.conftest import ROOT
from tests.helpers import StopAfterEpoch


def _fit(
    finetuning: TwoStageFinetuning | None,
    max_epochs: int,
    callbacks=(),
    ckpt_path: str | None = None,
    logger=False,
    **model_kwargs,
) -> tuple[Trainer, ResNetClassifier]:
    seed_everything(0)
    model = ResNetClassifier(num_classes=10, input_shape=(1, 28, 28), **model_kwargs)
    trainer = Trainer(
        max_epochs=max_epochs, limit_train_batches=4, limit_val_batches=2, logger=logger, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        deterministic=True, log_every_n_steps=1,
        callbacks=[c for c in (finetuning, ExactResume(), *callbacks) if c is not None],
    )  # fmt: skip
    trainer.fit(model, datamodule=FashionMNISTDataModule(batch_size=32), ckpt_path=ckpt_path)
    return trainer, model


def _clone(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_stage_one_leaves_backbone_and_batchnorm_bitwise_unchanged(fashion_mnist_dir) -> None:
    seed_everything(0)
    reference = ResNetClassifier(num_classes=10, input_shape=(1, 28, 28))
    backbone_before, head_before = _clone(reference.backbone), _clone(reference.head)
    _, model = _fit(TwoStageFinetuning(unfreeze_at_epoch=5), max_epochs=2)
    backbone_after, head_after = model.backbone.state_dict(), model.head.state_dict()
    assert any("running_mean" in k for k in backbone_after)  # BatchNorm buffers are part of the check
    assert all(torch.equal(backbone_before[k], backbone_after[k]) for k in backbone_before)
    assert not torch.equal(head_before["1.weight"], head_after["1.weight"])


def test_train_bn_lets_batchnorm_statistics_move(fashion_mnist_dir) -> None:
    seed_everything(0)
    before = _clone(ResNetClassifier(num_classes=10, input_shape=(1, 28, 28)).backbone)
    _, model = _fit(TwoStageFinetuning(unfreeze_at_epoch=5, train_bn=True), max_epochs=1)
    after = model.backbone.state_dict()
    assert not torch.equal(before["bn1.running_mean"], after["bn1.running_mean"])
    assert torch.equal(before["bn1.weight"], after["bn1.weight"]) and torch.equal(
        before["conv1.weight"], after["conv1.weight"]
    )


def test_unfreezing_adds_a_named_backbone_group_at_the_ratio(tmp_path: Path, fashion_mnist_dir) -> None:
    logger = TensorBoardLogger(tmp_path, name="ft")
    finetuning = TwoStageFinetuning(unfreeze_at_epoch=1, backbone_lr_ratio=0.25)
    trainer, model = _fit(
        finetuning, max_epochs=2, callbacks=[LearningRateMonitor()], logger=logger, lr=0.004, schedule="constant"
    )
    groups = {g["name"]: g for g in trainer.optimizers[0].param_groups}
    assert list(groups) == ["head", "backbone"]
    assert groups["backbone"]["lr"] == pytest.approx(0.25 * groups["head"]["lr"]) and groups["head"]["lr"] == 0.004
    assert all(p.requires_grad for p in model.backbone.parameters())
    assert finetuning.unfrozen_at_epoch == 1
    from tests.test_cli import _scalar_tags

    assert {"lr-AdamW/head", "lr-AdamW/backbone"} <= _scalar_tags(Path(logger.log_dir))


def test_plateau_of_the_monitored_metric_triggers_unfreezing(fashion_mnist_dir) -> None:
    # lr=0: val_loss never improves after the first validation, so patience=1 fires after epoch 1.
    finetuning = TwoStageFinetuning(unfreeze_at_epoch=None, patience=1, monitor="val_loss")
    _fit(finetuning, max_epochs=3, lr=0.0)
    assert finetuning.plateaued and finetuning.unfrozen_at_epoch == 2


@pytest.mark.parametrize("stop_epoch", [0, 1], ids=["stopped-in-stage-1", "stopped-after-unfreezing"])
def test_resume_in_either_stage_matches_an_uninterrupted_run(
    tmp_path: Path, stop_epoch: int, fashion_mnist_dir
) -> None:
    def run(directory: Path, *callbacks, ckpt_path: str | None = None) -> tuple[Trainer, ResNetClassifier]:
        checkpoint = ModelCheckpoint(dirpath=directory, save_last=True)
        finetuning = TwoStageFinetuning(unfreeze_at_epoch=1, backbone_warmup_epochs=0.5)
        return _fit(finetuning, 3, callbacks=[checkpoint, *callbacks], ckpt_path=ckpt_path, warmup_epochs=0.5)

    full_trainer, full = run(tmp_path / "full")
    run(tmp_path / "cut", StopAfterEpoch(stop_epoch))  # unfreezing happens at the start of epoch 1
    resumed_trainer, resumed = run(tmp_path / "cut", ckpt_path=str(tmp_path / "cut" / "last.ckpt"))
    expected, actual = full.state_dict(), resumed.state_dict()
    assert all(torch.equal(expected[k], actual[k]) for k in expected)
    full_groups, resumed_groups = full_trainer.optimizers[0].param_groups, resumed_trainer.optimizers[0].param_groups
    assert [(g["name"], g["lr"]) for g in full_groups] == [(g["name"], g["lr"]) for g in resumed_groups]
    assert full_trainer.callback_metrics["val_loss"].item() == resumed_trainer.callback_metrics["val_loss"].item()


def test_refuses_a_model_without_the_backbone_head_seam(fashion_mnist_dir) -> None:
    trainer = Trainer(max_epochs=1, limit_train_batches=1, logger=False, callbacks=[TwoStageFinetuning()])
    with pytest.raises(TypeError, match="needs a model with `backbone` and `head`"):
        trainer.fit(SimpleCNN(), datamodule=FashionMNISTDataModule())


@pytest.mark.slow
@pytest.mark.parametrize("sync", [True, False], ids=["with-sync", "without-sync"])
def test_ddp_ranks_hold_identical_weights_after_unfreezing(tmp_path: Path, sync: bool, fashion_mnist_dir) -> None:
    args = [sys.executable, str(ROOT / "tests/scripts/ddp_finetune.py"), str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [*args, *([] if sync else ["--without-backbone-sync"])], check=True, env=env, timeout=300, cwd=tmp_path
    )
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert rank0["groups"] == ["head", "backbone"]
    backbone_keys = [k for k in rank0["state"] if k.startswith("net.backbone.") and "weight" in k]
    moved = [
        k
        for k in backbone_keys
        if not torch.equal(rank0["state"][k], rank0["initial_backbone"][k.removeprefix("net.backbone.")])
    ]
    assert moved  # the backbone trained after unfreezing
    identical = all(torch.equal(rank0["state"][k], rank1["state"][k]) for k in backbone_keys)
    # Each rank saw its own shard; without our all-reduce the replicas drift apart (Lightning #20340).
    assert identical is sync


class TestWeights:
    def test_torchvision_state_dict_with_rgb_conv1_summed_for_grayscale(self, tmp_path: Path) -> None:
        torch.manual_seed(0)
        resnet = torchvision.models.resnet18()
        torch.save(resnet.state_dict(), tmp_path / "resnet18.pth")
        model = ResNetClassifier(num_classes=3, input_shape=(1, 28, 28), weights=str(tmp_path / "resnet18.pth"))
        assert torch.equal(model.backbone.conv1.weight, resnet.conv1.weight.sum(dim=1, keepdim=True))
        assert torch.equal(model.backbone.layer4[1].conv2.weight, resnet.layer4[1].conv2.weight)
        assert model.head[1].out_features == 3

    def test_checkpoint_of_an_earlier_run(self, tmp_path: Path, fashion_mnist_dir) -> None:
        _, pretrained = _fit(None, max_epochs=1, callbacks=[ModelCheckpoint(dirpath=tmp_path)])
        checkpoint = next(tmp_path.glob("*.ckpt"))
        model = ResNetClassifier(num_classes=5, input_shape=(1, 28, 28), weights=str(checkpoint))
        expected = pretrained.backbone.state_dict()
        assert all(torch.equal(expected[k], v) for k, v in model.backbone.state_dict().items())

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(WeightsError, match=r"nowhere\.pth: file not found"):
            ResNetClassifier(input_shape=(1, 28, 28), weights=str(tmp_path / "nowhere.pth"))

    def test_not_a_state_dict(self, tmp_path: Path) -> None:
        (tmp_path / "notes.pth").write_text("not a tensor file")
        with pytest.raises(WeightsError, match="not a readable torch file"):
            ResNetClassifier(input_shape=(1, 28, 28), weights=str(tmp_path / "notes.pth"))

    def test_mismatched_architecture_lists_the_keys(self, tmp_path: Path) -> None:
        torch.save(torchvision.models.resnet50().state_dict(), tmp_path / "resnet50.pth")
        with pytest.raises(WeightsError) as err:
            ResNetClassifier(arch="resnet18", input_shape=(3, 32, 32), weights=str(tmp_path / "resnet50.pth"))
        message = str(err.value)
        assert "unexpected keys: ['layer1.0.bn3.bias'" in message
        assert "shape mismatches: ['layer1.0.conv1.weight: file (64, 64, 1, 1) vs model (64, 64, 3, 3)'" in message
        assert "--model.arch" in message

    def test_torchvision_weights_name_offline_says_how_to_use_a_file(self, monkeypatch) -> None:
        url = "http://127.0.0.1:9/resnet18-f37072fd.pth"  # closed port: fails as offline does
        monkeypatch.setattr(torchvision.models.ResNet18_Weights.IMAGENET1K_V1.value, "url", url)
        monkeypatch.setenv("TORCH_HOME", "/nonexistent-torch-home")
        with pytest.raises(WeightsError, match=r"Offline\? .* --model.weights path/to/resnet18.pth"):
            ResNetClassifier(input_shape=(3, 32, 32), weights="IMAGENET1K_V1")
