"""Exact resume: an interrupted run, resumed from its checkpoint, ends bit-identical to one never stopped.

The fault-injection matrix (tests/matrix.py) crosses data (in memory without workers, image
files with 2 workers), gradient accumulation (1, 2), the interruption (epoch end, step
checkpoint, mid-epoch validation checkpoint, SIGTERM mid-epoch, SIGKILL) and the model
(plain, two-stage fine-tuning stopped in stage 1 or in stage 2). `make test` runs 15 cells
that cover every pair of factor values; `pytest -m matrix` runs all 60 and prints the table.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from callbacks import ExactResume, ResumeCheckpoint
from callbacks.exact_resume import rng_states, set_rng_states
from datamodules import FashionMNISTDataModule
from models import SimpleCNN
from tests import matrix
from tests.helpers import SignalAtBatch, StopAfterEpoch, same_state

RESULTS: dict[str, str] = {}


def _outcome(trainer: Trainer) -> dict[str, Any]:
    state = {k: v.clone() for k, v in trainer.lightning_module.state_dict().items()}
    metrics = {k: trainer.callback_metrics[k].item() for k in ("val_loss", "val_acc")}
    return {"state": state, "metrics": metrics, "global_step": trainer.global_step}


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, dict[str, Any]]:
    return {}


def _run_cell(cell: matrix.Cell, tmp_path: Path, image_root: Path, references: dict) -> None:
    key = (cell.data, cell.accumulate, cell.stage, cell.trigger == "mid-epoch-validation")
    if key not in references:
        references[key] = _outcome(matrix.fit(cell, tmp_path / "uninterrupted", image_root))
    expected = references[key]
    checkpoint = matrix.interrupt(cell, tmp_path / "run", image_root)
    resumed = _outcome(matrix.fit(cell, tmp_path / "run", image_root, ckpt_path=str(checkpoint)))
    exact = same_state(expected["state"], resumed["state"]) and expected["metrics"] == resumed["metrics"]
    RESULTS[cell.id] = "exact" if exact else "DIFFERS"
    assert resumed["global_step"] == expected["global_step"]
    assert same_state(expected["state"], resumed["state"]), f"{cell.id}: weights differ"
    assert resumed["metrics"] == expected["metrics"], f"{cell.id}: metrics differ"


@pytest.mark.slow
@pytest.mark.parametrize("cell", matrix.pairwise_cells(), ids=lambda c: c.id)
def test_resume_is_exact_in_every_pair_of_setups(cell, tmp_path, image_tree, references, fashion_mnist_dir) -> None:
    _run_cell(cell, tmp_path, image_tree, references)


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.parametrize("cell", matrix.all_cells(), ids=lambda c: c.id)
def test_resume_matrix(cell, tmp_path, image_tree, references, fashion_mnist_dir) -> None:
    _run_cell(cell, tmp_path, image_tree, references)


def teardown_module() -> None:
    if len(RESULTS) > 1:
        print(
            "\n\nexact-resume matrix\n" + "\n".join(f"{cell:<60} {result}" for cell, result in sorted(RESULTS.items()))
        )


# -- single regressions, fast --------------------------------------------------------------------


def _fit(directory: Path, *callbacks, ckpt_path: str | None = None, **trainer_kwargs) -> Trainer:
    seed_everything(3)
    datamodule = FashionMNISTDataModule(batch_size=trainer_kwargs.pop("batch_size", 32), augment=True)
    model = SimpleCNN(warmup_epochs=0.5)  # dropout + augmentation + shuffling all draw random numbers
    settings = dict(
        max_epochs=3, limit_train_batches=8, limit_val_batches=2, logger=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True, num_sanity_val_steps=0,
    )  # fmt: skip
    callbacks = [ExactResume(), ResumeCheckpoint(dirpath=directory), *callbacks]
    trainer = Trainer(**{**settings, **trainer_kwargs}, callbacks=callbacks)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


def test_sigint_stops_gracefully_and_restores_the_handler(tmp_path: Path, fashion_mnist_dir) -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit):  # Lightning's graceful stop after the current step
            _fit(tmp_path, SignalAtBatch(epoch=1, batch=4, signum=signal.SIGINT))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 8 + 5


def test_sigterm_inside_an_accumulation_window_stops_at_its_end(tmp_path: Path, fashion_mnist_dir) -> None:
    with pytest.raises(SystemExit):
        _fit(tmp_path, SignalAtBatch(epoch=0, batch=2, signum=signal.SIGTERM), accumulate_grad_batches=2)
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 2  # after batch 4 (the window's end), not after batch 3
    assert checkpoint["callbacks"]["ExactResume"]["batches_done"] == 4


def test_step_checkpoint_resumes_at_the_next_batch(tmp_path: Path, fashion_mnist_dir) -> None:
    """A checkpoint written in on_train_batch_end (every_n_train_steps) resumes after that batch, not one earlier."""
    full = _fit(tmp_path / "full")
    steps = ModelCheckpoint(dirpath=tmp_path / "cut", filename="{step}", every_n_train_steps=3, save_top_k=-1)
    _fit(tmp_path / "cut", steps, StopAfterEpoch(1))
    resumed = _fit(tmp_path / "cut", ckpt_path=str(tmp_path / "cut" / "step=12.ckpt"))
    assert same_state(full.lightning_module.state_dict(), resumed.lightning_module.state_dict())


def test_mid_epoch_validation_checkpoint_resumes_in_its_own_epoch(tmp_path: Path, fashion_mnist_dir) -> None:
    """val_check_interval < 1: the last checkpoint of epoch 0 is written at its last validation, inside the
    epoch; the resumed run must not apply the skip to epoch 1."""
    full = _fit(tmp_path / "full", max_epochs=2, val_check_interval=0.5)
    _fit(tmp_path / "cut", StopAfterEpoch(0), max_epochs=2, val_check_interval=0.5)
    resumed = _fit(tmp_path / "cut", max_epochs=2, val_check_interval=0.5, ckpt_path=str(tmp_path / "cut/last.ckpt"))
    assert same_state(full.lightning_module.state_dict(), resumed.lightning_module.state_dict())
    assert full.callback_metrics["val_loss"].item() == resumed.callback_metrics["val_loss"].item()


def test_other_batch_size_mid_epoch_is_refused_with_the_fix(tmp_path: Path, fashion_mnist_dir) -> None:
    with pytest.raises(SystemExit):
        _fit(tmp_path, SignalAtBatch(epoch=0, batch=3, signum=signal.SIGTERM))
    with pytest.raises(ValueError, match=r"batch_size 32 -> 16.*original --data.batch_size"):
        _fit(tmp_path, batch_size=16, ckpt_path=str(tmp_path / "last.ckpt"))


def test_longer_run_after_resume_follows_the_new_schedule(tmp_path: Path, fashion_mnist_dir) -> None:
    """Resume with a larger max_epochs: the cosine decays to the new end, not to 0 at the old one."""
    full, resumed = LearningRates(), LearningRates()
    _fit(tmp_path / "full", full, max_epochs=4)
    _fit(tmp_path / "cut", max_epochs=2)
    with pytest.warns(UserWarning, match=r"schedule changed since the checkpoint"):
        _fit(tmp_path / "cut", resumed, max_epochs=4, ckpt_path=str(tmp_path / "cut/last.ckpt"))
    assert resumed.lrs[16] > 0  # on the new cosine, not at the end of the old one
    assert [resumed.lrs[step] for step in range(16, 32)] == pytest.approx([full.lrs[step] for step in range(16, 32)])


class LearningRates(Callback):
    """The learning rate each optimizer step uses."""

    def __init__(self) -> None:
        self.lrs: dict[int, float] = {}

    def on_train_batch_start(self, trainer: Trainer, pl_module, batch, batch_idx: int) -> None:
        self.lrs[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]


def test_rng_state_of_this_device_only(monkeypatch) -> None:
    """Each rank saves its own CUDA generator; restoring needs only the device it runs on. (No GPU here:
    the CUDA generator functions are stood in by ones that act on a single CPU generator.)"""
    device_state = torch.random.get_rng_state()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": device_state.clone())
    restored = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append(state))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("saved every device's state"))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: pytest.fail("restored every device"))
    states = rng_states()
    set_rng_states(states)
    assert torch.equal(states["cuda"], device_state) and len(restored) == 1


def test_same_seed_same_run_and_another_seed_another(tmp_path: Path, fashion_mnist_dir) -> None:
    runs = []
    for seed in (7, 7, 8):
        seed_everything(seed)
        trainer = Trainer(
            max_epochs=1, limit_train_batches=6, limit_val_batches=2, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, deterministic=True, callbacks=[ExactResume()],
        )  # fmt: skip
        trainer.fit(SimpleCNN(), datamodule=FashionMNISTDataModule(batch_size=32, augment=True))
        runs.append((trainer.callback_metrics["val_loss"].item(), trainer.lightning_module.state_dict()))
    assert runs[0][0] == runs[1][0] and same_state(runs[0][1], runs[1][1])
    assert runs[0][0] != runs[2][0]  # the seed matters, so the check above is real
