"""Exact resume: an interrupted run, resumed from its checkpoint, ends bit-identical to one never stopped.

The fault-injection matrix (tests/matrix.py) crosses the data (its DATA: in memory without workers, image files with 2
workers, ...), gradient accumulation (1, 2), the interruption (epoch end, step checkpoint, mid-epoch validation
checkpoint, SIGTERM mid-epoch, SIGKILL) and the model (plain, two-stage fine-tuning stopped in stage 1 or in stage 2),
with a user's own plain task beside them. `make test` runs 15 cells that cover every pair of factor values;
`pytest -m matrix` runs them all and prints the table.
"""

from __future__ import annotations

import copy
import itertools
import pickle
import signal
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, TensorDataset

from lightning_template.engine import ExactResume, ResumeCheckpoint, exact_resume
from lightning_template.engine.sampling import resumable_loader
from lightning_template.tasks.classification import FashionMNISTDataModule, SimpleCNN

from tests import matrix
from tests.helpers import SignalAtBatch, StopAfterEpoch, same_state

RESULTS: dict[str, str] = {}


def _outcome(trainer: Trainer) -> dict[str, Any]:
    state = {k: v.clone() for k, v in trainer.lightning_module.state_dict().items()}
    metrics = {k: v.item() for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
    assert "val_loss" in metrics
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


def _fit(
    directory: Path, *callbacks, ckpt_path: str | None = None, resume: list[Callback] | None = None, **trainer_kwargs
) -> Trainer:
    seed_everything(3)
    datamodule = FashionMNISTDataModule(batch_size=trainer_kwargs.pop("batch_size", 32), augment=True)
    model = SimpleCNN(warmup_epochs=0.5)  # dropout + augmentation + shuffling all draw random numbers
    settings = dict(
        max_epochs=3, limit_train_batches=8, limit_val_batches=2, logger=False, enable_progress_bar=False,
        enable_model_summary=False, deterministic=True, num_sanity_val_steps=0,
    )  # fmt: skip
    callbacks = [*(resume or exact_resume()), ResumeCheckpoint(dirpath=directory), *callbacks]
    trainer = Trainer(**{**settings, **trainer_kwargs}, callbacks=callbacks)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer


@pytest.mark.slow
def test_sigint_stops_gracefully_and_restores_the_handler(tmp_path: Path, fashion_mnist_dir) -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit):  # Lightning's graceful stop, at the next step boundary
            _fit(tmp_path, SignalAtBatch(epoch=1, batch=4, signum=signal.SIGINT))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    # Signalled after GracefulStop looked at batch 4's end: the stop comes at the next boundary.
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 8 + 6


@pytest.mark.slow
def test_a_stop_request_ends_with_the_run_that_received_it(tmp_path: Path, fashion_mnist_dir) -> None:
    """The same callbacks in a later fit of the process (a notebook, a test) do not stop on an old SIGTERM."""
    resume = exact_resume()
    with pytest.raises(SystemExit):
        _fit(tmp_path, SignalAtBatch(epoch=0, batch=3, signum=signal.SIGTERM), resume=resume, max_epochs=1)
    resumed = _fit(tmp_path, resume=resume, max_epochs=1, ckpt_path=str(tmp_path / "last.ckpt"))
    assert resumed.global_step == 8


@pytest.mark.slow
def test_sigterm_inside_an_accumulation_window_stops_at_its_end(tmp_path: Path, fashion_mnist_dir) -> None:
    with pytest.raises(SystemExit):
        _fit(tmp_path, SignalAtBatch(epoch=0, batch=2, signum=signal.SIGTERM), accumulate_grad_batches=2)
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 2  # after batch 4 (the window's end), not after batch 3
    assert checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["processed"] == 4


@pytest.mark.slow
def test_step_checkpoint_resumes_at_the_next_batch(tmp_path: Path, fashion_mnist_dir) -> None:
    """A checkpoint written in on_train_batch_end (every_n_train_steps) resumes after that batch, not one earlier."""
    full = _fit(tmp_path / "full")
    steps = ModelCheckpoint(dirpath=tmp_path / "cut", filename="{step}", every_n_train_steps=3, save_top_k=-1)
    _fit(tmp_path / "cut", steps, StopAfterEpoch(1))
    resumed = _fit(tmp_path / "cut", ckpt_path=str(tmp_path / "cut" / "step=12.ckpt"))
    assert same_state(full.lightning_module.state_dict(), resumed.lightning_module.state_dict())


@pytest.mark.slow
@pytest.mark.parametrize("schedule", [{"val_check_interval": 0.5}, {"check_val_every_n_epoch": 2}], ids=str)
def test_a_validation_after_an_epochs_last_batch_leaves_last_ckpt_at_the_epochs_end(
    schedule: dict[str, Any], tmp_path: Path, fashion_mnist_dir
) -> None:
    """Validation inside the epoch (several per epoch) or every other epoch runs after the epoch's last batch, before
    the epoch's end: last.ckpt is rewritten at that end, so a run stopped there resumes at the next epoch, not inside
    the one it finished (whose end it had already logged), and ends as the run never stopped."""
    full = _fit(tmp_path / "full", max_epochs=4, **schedule)
    _fit(tmp_path / "cut", StopAfterEpoch(1), max_epochs=4, **schedule)
    epochs = torch.load(tmp_path / "cut/last.ckpt", weights_only=True)["loops"]["fit_loop"]["epoch_progress"]
    assert epochs["current"]["started"] == epochs["current"]["processed"] == 2
    resumed = _fit(tmp_path / "cut", max_epochs=4, ckpt_path=str(tmp_path / "cut/last.ckpt"), **schedule)
    assert same_state(full.lightning_module.state_dict(), resumed.lightning_module.state_dict())
    assert full.callback_metrics["val_loss"].item() == resumed.callback_metrics["val_loss"].item()


@pytest.mark.slow
def test_other_batch_size_mid_epoch_is_refused_with_the_fix(tmp_path: Path, fashion_mnist_dir) -> None:
    with pytest.raises(SystemExit):
        _fit(tmp_path, SignalAtBatch(epoch=0, batch=3, signum=signal.SIGTERM))
    with pytest.raises(ValueError, match=r"batch_size 32 -> 16.*original --data.batch_size"):
        _fit(tmp_path, batch_size=16, ckpt_path=str(tmp_path / "last.ckpt"))
    # The refusal left the checkpoint as it was: the advice works.
    assert _fit(tmp_path, ckpt_path=str(tmp_path / "last.ckpt")).global_step == 24


@pytest.mark.slow
def test_last_checkpoint_is_never_written_inside_an_accumulation_window(tmp_path: Path, fashion_mnist_dir) -> None:
    """A validation after batch 3 with accumulation 2 falls inside a step: last.ckpt waits for the next one."""

    class LastCheckpointSteps(Callback):
        def __init__(self) -> None:
            self.seen: list[int | None] = []

        def on_train_batch_start(self, trainer: Trainer, pl_module, batch, batch_idx: int) -> None:
            last = tmp_path / "last.ckpt"
            self.seen.append(torch.load(last, weights_only=True)["global_step"] if last.exists() else None)

    seen = LastCheckpointSteps()
    with pytest.warns(UserWarning, match="not written in the middle of an optimizer step"):
        _fit(tmp_path, seen, max_epochs=1, accumulate_grad_batches=2, val_check_interval=3)
    assert seen.seen == [None] * 6 + [3, 3]  # validations after 3 batches (inside a step: skipped) and 6


@pytest.mark.slow
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


@pytest.mark.slow
def test_checkpoints_hold_no_device_random_state(tmp_path: Path, fashion_mnist_dir) -> None:
    """Every batch's random stream comes from (seed, epoch, batch, rank): nothing tied to a device or a
    rank is saved, so resuming on fewer GPUs or under DDP restores every rank's own stream."""
    _fit(tmp_path, StopAfterEpoch(0))
    states = torch.load(tmp_path / "last.ckpt", weights_only=True)["callbacks"]
    state = states["ExactResume"]
    metrics = state.pop("metrics")  # the run's metrics as they are, which a resumed run starts with
    assert "val_loss" in metrics and {value.device.type for value in metrics.values()} == {"cpu"}
    assert state == {
        "should_stop": True,  # StopAfterEpoch stops the run as a user's code does
        "frozen": [], "fixed_statistics": [],  # nothing of the model is frozen
    }  # fmt: skip
    assert states["ResumableBatches"] == {"batch_size": 32, "world_size": 1}
    assert "GracefulStop" not in states


@pytest.mark.slow
def test_same_seed_same_run_and_another_seed_another(tmp_path: Path, fashion_mnist_dir) -> None:
    runs = []
    for seed in (7, 7, 8):
        seed_everything(seed)
        trainer = Trainer(
            max_epochs=1, limit_train_batches=6, limit_val_batches=2, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, deterministic=True, callbacks=exact_resume(),
        )  # fmt: skip
        trainer.fit(SimpleCNN(), datamodule=FashionMNISTDataModule(batch_size=32, augment=True))
        runs.append((trainer.callback_metrics["val_loss"].item(), trainer.lightning_module.state_dict()))
    assert runs[0][0] == runs[1][0] and same_state(runs[0][1], runs[1][1])
    assert runs[0][0] != runs[2][0]  # the seed matters, so the check above is real


def test_the_pairwise_cells_cover_every_pair_of_factor_values() -> None:
    cells = matrix.pairwise_cells()
    every = [c for c in matrix.all_cells() if c.data != matrix.PLAIN_TASK]  # the plain task: tests/test_any_task.py
    factors = ("data", "accumulate", "trigger", "stage")
    for first, second in itertools.combinations(factors, 2):
        pairs = {(getattr(c, first), getattr(c, second)) for c in cells}
        assert pairs == {(getattr(c, first), getattr(c, second)) for c in every}, (first, second)


# extra:streaming
@pytest.mark.slow
@pytest.mark.parametrize("trigger", ["epoch-end", "sigterm"])
def test_streamed_resume_is_exact_without_loader_workers(trigger, tmp_path, image_tree, references) -> None:
    """The streaming loader in the main process: its position is read when the first batch is asked for,
    after Lightning restored the loop (it creates the iterator before, to count the steps)."""
    _run_cell(matrix.Cell("stream-w0", 1, trigger, "plain"), tmp_path, image_tree, references)


@pytest.mark.slow
def test_streamed_resume_with_other_loader_workers_is_refused(tmp_path, image_tree) -> None:
    """LitData gives each worker its own share of the chunks: another worker count means other batches."""
    checkpoint = matrix.interrupt(matrix.Cell("stream-w2", 1, "sigterm", "plain"), tmp_path / "run", image_tree)
    with pytest.raises(ValueError, match="num_workers 2 -> 0"):
        matrix.fit(
            matrix.Cell("stream-w0", 1, "sigterm", "plain"), tmp_path / "run", image_tree, ckpt_path=str(checkpoint)
        )


# /extra:streaming


@pytest.mark.slow
def test_last_checkpoint_holds_the_steps_after_the_last_mid_epoch_validation(tmp_path: Path, fashion_mnist_dir) -> None:
    """7 batches, validation every 3: the finished run's last.ckpt is at step 7, not at the validation of step 6."""
    _fit(tmp_path, max_epochs=1, limit_train_batches=7, val_check_interval=0.5)
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 7


@pytest.mark.slow
def test_exact_mid_epoch_resume_is_not_called_unresumable(tmp_path: Path, fashion_mnist_dir) -> None:
    """Lightning's warning about a loader without state_dict is untrue for the project's loaders: silenced for the
    run, and only for it."""
    with pytest.raises(SystemExit):
        _fit(tmp_path, SignalAtBatch(epoch=0, batch=3, signum=signal.SIGTERM), max_epochs=1)
    filters = list(warnings.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(tmp_path, max_epochs=1, ckpt_path=str(tmp_path / "last.ckpt"))
    assert not [w for w in caught if "not resumable" in str(w.message)]
    assert warnings.filters == filters


class _Counting(IterableDataset):
    def __iter__(self):
        return iter(range(8))


class _OwnLoader(DataLoader):
    """A DataLoader subclass: its own iteration, which a rebuilt plain loader would drop."""


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda d: DataLoader(d, batch_size=4, sampler=RandomSampler(d, replacement=True)), "draws with replacement"),
        (lambda d: DataLoader(d, batch_size=None), "does not batch (batch_size=None)"),
        (lambda d: DataLoader(_Counting(), batch_size=4), "reads an IterableDataset (_Counting)"),
        (lambda d: _OwnLoader(d, batch_size=4, shuffle=True), "is a _OwnLoader (a DataLoader subclass)"),
        (lambda d: [DataLoader(d, batch_size=4), DataLoader(d, batch_size=4)], "are a list of 2"),
        (lambda d: iter(DataLoader(d, batch_size=4)), "not one DataLoader"),
    ],
)
def test_a_loader_that_cannot_continue_mid_epoch_is_kept_as_it_is_with_the_reason(make, why) -> None:
    """What ResumableBatches warns with (once at the start of fit, again at a mid-epoch resume): each reason named."""
    data = TensorDataset(torch.arange(16.0))
    loader = make(data)
    kept, reason = resumable_loader(loader, trainer=None)
    assert kept is loader and why in reason


def test_a_module_copied_or_pickled_during_fit_carries_nothing_of_the_engine(tmp_path: Path) -> None:
    """The per-batch seeding is installed on the trainer's side, and taken away when fit ends."""

    class CopyAtEpochEnd(Callback):
        def on_train_epoch_end(self, trainer: Trainer, pl_module: Any) -> None:
            self.copy = copy.deepcopy(pl_module)  # the "keep the best model" habit
            self.pickled = pickle.dumps(pl_module)

    keep = CopyAtEpochEnd()
    trainer = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=0,
                      callbacks=[*exact_resume(), keep], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(BoringModel())
    engine = ExactResume.__module__.partition(".")[0]
    assert not [name for name, v in vars(keep.copy).items() if getattr(v, "__module__", "").startswith(engine)]
    assert isinstance(pickle.loads(keep.pickled), BoringModel)
    assert "convert_input" not in vars(trainer.precision_plugin)  # nothing left behind
