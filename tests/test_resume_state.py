"""State a resumed run must find as the run never stopped left it, where Lightning's restored loop or the checkpoint
does not give it back: an epoch restored at its end with `max_steps`, the time
`--trainer.max_time` allows."""

from __future__ import annotations

import contextlib
import signal
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader
from torchmetrics import MeanMetric

from lightning_template.engine import ResumeCheckpoint, UnsavedState, exact_resume
from lightning_template.engine.errors import ConfigError
from lightning_template.engine.lightning_internals import finish_restarted_epoch, restart_time_budgets
from lightning_template.engine.unsaved_state import unsaved_values
from lightning_template.tasks.classification import FashionMNISTDataModule, SimpleCNN

from tests.helpers import SignalAtBatch, same_state

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


class EpochCounter(BoringModel):
    """Counts its epochs in a buffer and halves its loss's weight at each epoch's end (an annealing)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("epochs", torch.zeros((), dtype=torch.long))
        self.register_buffer("weight", torch.ones(()))

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        return {"loss": super().training_step(batch, batch_idx)["loss"] * self.weight}

    def on_train_epoch_end(self) -> None:
        self.epochs += 1
        self.weight *= 0.5


def fit_epochs(folder: Path, callbacks: list[Callback], ckpt_path: Path | None = None, **settings: Any) -> Trainer:
    """3 epochs of 4 batches by `max_steps`, a checkpoint at each epoch's end (`epoch=N.ckpt`)."""
    every_epoch = ModelCheckpoint(folder, "{epoch}", save_top_k=-1, save_on_train_epoch_end=True)
    settings = {"max_steps": 12, "limit_train_batches": 4, "limit_val_batches": 2, **QUIET, **settings}
    trainer = Trainer(default_root_dir=folder, callbacks=[*callbacks, every_epoch], **settings)
    seed_everything(7)  # BoringModel's data: drawn when its loader is made
    trainer.fit(EpochCounter(), ckpt_path=ckpt_path)
    return trainer


def test_a_run_with_max_steps_resumed_at_an_epochs_end_ends_that_epoch_once(tmp_path: Path) -> None:
    """Lightning ran the restored epoch's end again: a module counting epochs ended with (4, 0.0625), not (3, 0.125)."""
    full = fit_epochs(tmp_path / "full", [*exact_resume(), ResumeCheckpoint(dirpath=tmp_path / "full")])
    resumed = fit_epochs(
        tmp_path / "cut", [*exact_resume(), ResumeCheckpoint(dirpath=tmp_path / "cut")], tmp_path / "full/epoch=1.ckpt"
    )
    module = resumed.lightning_module
    assert (module.epochs.item(), module.weight.item()) == (3, 0.125)
    assert same_state(full.lightning_module.state_dict(), module.state_dict())
    assert resumed.fit_loop.epoch_progress.current.processed == full.fit_loop.epoch_progress.current.processed == 3


class FinishRestartedEpoch(Callback):
    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.finished = finish_restarted_epoch(trainer)


def test_finish_restarted_epoch_ends_an_epoch_restored_at_its_end_once(tmp_path: Path) -> None:
    finish = FinishRestartedEpoch()
    fit_epochs(tmp_path, [finish])
    assert not finish.finished  # a run from its start
    resumed = fit_epochs(tmp_path / "resumed", [finish], tmp_path / "epoch=1.ckpt")
    assert finish.finished and resumed.lightning_module.epochs.item() == 3 and resumed.global_step == 12
    with_max_epochs = fit_epochs(tmp_path / "epochs", [finish], tmp_path / "epoch=1.ckpt", max_steps=-1, max_epochs=3)
    assert not finish.finished and with_max_epochs.lightning_module.epochs.item() == 3  # Lightning's own resume


class SlowSteps(Callback):
    """A step of 0.2 s at least: `--trainer.max_time` of half a second stops the run after its third step at most."""

    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(0.2)


class RestartTimeBudgets(Callback):
    def on_load_checkpoint(self, trainer: Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        restart_time_budgets(trainer, checkpoint)


def fit_for_half_a_second(folder: Path, callbacks: list[Callback], resume: bool = False) -> int:
    """2 epochs of 6 batches, or half a second of training, with `last.ckpt`; the global step it ends at."""
    settings = {"max_epochs": 2, "limit_train_batches": 6, "limit_val_batches": 2, "max_time": {"seconds": 0.5}}
    last = ModelCheckpoint(folder, save_last=True, save_top_k=0)
    trainer = Trainer(default_root_dir=folder, callbacks=[*callbacks, last, SlowSteps()], **settings, **QUIET)
    seed_everything(7)
    trainer.fit(BoringModel(), ckpt_path=folder / "last.ckpt" if resume else None)
    return trainer.global_step


def test_a_run_stopped_by_max_time_goes_on_when_resumed(tmp_path: Path) -> None:
    """Lightning's Timer restored the time trained: the resumed run trained nothing and ended as if finished."""
    stopped = fit_for_half_a_second(tmp_path, exact_resume())
    assert 0 < stopped < 12
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fit_for_half_a_second(tmp_path, exact_resume(), resume=True) > stopped
    # It spoke of a step checkpoint nobody configured, written before a validation it said was skipped.
    assert not [w for w in caught if str(w.message).startswith("ExactResume")], [str(w.message) for w in caught]


def test_restart_time_budgets_gives_a_resumed_run_its_max_time_again(tmp_path: Path) -> None:
    stopped = fit_for_half_a_second(tmp_path, [RestartTimeBudgets()])
    assert fit_for_half_a_second(tmp_path, [RestartTimeBudgets()], resume=True) > stopped


class Annealed(BoringModel):
    """Anneals its loss by a plain counter and a buffer registered with `persistent=False`, both updated every step."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("decay", torch.ones(()), persistent=False)
        self.seen = 0

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        self.seen += 1
        self.decay *= 0.9
        return {"loss": super().training_step(batch, batch_idx)["loss"] * self.decay / self.seen}


class AnnealedAndKept(Annealed):
    """The same, keeping both in the checkpoint."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["annealing"] = {"seen": self.seen, "decay": self.decay.clone()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.seen, self.decay = checkpoint["annealing"]["seen"], checkpoint["annealing"]["decay"]


def fit_annealed(folder: Path, make: type[Annealed], stop: bool = False) -> tuple[Trainer, list[str]]:
    """2 epochs of 6 batches; `stop`: a SIGTERM after batch 2 of epoch 1, else resumed from last.ckpt if there is
    one. The engine's warnings."""
    stops = [SignalAtBatch(epoch=1, batch=2, signum=signal.SIGTERM)] if stop else []
    callbacks = [*exact_resume(), ResumeCheckpoint(dirpath=folder), UnsavedState(), *stops]
    trainer = Trainer(max_epochs=2, limit_train_batches=6, limit_val_batches=2, callbacks=callbacks, **QUIET)
    seed_everything(7)
    last = folder / "last.ckpt"
    with warnings.catch_warnings(record=True) as caught, contextlib.suppress(SystemExit):
        warnings.simplefilter("always")
        trainer.fit(make(), ckpt_path=last if last.exists() and not stop else None)
    return trainer, [str(w.message) for w in caught if str(w.message).startswith("ExactResume")]


@pytest.mark.parametrize("make", [Annealed, AnnealedAndKept], ids=["unsaved", "kept-by-the-module"])
def test_state_no_checkpoint_holds_is_named_at_the_resume(make: type[Annealed], tmp_path: Path) -> None:
    """A plain counter and a buffer registered with persistent=False, updated every step: the resumed run differed
    without a word."""
    full, _ = fit_annealed(tmp_path / "full", make)
    fit_annealed(tmp_path / "cut", make, stop=True)
    resumed, told = fit_annealed(tmp_path / "cut", make)
    exact = same_state(full.lightning_module.state_dict(), resumed.lightning_module.state_dict())
    if make is AnnealedAndKept:
        assert exact and told == [], told
        return
    assert not exact and len(told) == 1, told
    assert told[0].startswith("ExactResume: the module's decay, seen changed during the run that wrote the checkpoint")
    assert "on_save_checkpoint/on_load_checkpoint, or register them as persistent buffers" in told[0]


def test_unsaved_values_are_buffers_left_out_of_the_state_dict_and_plain_attributes() -> None:
    module = Annealed()
    module.metric = MeanMetric()  # its states are plain attributes too, which EpochMetrics keeps
    module.register_buffer("kept", torch.zeros(()))
    module._private = 1
    lightnings = ["allow_zero_length_dataloader_with_multiple_devices", "prepare_data_per_node"]
    assert sorted(unsaved_values(module)) == sorted(
        [*lightnings, "decay", "layer.in_features", "layer.out_features", "seen"]
    )


class ShuffledBoring(BoringModel):
    """BoringModel's data in a shuffled DataLoader: Lightning turns the shuffle off under --trainer.overfit_batches."""

    def __init__(self, batch_size: int = 2) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64), batch_size=self.batch_size, shuffle=True)


def fit_overfit(folder: Path, fit: Callable[[], dict[str, Any]], stop_at: int | None, **settings: Any) -> Trainer:
    """`fit()`'s model (and datamodule), made after seeding, overfit by `settings`; `stop_at`: a SIGTERM after that
    batch of epoch 1, else resumed from last.ckpt where there is one."""
    stops = [SignalAtBatch(epoch=1, batch=stop_at, signum=signal.SIGTERM)] if stop_at is not None else []
    callbacks = [*exact_resume(), ResumeCheckpoint(dirpath=folder), *stops]
    trainer = Trainer(callbacks=callbacks, **settings, **QUIET)
    seed_everything(7)
    last = folder / "last.ckpt"
    with contextlib.suppress(SystemExit):
        trainer.fit(**fit(), ckpt_path=last if last.exists() and not stops else None)
    return trainer


def test_overfit_batches_resumed_inside_an_epoch_is_exact(tmp_path: Path) -> None:
    """Lightning's sequential sampler took the engine's place and the resumed run trained the epoch's first batches
    again, while the resume said it continued after them."""
    settings = dict(max_epochs=3, overfit_batches=4, limit_val_batches=2)
    full = fit_overfit(tmp_path / "full", lambda: {"model": ShuffledBoring()}, None, **settings)
    fit_overfit(tmp_path / "cut", lambda: {"model": ShuffledBoring()}, 1, **settings)
    assert (
        torch.load(tmp_path / "cut/last.ckpt", weights_only=True)["global_step"] == 4 + 3
    )  # the stop comes at the next step
    resumed = fit_overfit(tmp_path / "cut", lambda: {"model": ShuffledBoring()}, None, **settings)
    assert resumed.global_step == full.global_step == 12
    assert same_state(full.lightning_module.state_dict(), resumed.lightning_module.state_dict())


def as_written_before_the_split(path: Path) -> None:
    """A checkpoint in the layout of the engine whose ExactResume was the one callback of exact resume: the state
    of ResumableBatches (the batches' shape) inside ExactResume's."""
    checkpoint = torch.load(path, weights_only=True)
    states = checkpoint["callbacks"]
    states["ExactResume"] = {**states.pop("ResumableBatches"), **states["ExactResume"]}
    torch.save(checkpoint, path)


def test_a_checkpoint_written_before_the_split_resumes_exactly_and_keeps_its_batches(tmp_path: Path) -> None:
    """Written inside an epoch with all of exact resume's state under ExactResume: resumed as the run never stopped,
    and refused with another batch size, as when it was written."""
    settings = dict(max_epochs=2, overfit_batches=4, limit_val_batches=1)
    full = fit_overfit(tmp_path / "full", lambda: {"model": ShuffledBoring()}, None, **settings)
    fit_overfit(tmp_path / "cut", lambda: {"model": ShuffledBoring()}, 1, **settings)
    as_written_before_the_split(tmp_path / "cut/last.ckpt")
    (tmp_path / "other").mkdir()
    (tmp_path / "other/last.ckpt").write_bytes((tmp_path / "cut/last.ckpt").read_bytes())
    resumed = fit_overfit(tmp_path / "cut", lambda: {"model": ShuffledBoring()}, None, **settings)
    assert resumed.global_step == full.global_step == 8
    assert same_state(full.lightning_module.state_dict(), resumed.lightning_module.state_dict())
    with pytest.raises(ConfigError, match="other batches \\(batch_size 2 -> 4\\)"):
        fit_overfit(tmp_path / "other", lambda: {"model": ShuffledBoring(batch_size=4)}, None, **settings)


def the_task() -> dict[str, Any]:
    """The project's own task (its datamodule's EpochSampler)."""
    datamodule = FashionMNISTDataModule(batch_size=16, augment=True)
    return {"model": SimpleCNN(), "datamodule": datamodule}


@pytest.mark.slow
def test_overfit_batches_of_a_task_resumed_inside_an_epoch_is_exact(tmp_path: Path, fashion_mnist_dir) -> None:
    """configs/presets/overfit.yaml on simple_cnn differed in 14 tensors: the datamodule's EpochSampler was replaced."""
    settings = dict(max_epochs=2, overfit_batches=3, limit_val_batches=1)
    full = fit_overfit(tmp_path / "full", the_task, None, **settings)
    fit_overfit(tmp_path / "cut", the_task, 0, **settings)
    assert torch.load(tmp_path / "cut/last.ckpt", weights_only=True)["global_step"] == 3 + 2
    resumed = fit_overfit(tmp_path / "cut", the_task, None, **settings)
    assert resumed.global_step == full.global_step == 6
    assert same_state(full.lightning_module.state_dict(), resumed.lightning_module.state_dict())
