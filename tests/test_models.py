"""The model contract, over every model: the seam, param groups, weights reuse, injected optimizers, schedule."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from lightning import Callback
from lightning.pytorch.utilities.model_summary import summarize
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import lightning_template.tasks.classification
from lightning_template.tasks.classification import (
    ClassificationModule,
    FashionMNISTDataModule,
    ImageFolderDataModule,
    ResNetClassifier,
    SimpleCNN,
    TransformerClassifier,
)
from lightning_template.tasks.classification.models.pretrained import WeightsError, adapt_input_conv
from lightning_template.tasks.optim import lr_factor

from tests.conftest import save_random_weights

CASES = {
    "SimpleCNN": (SimpleCNN, dict(input_shape=(1, 28, 28)), (1, 28, 28)),
    "ResNetClassifier": (ResNetClassifier, dict(input_shape=(3, 32, 32)), (3, 32, 32)),
    "TransformerClassifier-patches": (
        TransformerClassifier, dict(input_shape=(1, 28, 28), patch_size=7, dim=32, depth=1), (1, 28, 28),
    ),
    "TransformerClassifier-tokens": (TransformerClassifier, dict(vocab_size=50, dim=32, depth=1), None),
}  # fmt: skip


def _inputs(shape: tuple[int, ...] | None, batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, *shape) if shape else torch.randint(2, 50, (batch, 9))


def test_every_model_has_a_contract_case() -> None:
    exported = {
        name for name in lightning_template.tasks.classification.__all__
        if isinstance(getattr(lightning_template.tasks.classification, name), type)
        and issubclass(getattr(lightning_template.tasks.classification, name), ClassificationModule)
    } - {"ClassificationModule"}  # fmt: skip
    assert exported == {cls.__name__ for cls, _, _ in CASES.values()}


@pytest.mark.parametrize("case", list(CASES))
def test_seam_forward_features_head_and_classifier(case: str) -> None:
    model_class, kwargs, shape = CASES[case]
    torch.manual_seed(0)
    model = model_class(num_classes=5, **kwargs).eval()
    inputs = _inputs(shape)
    net = model.net
    features = net.forward_features(inputs)
    assert features.dim() == 2 and len(features) == 4
    torch.testing.assert_close(net.forward_head(features), model(inputs))
    assert net.forward_head(features, pre_logits=True).shape[1] == net.get_classifier().in_features
    assert isinstance(net.get_classifier(), nn.Linear) and net.get_classifier().out_features == 5
    net.reset_classifier(3)
    assert model(inputs).shape == (4, 3)


@pytest.mark.parametrize("case", list(CASES))
def test_the_model_summary_counts_the_flops_of_one_sample(case: str) -> None:
    """Lightning's summary (FLOPs column, `Total FLOPs`) runs the model's example_input_array: one sample of the
    input the model was built for, its FLOPs those of one real input of that size (zeros without it)."""
    model_class, kwargs, shape = CASES[case]
    model = model_class(num_classes=5, **kwargs)
    sample = _inputs(shape, batch=1) if shape else torch.randint(2, 50, (1, model.hparams.max_length))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.eval()(sample)
    assert summarize(model).total_flops == counter.get_total_flops() > 0


def test_a_compiled_network_has_no_example_input() -> None:
    """The summary's forward of one sample would compile the network once more, for that shape."""
    model = SimpleCNN(compile=True)
    model._compiled = True  # as on a second configure_model: no import of torch.compile's machinery (seconds)
    model.configure_model()
    assert model.example_input_array is None


@pytest.mark.slow
def test_the_summary_of_a_fit_counts_flops_through_the_datamodules_batch_hooks(
    quick_trainer, image_tree: Path, fashion_mnist_dir
) -> None:
    """In a fit, the example input goes through the datamodule's on_after_batch_transfer (uint8 batches normalized
    on the device), which hands the model's input on as it is: the summary at the fit's start counts its FLOPs."""
    counted = {}

    class Summary(Callback):
        def on_fit_start(self, trainer, pl_module) -> None:
            counted[type(trainer.datamodule).__name__] = summarize(pl_module).total_flops

    for data in (FashionMNISTDataModule(batch_size=8), ImageFolderDataModule(root=str(image_tree), image_size=32)):
        model = ResNetClassifier(num_classes=data.num_classes, input_shape=data.input_shape)
        quick_trainer(max_steps=1, limit_val_batches=0, callbacks=[Summary()]).fit(model, datamodule=data)
    assert counted["FashionMNISTDataModule"] > 0 and counted["ImageFolderDataModule"] > 0, counted


@pytest.mark.parametrize("case", list(CASES))
def test_param_groups_split_head_backbone_and_weight_decay(case: str) -> None:
    model_class, kwargs, _ = CASES[case]
    model = model_class(num_classes=5, **kwargs)
    groups = model.parameter_groups("head") + model.parameter_groups("backbone")
    grouped = [id(p) for group in groups for p in group["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())  # every parameter exactly once
    names = {id(p): name for name, p in model.net.named_parameters()}
    exempt = model.net.no_weight_decay()
    for group in groups:
        decays = not group["name"].endswith("_no_decay")
        assert group.get("weight_decay", None) == (None if decays else 0.0)
        for p in group["params"]:
            assert (p.ndim >= 2 and names[id(p)] not in exempt) == decays, names[id(p)]
    head = {id(p) for group in model.parameter_groups("head") for p in group["params"]}
    assert head == {id(p) for p in model.net.get_classifier().parameters()}


@pytest.mark.parametrize("case", list(CASES))
def test_weights_file_loads_everything_but_the_classifier(case: str, tmp_path: Path) -> None:
    model_class, kwargs, _ = CASES[case]
    weights = save_random_weights(model_class, tmp_path / "net.pt", num_classes=5, **kwargs)
    model = model_class(num_classes=3, weights=str(weights), **kwargs)  # other classes: the classifier is new
    saved = torch.load(weights, weights_only=True)
    classifier = model.net.classifier_name
    loaded = {k: v for k, v in model.net.state_dict().items() if not k.startswith(f"{classifier}.")}
    assert loaded and all(torch.equal(saved[k], v) for k, v in loaded.items())
    assert model.net.get_classifier().out_features == 3


def test_the_loss_is_logged_in_every_step_lightning_writes(quick_trainer) -> None:
    """The classifier logs its training loss only in the steps whose values Lightning writes to the loggers (each
    `self.log` costs as much as a small step): every row Lightning writes in training has it."""
    from lightning import Callback
    from lightning.pytorch.loggers import Logger

    class Rows(Logger):
        name, version = "rows", 0

        def __init__(self) -> None:
            super().__init__()
            self.rows: list[set[str]] = []

        def log_metrics(self, metrics: dict, step: int | None = None) -> None:
            self.rows.append(set(metrics))

        def log_hyperparams(self, *args, **kwargs) -> None:
            pass

    class Probe(Callback):  # logged in every batch: Lightning writes it in each step it writes
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
            pl_module.log("probe", 1.0)

    rows = Rows()
    images, labels = torch.randn(64, 1, 28, 28), torch.arange(64) % 4
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=4)
    trainer = quick_trainer(max_epochs=2, limit_train_batches=8, accumulate_grad_batches=2, log_every_n_steps=3,
                            logger=rows, callbacks=[Probe()])  # fmt: skip
    trainer.fit(SimpleCNN(num_classes=4, input_shape=(1, 28, 28)), train_dataloaders=loader)
    written = [row for row in rows.rows if "probe" in row]
    assert len(written) == 2 and all("train_loss" in row for row in written), rows.rows


@pytest.mark.slow
def test_weights_from_a_checkpoint_hold_no_code(tmp_path: Path, quick_trainer, fashion_mnist_dir) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    trainer = quick_trainer(limit_train_batches=1, callbacks=[ModelCheckpoint(dirpath=tmp_path)])
    trainer.fit(SimpleCNN(optimizer=torch.optim.SGD), datamodule=FashionMNISTDataModule())
    checkpoint = next(tmp_path.glob("*.ckpt"))
    hparams = torch.load(checkpoint, weights_only=True)["hyper_parameters"]  # no pickled classes in it
    assert hparams["optimizer"]["class_path"] == "torch.optim.sgd.SGD"
    model = SimpleCNN(num_classes=4, weights=str(checkpoint))
    assert torch.equal(model.net.features[0].weight, trainer.lightning_module.net.features[0].weight)
    restored = SimpleCNN.load_from_checkpoint(checkpoint, weights_only=True)
    assert isinstance(restored.make_optimizer(model.parameters()), torch.optim.SGD)


@pytest.mark.parametrize(("stored", "wanted"), [(3, 1), (1, 3), (3, 6), (1, 4)])
def test_input_conv_adaptation_keeps_the_response_to_a_gray_image(stored: int, wanted: int) -> None:
    torch.manual_seed(0)
    weight = torch.randn(8, stored, 3, 3)
    gray = torch.randn(2, 1, 10, 10)
    adapted = adapt_input_conv(weight, wanted)
    assert adapted.shape == (8, wanted, 3, 3)
    expected = nn.functional.conv2d(gray.expand(-1, stored, -1, -1), weight)
    torch.testing.assert_close(nn.functional.conv2d(gray.expand(-1, wanted, -1, -1), adapted), expected)


@pytest.mark.slow
def test_gray_checkpoint_trains_on_rgb_files_and_rgb_weights_on_gray_data(
    tmp_path: Path, quick_trainer, image_tree: Path
) -> None:
    gray = save_random_weights(SimpleCNN, tmp_path / "gray.pt", input_shape=(1, 28, 28))
    rgb_data = ImageFolderDataModule(root=str(image_tree), image_size=28, batch_size=8, num_workers=0)
    model = SimpleCNN(num_classes=rgb_data.num_classes, input_shape=rgb_data.input_shape, weights=str(gray))
    before = model.net.features[0].weight.clone()
    quick_trainer(limit_train_batches=2).fit(model, datamodule=rgb_data)
    assert model.net.features[0].weight.shape[1] == 3 and not torch.equal(model.net.features[0].weight, before)

    rgb = save_random_weights(ResNetClassifier, tmp_path / "rgb.pth", input_shape=(3, 32, 32))
    model = ResNetClassifier(input_shape=(1, 28, 28), weights=str(rgb))
    trainer = quick_trainer(limit_train_batches=2, limit_val_batches=1)
    trainer.fit(model, datamodule=FashionMNISTDataModule(batch_size=16))
    assert math.isfinite(trainer.callback_metrics["val_loss"].item())


@pytest.mark.slow
def test_weights_errors_name_the_file_and_the_keys(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=r"nowhere\.pth: file not found"):
        ResNetClassifier(input_shape=(1, 28, 28), weights=str(tmp_path / "nowhere.pth"))
    (tmp_path / "notes.pth").write_text("not a tensor file")
    with pytest.raises(WeightsError, match="not a readable torch file"):
        ResNetClassifier(input_shape=(1, 28, 28), weights=str(tmp_path / "notes.pth"))
    resnet50 = save_random_weights(ResNetClassifier, tmp_path / "resnet50.pth", arch="resnet50")
    with pytest.raises(WeightsError) as err:
        ResNetClassifier(arch="resnet18", input_shape=(3, 32, 32), weights=str(resnet50))
    message = str(err.value)
    assert "unexpected keys: ['layer1.0.bn3.bias'" in message
    assert "shape mismatches: ['layer1.0.conv1.weight: file (64, 64, 1, 1) vs model (64, 64, 3, 3)'" in message
    assert "--model.arch" in message


def test_weights_only_loading_runs_no_code_from_the_file(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self):
            return (print, ("code ran while loading",))

    torch.save({"conv1.weight": Payload()}, tmp_path / "evil.pth")
    with pytest.raises(WeightsError, match=r"evil\.pth: not a readable torch file"):
        ResNetClassifier(input_shape=(3, 32, 32), weights=str(tmp_path / "evil.pth"))


def test_torchvision_weights_name_offline_says_how_to_use_a_file(monkeypatch) -> None:
    import torchvision

    url = "http://127.0.0.1:9/resnet18-f37072fd.pth"  # closed port: fails as offline does
    monkeypatch.setattr(torchvision.models.ResNet18_Weights.IMAGENET1K_V1.value, "url", url)
    monkeypatch.setenv("TORCH_HOME", "/nonexistent-torch-home")
    with pytest.raises(WeightsError, match=r"Offline\? .* --model.weights path/to/resnet18.pth"):
        ResNetClassifier(input_shape=(3, 32, 32), weights="IMAGENET1K_V1")


def test_warmup_then_cosine() -> None:
    kwargs = dict(total_steps=110, warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    assert lr_factor(0, **kwargs) == pytest.approx(0.1)
    assert lr_factor(9, **kwargs) == pytest.approx(1.0)
    assert lr_factor(10, **kwargs) == pytest.approx(1.0)
    assert lr_factor(60, **kwargs) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(110, **kwargs) == pytest.approx(0.1)
    factors = [lr_factor(s, **kwargs) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(factors))


def test_step_schedule_drops_by_gamma() -> None:
    kwargs = dict(total_steps=100, warmup_steps=0, schedule="step", step_every=30, gamma=0.5)
    assert [lr_factor(s, **kwargs) for s in (0, 29, 30, 59, 60)] == [1.0, 1.0, 0.5, 0.5, 0.25]
    assert math.isclose(lr_factor(5, 100, 0, "constant"), 1.0)
