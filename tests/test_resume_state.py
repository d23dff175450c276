"""State a resumed run must find as the run never stopped left it, where Lightning's restored loop or the checkpoint
does not give it back: an epoch restored at its end with `max_steps`, the time
`--trainer.max_time` allows."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from lightning import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_template.engine import ExactResume, ResumeCheckpoint
from lightning_template.engine.lightning_internals import finish_restarted_epoch, restart_time_budgets

from tests.helpers import same_state

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
    full = fit_epochs(tmp_path / "full", [ExactResume(), ResumeCheckpoint(dirpath=tmp_path / "full")])
    resumed = fit_epochs(
        tmp_path / "cut", [ExactResume(), ResumeCheckpoint(dirpath=tmp_path / "cut")], tmp_path / "full/epoch=1.ckpt"
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
    stopped = fit_for_half_a_second(tmp_path, [ExactResume()])
    assert 0 < stopped < 12
    assert fit_for_half_a_second(tmp_path, [ExactResume()], resume=True) > stopped


def test_restart_time_budgets_gives_a_resumed_run_its_max_time_again(tmp_path: Path) -> None:
    stopped = fit_for_half_a_second(tmp_path, [RestartTimeBudgets()])
    assert fit_for_half_a_second(tmp_path, [RestartTimeBudgets()], resume=True) > stopped
