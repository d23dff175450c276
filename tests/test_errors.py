"""Bad input and failing runs: each gives an error that names the file or option and the fix, and loses nothing."""

from __future__ import annotations

import gzip
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning import Callback, seed_everything
from PIL import Image

from lightning_template.engine import FiniteLossGuard, NonFiniteLossError, ResumeCheckpoint, exact_resume
from lightning_template.engine.cli import ProjectCLI
from lightning_template.engine.finite_loss import all_finite
from lightning_template.engine.lightning_internals import _unit_scale
from lightning_template.tasks.classification import FashionMNISTDataModule, ResNetClassifier, SimpleCNN
from lightning_template.tasks.classification.data.idx import ALL_FILES
from lightning_template.tasks.classification.data.image_folder import CorruptImageError, load_rgb
from lightning_template.tasks.classification.data.text import read_records

from tests.conftest import ROOT


class Fault(Callback):
    """At global step `step`: poison the batch with NaN (a diverged run), or raise KeyboardInterrupt in the
    middle of the step (a second Ctrl-C)."""

    def __init__(self, step: int, kind: str) -> None:
        self.step, self.kind = step, kind

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step and self.kind == "nan":
            batch[0].fill_(float("nan"))

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if trainer.global_step == self.step and self.kind == "interrupt":
            raise KeyboardInterrupt


def _fit_until_fault(tmp_path: Path, quick_trainer, fault: Fault | None, ckpt_path: str | None = None):
    seed_everything(0)
    callbacks = [*exact_resume(), ResumeCheckpoint(dirpath=tmp_path), FiniteLossGuard(), *([fault] if fault else [])]
    trainer = quick_trainer(max_epochs=2, limit_train_batches=5, callbacks=callbacks)
    trainer.fit(SimpleCNN(), datamodule=FashionMNISTDataModule(), ckpt_path=ckpt_path)
    return trainer


@pytest.mark.slow
def test_nan_loss_stops_before_the_step_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, quick_trainer, fashion_mnist_dir
) -> None:
    with pytest.raises(NonFiniteLossError) as err:
        _fit_until_fault(tmp_path, quick_trainer, Fault(step=7, kind="nan"))
    message = str(err.value)
    assert "Loss became nan in epoch 1, batch_idx 2 (optimizer step 7)" in message
    assert "--model.optimizer.lr" in message and "normalized" in message and "labels outside" in message
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 5  # epoch 0's: the failing step wrote nothing
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values())
    resumed = _fit_until_fault(tmp_path, quick_trainer, None, ckpt_path=str(tmp_path / "last.ckpt"))
    assert resumed.global_step == 10


@pytest.mark.slow
def test_abort_in_the_middle_of_a_step_writes_no_half_checkpoint(
    tmp_path: Path, quick_trainer, fashion_mnist_dir
) -> None:
    with pytest.raises(SystemExit):  # Lightning's exit after a KeyboardInterrupt
        _fit_until_fault(tmp_path, quick_trainer, Fault(step=7, kind="interrupt"))
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
    assert checkpoint["global_step"] == 5 and progress["started"] == progress["processed"]


def test_label_outside_the_classes_names_split_and_examples(tmp_path: Path, fashion_mnist_dir: Path) -> None:
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ALL_FILES:
        shutil.copy(fashion_mnist_dir / f"{name}.gz", raw / f"{name}.gz")
    labels = bytearray(gzip.decompress((raw / "t10k-labels-idx1-ubyte.gz").read_bytes()))
    labels[8 + 17] = 12  # IDX header is 8 bytes; class 12 does not exist
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes(labels)))
    with pytest.raises(ValueError, match=r"test labels: 1 outside \[0, 10\), e\.g\. \[12\]"):
        FashionMNISTDataModule(data_dir=str(tmp_path)).setup("fit")


def test_idx_header_that_lies_about_its_size(tmp_path: Path) -> None:
    from lightning_template.tasks.classification.data.idx import read_idx

    (tmp_path / "x-idx1-ubyte").write_bytes(struct.pack(">BBBBI", 0, 0, 8, 1, 1000) + b"\x01" * 10)
    with pytest.raises(ValueError, match=r"x-idx1-ubyte: truncated or corrupt \(18 bytes, header says 1008\)"):
        read_idx(tmp_path / "x-idx1-ubyte")


@pytest.fixture(scope="module")
def simple_cnn_checkpoint(tmp_path_factory, fashion_mnist_dir) -> Path:
    from lightning import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    directory = tmp_path_factory.mktemp("ckpt")
    trainer = Trainer(
        max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0, logger=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[ModelCheckpoint(dirpath=directory)],
    )  # fmt: skip
    trainer.fit(SimpleCNN(), datamodule=FashionMNISTDataModule(batch_size=16))
    return next(directory.glob("*.ckpt"))


@pytest.mark.slow
def test_checkpoint_of_another_model_lists_the_mismatched_keys(simple_cnn_checkpoint: Path, quick_trainer) -> None:
    model = ResNetClassifier(num_classes=10, input_shape=(1, 28, 28))
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"net\.conv1\.weight\""):
        quick_trainer().validate(model, datamodule=FashionMNISTDataModule(), ckpt_path=simple_cnn_checkpoint)


def test_checkpoint_with_other_class_count_names_the_layer(simple_cnn_checkpoint: Path, quick_trainer) -> None:
    datamodule = FashionMNISTDataModule(classes=[5, 6, 7, 8, 9])
    model = SimpleCNN(num_classes=datamodule.num_classes)
    with pytest.raises(RuntimeError, match=r"size mismatch for net\.fc\.weight"):
        quick_trainer().validate(model, datamodule=datamodule, ckpt_path=simple_cnn_checkpoint)


@pytest.mark.slow
def test_corrupt_checkpoint_is_refused_before_anything_runs(simple_cnn_checkpoint: Path, tmp_path: Path) -> None:
    truncated = tmp_path / "cut.ckpt"
    truncated.write_bytes(simple_cnn_checkpoint.read_bytes()[:5000])
    args = ["validate", "--config", str(ROOT / "configs/simple_cnn.yaml")]
    with pytest.raises(ValueError, match=r"cut\.ckpt: not a readable PyTorch checkpoint \(truncated or corrupt\)"):
        ProjectCLI(args=[*args, f"--ckpt_path={truncated}"])
    with pytest.raises(FileNotFoundError, match=r"nope\.ckpt: no such file"):
        ProjectCLI(args=[*args, f"--ckpt_path={tmp_path / 'nope.ckpt'}"])


def _foreign_checkpoints(folder: Path) -> dict[str, Path]:
    """Checkpoints another project wrote with a plain `Trainer.save_checkpoint`: Lightning's BoringModel (no
    hyper-parameters), an autoencoder that saves its hyper-parameters, and the same as a CLI of another project saves
    it (its class's path, which cannot be imported here)."""
    from lightning import Trainer
    from lightning.pytorch.demos import BoringModel

    from tests.foreign_code import ImagesData, LitAutoEncoder

    paths = {name: folder / f"{name}.ckpt" for name in ("boring", "autoencoder", "other_cli")}
    for model, path, data in (
        (BoringModel(), paths["boring"], None),
        (LitAutoEncoder(), paths["autoencoder"], ImagesData()),
    ):
        trainer = Trainer(max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        trainer.fit(model, datamodule=data)
        trainer.save_checkpoint(path)
    checkpoint = torch.load(paths["autoencoder"], weights_only=True)
    checkpoint["hyper_parameters"]["_class_path"] = "other_project.models.AutoEncoder"
    torch.save(checkpoint, paths["other_cli"])
    return paths


def test_a_checkpoint_another_project_wrote_is_one_line_naming_both_models(tmp_path: Path, monkeypatch, capsys):
    """Given to fit, test or predict (validate reads it as test does) with this project's config: one line naming
    both models (or what the checkpoint lacks of this one), not Lightning's 40-line state_dict error or a 10-line
    parser error; fit makes no run folder first."""
    from lightning_template.engine.cli import main

    paths = _foreign_checkpoints(tmp_path)
    monkeypatch.chdir(tmp_path)
    ours = "lightning_template.tasks.classification.SimpleCNN"
    unnamed = "another model (its class is not saved in it)"
    said = {
        "boring": "lacks 16 of the 16 tensors of SimpleCNN (net.features.0.weight, net.features.2.weight,"
        f" net.features.2.bias), and holds 2 others (layer.weight, layer.bias): it is a checkpoint of {unnamed}.",
        "autoencoder": f"is a checkpoint of {unnamed}, not of this config's model {ours}: its hyper-parameter lr is"
        " not an argument of SimpleCNN.",
        "other_cli": f"is a checkpoint of other_project.models.AutoEncoder, not of this config's model {ours}:"
        " other_project.models.AutoEncoder cannot be imported here.",
    }
    for command, name in [("fit", "boring"), ("test", "autoencoder"), ("predict", "other_cli")]:
        argv = ["train.py", command, "--config", str(ROOT / "configs/simple_cnn.yaml"), f"--ckpt_path={paths[name]}"]
        monkeypatch.setattr("sys.argv", argv)
        with pytest.raises(SystemExit) as exit_:
            main()
        err = capsys.readouterr().err
        assert exit_.value.code == 1 and "Traceback" not in err and "\nError: " in err, err[-3000:]
        assert f"Error: --ckpt_path {paths[name]} {said[name]}" in err, err[-3000:]
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_a_model_breaking_the_step_output_contract_is_told_what_is_missing(quick_trainer, fashion_mnist_dir) -> None:
    from lightning_template.tasks.classification import ConfusionMatrixImage

    class LossOnly(SimpleCNN):
        def validation_step(self, batch, batch_idx):
            return self.loss_fn(self(batch[0]), batch[1])

    with pytest.warns(UserWarning, match=r"no confusion matrix .* does not return .*models.base.EvalOutput"):
        quick_trainer(callbacks=[ConfusionMatrixImage()]).fit(LossOnly(), datamodule=FashionMNISTDataModule())


class PoisonBatch(Callback):
    """NaN into the inputs of one batch (by its index in the epoch)."""

    def __init__(self, batch_idx: int) -> None:
        self.batch_idx = batch_idx

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if batch_idx == self.batch_idx:
            batch[0].fill_(float("nan"))


@pytest.mark.slow
def test_a_nan_inside_an_accumulated_step_names_its_own_micro_batch(quick_trainer, fashion_mnist_dir) -> None:
    """Accumulating 4 micro-batches, the NaN of batch 2 is found at the step (after batch 3): named as batch 2."""
    trainer = quick_trainer(accumulate_grad_batches=4, callbacks=[FiniteLossGuard(), PoisonBatch(2)])
    with pytest.raises(NonFiniteLossError, match=r"Loss became nan in epoch 0, batch_idx 2 \(optimizer step 0\)"):
        trainer.fit(SimpleCNN(), datamodule=FashionMNISTDataModule())


@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
def test_a_loss_of_one_element_in_any_shape_is_guarded(quick_trainer, nan: bool) -> None:
    """backward() and Lightning take a loss of shape [1] as a scalar: the guard trains on it, and stops at its NaN."""
    from lightning.pytorch.demos.boring_classes import BoringModel

    class OneElementLoss(BoringModel):
        def training_step(self, batch, batch_idx):
            loss = self.step(batch).reshape(1)
            return loss * float("nan") if nan else loss

    trainer = quick_trainer(callbacks=[FiniteLossGuard()])
    if nan:
        with pytest.raises(NonFiniteLossError, match=r"Loss became .*nan.* in epoch 0, batch_idx 0"):
            trainer.fit(OneElementLoss())
    else:
        trainer.fit(OneElementLoss())
        assert trainer.global_step == 4


def test_an_infinite_gradient_of_a_finite_loss_stops_before_the_step(quick_trainer) -> None:
    from lightning.pytorch.demos.boring_classes import BoringModel

    class InfiniteGradient(BoringModel):
        def on_after_backward(self) -> None:
            if self.trainer.global_step == 2:
                self.layer.bias.grad[1] = float("-inf")

    model = InfiniteGradient()
    trainer = quick_trainer(callbacks=[FiniteLossGuard()])
    with pytest.raises(NonFiniteLossError, match=r"A gradient became non-finite \(the loss was finite\) in epoch 0"):
        trainer.fit(model)
    assert trainer.global_step == 2 and torch.isfinite(model.layer.bias).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.complex64])
def test_the_finiteness_check_finds_each_nan_or_inf_and_leaves_the_tensors_as_they_were(dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    gradient = torch.randn(6, 5, generator=generator).to(dtype).t()  # not contiguous
    if dtype == torch.float64:
        gradient[0, 0] = 1e300  # finite, beyond float32's range and any sum of squares
    # An nn.Embedding(sparse=True)'s gradient:
    sparse = torch.sparse_coo_tensor([[0, 3]], [1.0, 2.0], (5,), check_invariants=True)
    tensors = [gradient, torch.randn(7, generator=generator), sparse, torch.tensor(3.0)]  # the last one: a loss
    tensors[1][2] = 1e-40  # a subnormal float32: kept, bit for bit
    before = [t.clone() for t in tensors]
    _unit_scale.cache_clear()
    torch.set_default_dtype(
        torch.float64
    )  # as under `--trainer.precision 64-true`: the check's own tensors keep theirs
    try:
        assert all_finite(tensors)
    finally:
        torch.set_default_dtype(torch.float32)
    assert all(
        torch.equal(t.to_dense(), b.to_dense()) and t.dtype == b.dtype for t, b in zip(tensors, before, strict=True)
    )
    for which, index in ((0, (4, 1)), (1, 6), (2, None), (3, ())):
        for bad in (float("nan"), float("inf"), float("-inf")):
            spoiled = [t.clone() for t in tensors]
            if index is None:
                spoiled[which] = torch.sparse_coo_tensor([[0, 3]], [1.0, bad], (5,), check_invariants=True)
            else:
                spoiled[which][index] = bad
            assert not all_finite(spoiled), (which, bad)


def test_a_16_bit_image_is_scaled_not_clipped_and_a_float_one_is_named(tmp_path: Path) -> None:
    """Pillow's own conversion clips 16-bit gray at 255: a 0..65535 gradient would come back almost white."""
    gradient = np.tile(np.linspace(0, 65535, 64).astype(np.uint16), (16, 1))
    Image.fromarray(gradient).save(tmp_path / "deep.png")
    pixels = np.asarray(load_rgb(str(tmp_path / "deep.png")))
    assert pixels.shape == (16, 64, 3) and pixels[0, 0, 0] == 0 and pixels[0, -1, 0] == 255
    assert abs(pixels.mean() - 127.5) < 2  # the gradient, not 99.6% white
    Image.fromarray(np.ones((8, 8), dtype=np.float32)).save(tmp_path / "float.tiff")
    with pytest.raises(CorruptImageError, match=r"float.tiff: float pixels, whose range is unknown"):
        load_rgb(str(tmp_path / "float.tiff"))


def test_a_csv_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" starts with a byte-order mark; it is not part of the first column's name."""
    (tmp_path / "train.csv").write_text("text,label\nhello there,a\nbye now,b\n", encoding="utf-8-sig")
    assert read_records(tmp_path / "train.csv", "text", "label") == [("hello there", "a"), ("bye now", "b")]
