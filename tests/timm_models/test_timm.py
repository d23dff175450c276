"""Any timm backbone (the timm extra): a ResNet, a ConvNeXt and a ViT at their smallest sizes, on real Fashion-MNIST.
Each loads a file timm saved (as timm itself loads it, strictly), trains its new classifier on a frozen network with
every other parameter and statistic unchanged, then everything, and resumes exactly after a SIGTERM in either stage.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from huggingface_hub import constants
from lightning import Callback, Trainer, seed_everything
from lightning.pytorch.utilities.model_summary import summarize

from lightning_template.engine import ResumeCheckpoint, exact_resume
from lightning_template.engine.cli import ProjectCLI
from lightning_template.tasks.classification import FashionMNISTDataModule, TwoStageFinetuning
from lightning_template.tasks.classification.models.pretrained import PROXY_VARIABLES, WeightsError
from lightning_template.timm_models import TimmClassifier
from lightning_template.timm_models.weights import read_weights

from tests.conftest import ROOT
from tests.helpers import SignalAtBatch, same_state
from tests.timm_models.weights_files import saved_by_timm

# The smallest of each family, at a size its stride allows on 28 px images, and what freezing must cover in it.
FAMILIES: dict[str, dict[str, Any]] = {
    "resnet10t": {},  # BatchNorm: statistics too
    "convnext_atto": {"img_size": 32},  # LayerNorm, layer scale; 28 px would vanish in its stride of 32
    "vit_tiny_patch16_224": {"img_size": 32, "model_kwargs": {"patch_size": 8}},  # class token, position embeddings
}
MUST_FREEZE = {
    "resnet10t": ["model.bn1.running_mean", "model.layer4.0.bn2.weight", "model.conv1.0.weight"],
    "convnext_atto": ["model.stem.1.weight", "model.stages.3.blocks.1.gamma", "model.head.norm.weight"],
    "vit_tiny_patch16_224": ["model.cls_token", "model.pos_embed", "model.blocks.11.norm1.weight", "model.norm.weight"],
}
CLASSES = [0, 1, 7]  # T-shirt, Trouser, Sneaker: 8 training images each, 3 batches of 8 an epoch


def timm_kwargs(backbone: str) -> dict[str, Any]:
    """The same network as TimmClassifier builds, for timm.create_model."""
    options = FAMILIES[backbone]
    kwargs = dict(options.get("model_kwargs", {}), num_classes=len(CLASSES), in_chans=1)
    return kwargs | ({"img_size": 32} if backbone.startswith("vit") else {})


def read_by_timm(file: Path) -> dict[str, torch.Tensor]:
    """A weights file's tensors as timm's own loader reads them."""
    from timm.models import load_state_dict  # timm where it is used: at collection every test process would import it

    return load_state_dict(str(file))


def model_of(backbone: str, weights: str | None) -> TimmClassifier:
    return TimmClassifier(
        num_classes=len(CLASSES), input_shape=(1, 28, 28), backbone=backbone, weights=weights, warmup_epochs=0.5,
        **FAMILIES[backbone],
    )  # fmt: skip


@pytest.fixture(scope="module")
def timm_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("timm")


class Snapshots(Callback):
    """The network's tensors and which parameters train, when fit starts (the loaded weights) and after each epoch."""

    def __init__(self) -> None:
        self.states: list[dict[str, torch.Tensor]] = []
        self.trainable: list[dict[str, bool]] = []

    def record(self, pl_module: Any) -> None:
        self.states.append({k: v.detach().clone() for k, v in pl_module.net.state_dict().items()})
        self.trainable.append({k: p.requires_grad for k, p in pl_module.net.named_parameters()})

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.record(pl_module)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: Any) -> None:
        self.record(pl_module)


def fit(backbone: str, weights: str, directory: Path, *callbacks: Callback, ckpt_path: Path | None = None) -> Any:
    datamodule = FashionMNISTDataModule(batch_size=8, classes=CLASSES, train_samples_per_class=8)
    seed_everything(3)
    model = model_of(backbone, weights)
    finetuning = TwoStageFinetuning(unfreeze_at_epoch=1, backbone_warmup_epochs=0.5)
    trainer = Trainer(
        max_epochs=2, limit_val_batches=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        deterministic=True, num_sanity_val_steps=0,
        callbacks=[*exact_resume(), ResumeCheckpoint(dirpath=directory), finetuning, *callbacks],
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer, model


@pytest.mark.slow
@pytest.mark.parametrize("backbone", FAMILIES)
def test_loads_the_file_timm_saved_as_timm_loads_it(backbone: str, timm_files: Path) -> None:
    """timm's .safetensors and .pth: every tensor but the new classifier is the file's, as timm's own loader adapts
    it (a ViT's patch and position embeddings resampled to patches of 8 px on 32 px images); the first layer summed
    over RGB for gray input (before timm's resampling, where timm sums after it: equal up to rounding)."""
    folder = saved_by_timm(backbone, timm_files)
    import timm

    file = read_by_timm(folder / "model.safetensors")
    reference = timm.create_model(
        backbone, pretrained=True, pretrained_cfg_overlay={"file": str(folder / "model.safetensors")},
        **timm_kwargs(backbone),
    ).state_dict()  # fmt: skip
    for source in (folder / "model.safetensors", folder / "pytorch_model.bin"):
        net = model_of(backbone, str(source)).net
        loaded = {k.removeprefix("model."): v for k, v in net.state_dict().items()}
        classifier, first_conv = net.classifier_name.removeprefix("model."), net.first_conv.removeprefix("model.")
        kept = [k for k in reference if not k.startswith((f"{classifier}.", f"{first_conv}."))]
        assert [k for k in kept if not torch.equal(loaded[k], reference[k])] == [], source
        torch.testing.assert_close(loaded[f"{first_conv}.weight"], reference[f"{first_conv}.weight"])
        assert loaded[f"{first_conv}.weight"].shape[1] == 1 and net.get_classifier().out_features == len(CLASSES)
        unchanged = [k for k in kept if k in file and file[k].shape == loaded[k].shape]
        assert len(unchanged) > len(kept) // 2 and all(torch.equal(loaded[k], file[k]) for k in unchanged)


# The ResNet in test-all, the ConvNeXt and the ViT nightly (make matrix).
NIGHTLY_FAMILIES = [pytest.param(b, marks=pytest.mark.matrix if FAMILIES[b] else ()) for b in FAMILIES]


@pytest.mark.slow
@pytest.mark.parametrize("backbone", NIGHTLY_FAMILIES)
def test_two_stages_freeze_what_they_should_and_resume_exactly_after_sigterm(
    backbone: str, timm_files: Path, tmp_path: Path, fashion_mnist_dir: Path
) -> None:
    weights = str(saved_by_timm(backbone, timm_files) / "model.safetensors")
    snapshots = Snapshots()
    full_trainer, full = fit(backbone, weights, tmp_path / "full", snapshots)
    loaded, stage_one, stage_two = snapshots.states
    classifier = {f"{full.net.classifier_name}.{k}" for k in full.net.get_classifier().state_dict()}
    frozen = [k for k in loaded if k not in classifier]
    assert set(MUST_FREEZE[backbone]) <= set(frozen)
    # Stage 1, parameter by parameter: only the classifier trains; every other tensor (BatchNorm statistics too)
    # is bitwise the file's.
    assert {k for k, trains in snapshots.trainable[1].items() if trains} == classifier
    assert [k for k in frozen if not torch.equal(loaded[k], stage_one[k])] == []
    assert all(not torch.equal(loaded[k], stage_one[k]) for k in classifier)
    # Stage 2: every parameter trains, and moved.
    assert all(snapshots.trainable[2].values())
    parameters = dict(full.net.named_parameters())
    assert [k for k in parameters if torch.equal(stage_one[k], stage_two[k])] == []

    for epoch in (0, 1):  # a SIGTERM in the middle of each stage, then `--ckpt_path last.ckpt`
        directory = tmp_path / f"stage-{epoch + 1}"
        with contextlib.suppress(SystemExit):  # Lightning's graceful stop
            fit(backbone, weights, directory, SignalAtBatch(epoch, 1, signal.SIGTERM))
        resumed_trainer, resumed = fit(backbone, weights, directory, ckpt_path=directory / "last.ckpt")
        assert same_state(full.state_dict(), resumed.state_dict()), f"stage {epoch + 1}"
        groups = [(g["name"], g["lr"]) for g in resumed_trainer.optimizers[0].param_groups]
        assert groups == [(g["name"], g["lr"]) for g in full_trainer.optimizers[0].param_groups]

    # The run's checkpoint as --model.weights of a new run: its trained network, a new classifier.
    again = model_of(backbone, str(tmp_path / "full" / "last.ckpt")).net.state_dict()
    assert all(torch.equal(again[k], full.net.state_dict()[k]) for k in frozen)


def test_a_file_of_another_architecture_is_refused_naming_its_keys(timm_files: Path) -> None:
    folder = saved_by_timm("resnet10t", timm_files)
    missing = r"does not fit timm's resnet14t \(Missing key\(s\) in state_dict: \"layer1\.0\.conv3\.weight\""
    with pytest.raises(WeightsError, match=missing):
        TimmClassifier(backbone="resnet14t", weights=str(folder / "model.safetensors"))
    assert read_weights(folder).keys() == read_by_timm(folder / "model.safetensors").keys()  # save_for_hf's
    with pytest.raises(WeightsError, match="no such file, nor timm or pretrained"):
        TimmClassifier(backbone="resnet10t", weights="IMAGENET1K_V1")
    with pytest.raises(ValueError, match=r"--model.backbone convnext_atom: not a timm model\. Did you mean convnext"):
        TimmClassifier(backbone="convnext_atom")


def test_the_pretrained_tag_offline_fails_in_one_line_and_uses_the_cache(
    tmp_path: Path, timm_files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(WeightsError) as refused:
        TimmClassifier(backbone="resnet10t", weights="timm")
    message = str(refused.value)
    assert "\n" not in message and "the Hub cannot be reached (offline?)" in message
    url = "http://127.0.0.1:9/timm/resnet10t.c3_in1k/resolve/main/model.safetensors"
    assert f"Download {url} where there is a network and pass the file: --model.weights path/to" in message
    # The same file in the Hugging Face cache, as a download leaves it: found there, no network needed.
    snapshot = tmp_path / "hub" / "models--timm--resnet10t.c3_in1k" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(saved_by_timm("resnet10t", timm_files) / "model.safetensors")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    net = TimmClassifier(backbone="resnet10t", weights="pretrained").net
    file = read_by_timm(snapshot / "model.safetensors")
    assert torch.equal(net.model.layer4[0].conv2.weight, file["layer4.0.conv2.weight"])


def test_the_preset_puts_a_timm_backbone_in_a_job(tmp_path: Path, timm_files: Path, monkeypatch) -> None:
    """`make transfer-timm`'s step 2: the recipe's job and its fine-tuning preset, with presets/timm.yaml's model in
    place of the job's, the job's optimizer and schedule kept."""
    monkeypatch.chdir(tmp_path)
    configs = [f"--config={ROOT / 'configs' / name}" for name in ("resnet_fmnist_small.yaml", "presets/timm.yaml")]
    configs.append(f"--config={ROOT / 'configs/presets/transfer.yaml'}")
    weights = saved_by_timm("convnext_atto", timm_files)
    cli = ProjectCLI(args=[*configs, f"--model.weights={weights}", "--trainer.logger=false"], run=False)
    assert isinstance(cli.model, TimmClassifier) and cli.model.hparams.backbone == "convnext_atto"
    assert cli.model.hparams.optimizer["init_args"]["lr"] == 0.002 and cli.model.hparams.warmup_epochs == 1
    assert cli.model.net.get_classifier().out_features == 5 and cli.model.net.img_size == (32, 32)
    assert [c.backbone_lr_ratio for c in cli.trainer.callbacks if isinstance(c, TwoStageFinetuning)] == [1.0]


def test_the_model_summary_counts_the_flops_of_one_image() -> None:
    model = model_of("resnet10t", None)
    assert model.example_input_array.shape == (1, 1, 28, 28) and summarize(model).total_flops > 0
