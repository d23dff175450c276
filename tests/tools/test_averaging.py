"""Weight averaging (configs/presets/ema.yaml, swa.yaml): exact resume, checkpoints hold the average,
two-stage fine-tuning alongside (the presets through train.py: tests/test_tools.py)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from lightning import Callback, Trainer, seed_everything

from lightning_template.engine import ResumeCheckpoint, exact_resume
from lightning_template.tasks.classification import FashionMNISTDataModule, SimpleCNN, TwoStageFinetuning
from lightning_template.tools import EMAWeightAveraging, SWAWeightAveraging

from tests.conftest import save_random_weights
from tests.helpers import SignalAtBatch, StopAfterEpoch, same_state


def _fit(directory: Path, averaging: Callback, *callbacks: Callback, ckpt_path: str | None = None, weights=None):
    seed_everything(5)
    model = SimpleCNN(warmup_epochs=0.5, weights=weights)
    trainer = Trainer(
        max_epochs=3, limit_train_batches=4, limit_val_batches=2, logger=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True, num_sanity_val_steps=0,
        callbacks=[averaging, *exact_resume(), ResumeCheckpoint(dirpath=directory), *callbacks],
    )  # fmt: skip
    trainer.fit(model, datamodule=FashionMNISTDataModule(batch_size=32, augment=True), ckpt_path=ckpt_path)
    return trainer


def _states(trainer: Trainer, averaging: Callback) -> tuple[dict, dict]:
    live = {k: v.clone() for k, v in trainer.lightning_module.state_dict().items()}
    return live, {k: v.clone() for k, v in averaging._average_model.state_dict().items()}


AVERAGING = {
    "ema": lambda: EMAWeightAveraging(decay=0.9),
    "swa": lambda: SWAWeightAveraging(swa_epoch_start=1),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(AVERAGING))
def test_averaged_run_stopped_mid_epoch_resumes_exactly(kind: str, tmp_path: Path, fashion_mnist_dir) -> None:
    full_averaging = AVERAGING[kind]()
    full = _fit(tmp_path / "full", full_averaging)
    with pytest.raises(SystemExit):  # SIGTERM in epoch 1, after the average has started
        _fit(tmp_path / "cut", AVERAGING[kind](), SignalAtBatch(epoch=2, batch=1, signum=signal.SIGTERM))
    checkpoint = torch.load(tmp_path / "cut" / "last.ckpt", weights_only=True)
    # The checkpoint's state_dict is the average; the live weights are kept beside it for resuming.
    assert "current_model_state" in checkpoint and "averaging_state" in checkpoint
    assert not same_state(checkpoint["state_dict"], checkpoint["current_model_state"])
    resumed_averaging = AVERAGING[kind]()
    resumed = _fit(tmp_path / "cut", resumed_averaging, ckpt_path=str(tmp_path / "cut" / "last.ckpt"))
    (full_live, full_average), (resumed_live, resumed_average) = (
        _states(full, full_averaging),
        _states(resumed, resumed_averaging),
    )
    assert same_state(full_live, resumed_live)
    assert same_state(full_average, resumed_average)
    assert full.callback_metrics["val_acc"].item() == resumed.callback_metrics["val_acc"].item()
    # After fit the model holds the average.
    assert same_state(full_live, {k[len("module.") :]: v for k, v in full_average.items() if k.startswith("module.")})
    # Testing a checkpoint right after fit (test_after_fit) tests its state_dict, the average, not the live weights.
    full.test(full.lightning_module, datamodule=full.datamodule, ckpt_path=str(tmp_path / "full" / "last.ckpt"))
    saved = torch.load(tmp_path / "full" / "last.ckpt", weights_only=True)
    assert same_state(full.lightning_module.state_dict(), saved["state_dict"])
    assert not same_state(saved["state_dict"], saved["current_model_state"])


def test_the_average_counts_once_it_holds_weights(tmp_path: Path) -> None:
    """Whether the average holds weights is read from WeightAveraging's public hooks: SWA's update at its start
    epoch's last batch, and an update at an epoch's end by a subclass's own should_update (Lightning's way to
    choose when to average)."""

    class SecondEpochEnd(EMAWeightAveraging):
        def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
            return epoch_idx == 1

    class Seen(Callback):  # after the averaging's hooks (callbacks run in their order)
        def __init__(self, averaging: Callback) -> None:
            self.averaging, self.seen = averaging, []

        def on_train_epoch_end(self, trainer: Trainer, pl_module) -> None:
            self.seen.append((self.averaging.averaged, int(self.averaging._average_model.n_averaged)))

    images, labels = torch.randn(32, 1, 28, 28), torch.arange(32) % 4
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=8)
    for averaging in (SWAWeightAveraging(swa_epoch_start=1), SecondEpochEnd()):
        seen = Seen(averaging)
        trainer = Trainer(max_epochs=2, limit_val_batches=0, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False,
                          callbacks=[averaging, seen])  # fmt: skip
        trainer.fit(SimpleCNN(num_classes=4, input_shape=(1, 28, 28)), train_dataloaders=loader)
        assert seen.seen == [(False, 0), (True, 1)], type(averaging).__name__


@pytest.mark.slow
def test_swa_stays_out_of_the_way_before_its_start(tmp_path: Path, fashion_mnist_dir) -> None:
    """Before swa_epoch_start nothing is averaged: validation and checkpoints are the live weights,
    never the initial model that the not-yet-updated average still holds."""
    averaging = SWAWeightAveraging(swa_epoch_start=2)
    trainer = _fit(tmp_path, averaging, StopAfterEpoch(0))
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert "current_model_state" not in checkpoint
    assert same_state(checkpoint["state_dict"], trainer.lightning_module.state_dict())
    assert trainer.callback_metrics["val_acc"].item() > 0.3  # the initial model scores about 0.1


@pytest.mark.slow
def test_ema_with_two_stage_finetuning_resumes_in_stage_two(tmp_path: Path, fashion_mnist_dir) -> None:
    weights = str(save_random_weights(SimpleCNN, tmp_path / "net.pth"))

    def stage(**kw) -> TwoStageFinetuning:
        return TwoStageFinetuning(unfreeze_at_epoch=1, **kw)

    full_ema = EMAWeightAveraging(decay=0.9)
    full = _fit(tmp_path / "full", full_ema, stage(), weights=weights)
    with pytest.raises(SystemExit):
        stop = SignalAtBatch(epoch=2, batch=1, signum=signal.SIGTERM)
        _fit(tmp_path / "cut", EMAWeightAveraging(decay=0.9), stage(), stop, weights=weights)
    resumed_ema = EMAWeightAveraging(decay=0.9)
    resumed = _fit(tmp_path / "cut", resumed_ema, stage(), ckpt_path=str(tmp_path / "cut/last.ckpt"), weights=weights)
    assert same_state(_states(full, full_ema)[1], _states(resumed, resumed_ema)[1])
    assert same_state(_states(full, full_ema)[0], _states(resumed, resumed_ema)[0])
