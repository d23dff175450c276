"""What a training step costs beyond the bare loop's work: the per-step costs the benchmarks found, kept down."""

from __future__ import annotations

import logging
import statistics
import time

import pytest
import torch
from lightning import Callback, Trainer
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.trainer import call

from lightning_template.engine.batches import seed_all
from lightning_template.engine.cli import ProjectCLI
from lightning_template.engine.lightning_internals import skip_idle_hooks
from lightning_template.tasks.classification import FashionMNISTDataModule, SimpleCNN

from tests.conftest import QUICK, ROOT


def test_seeding_per_batch_sets_torch_manual_seed_states_in_microseconds() -> None:
    seed_all(1234)
    ours = torch.rand(4), torch.randn(2)
    torch.manual_seed(1234)
    assert torch.equal(ours[0], torch.rand(4)) and torch.equal(ours[1], torch.randn(2))
    # ResumableBatches seeds every training batch. torch.manual_seed costs ~2 ms per call on this kind of CPU while
    # CUDA is not initialized (it formats a stack trace for deferred CUDA seeding): 2 ms per step of overhead.
    timings = []
    for _ in range(50):
        start = time.perf_counter()
        seed_all(1234)
        timings.append(time.perf_counter() - start)
    assert statistics.median(timings) < 100e-6  # about 10 µs; torch.manual_seed: 550 µs here, 2 ms in a fit


@pytest.mark.slow
def test_train_loss_is_logged_when_written_and_train_acc_is_the_epoch_accuracy(
    quick_trainer, fashion_mnist_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each `self.log` costs about 0.3 ms on this kind of CPU (more for a metric object): train_loss only in the steps
    whose values reach the logger and in the epoch's last, train_acc once per epoch, and still the accuracy over
    every training sample of the epoch."""
    calls: list[str] = []
    log = SimpleCNN.log
    monkeypatch.setattr(
        SimpleCNN, "log", lambda self, name, *args, **kwargs: calls.append(name) or log(self, name, *args, **kwargs)
    )
    model = SimpleCNN(channels=(4, 8), hidden=16, dropout=0.0)
    correct, seen = [], []

    def record(module, inputs, logits):  # the logits the step's loss and metric see
        correct.append(int((logits.argmax(1) == record.targets).sum()))
        seen.append(len(logits))

    original_step = model.training_step

    def step(batch, batch_idx):
        record.targets = batch[1]
        return original_step(batch, batch_idx)

    model.training_step = step
    model.net.register_forward_hook(record)
    trainer = quick_trainer(limit_train_batches=7, limit_val_batches=0, log_every_n_steps=3)
    trainer.fit(model, datamodule=FashionMNISTDataModule(batch_size=16))
    assert calls.count("train_loss") == 3 and calls.count("train_acc") == 1  # steps 3 and 6 (logged), 7 (last)
    assert float(trainer.callback_metrics["train_acc"]) == pytest.approx(sum(correct) / sum(seen), abs=1e-6)


def _seconds_per_call(profiler: PassThroughProfiler, calls: int = 5000) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        with profiler.profile("[Callback]ModelCheckpoint.on_train_batch_end"):
            pass
    return (time.perf_counter() - start) / calls


def test_hook_calls_pay_no_profiler_unless_one_is_chosen(tmp_path, monkeypatch, fashion_mnist_dir, caplog) -> None:
    """Lightning wraps each of the ~100 hook calls of a training step in its profiler's context, also when it profiles
    nothing: the run's default costs a fraction of Lightning's default per call, and `--trainer.profiler simple`
    still reports."""
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), *QUICK, "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=1",
            "--test_after_fit=false"]  # fmt: skip
    default = ProjectCLI(args=args[1:], run=False).trainer.profiler
    lightnings = PassThroughProfiler()
    ours, theirs = zip(*[(_seconds_per_call(default), _seconds_per_call(lightnings)) for _ in range(7)], strict=True)
    assert min(ours) < 0.5 * min(theirs)  # about a sixth on a CPU; the fastest round: a busy machine only adds time
    with caplog.at_level(logging.INFO):  # where Lightning writes its report
        ProjectCLI(args=[*args, "--trainer.profiler=simple"])
    assert "FIT Profiler Report" in caplog.text


HOOKS = sorted(name for name in vars(Callback) if name.startswith("on_") or name in ("setup", "teardown"))


class Recorder(Callback):
    """Records each of its hooks that Lightning calls, with the module's `_current_fx_name` at that moment."""

    def __init__(self, calls: list[tuple[str, ...]]) -> None:
        self.calls = calls


for _name in HOOKS:
    setattr(Recorder, _name, lambda self, trainer, module, *args, _hook=_name, **kwargs: self.calls.append(
        (type(self).__name__, _hook, module._current_fx_name)
    ))  # fmt: skip


class MonitoringRecorder(Recorder, Checkpoint):  # Lightning calls the checkpoints' epoch ends after the others'
    pass


class LateRecorder(Recorder):
    pass


class AddsARecorder(Callback):
    """Adds a recorder in its first `setup`: Lightning gives the new callback that hook too, and all after it."""

    def __init__(self, calls: list[tuple[str, ...]]) -> None:
        self.calls = calls

    def setup(self, trainer: Trainer, pl_module, stage: str) -> None:
        if not any(isinstance(c, LateRecorder) for c in trainer.callbacks):
            trainer.callbacks.append(LateRecorder(self.calls))


def _hook_calls(trainer: Trainer, monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, ...]], int]:
    """Every hook call of fit, validate, test and predict, and how often `Callback.on_train_batch_end` (the hook of
    a callback that does not override it: nothing) was called."""
    idle_calls = []
    monkeypatch.setattr(Callback, "on_train_batch_end", lambda *args, **kwargs: idle_calls.append(1))
    calls: list[tuple[str, ...]] = []
    instance_hook = Callback()  # a hook set on the instance, not the class, is called too
    instance_hook.on_validation_end = lambda trainer, module: calls.append(("instance", "on_validation_end"))
    trainer.callbacks = [
        MonitoringRecorder(calls), Recorder(calls), AddsARecorder(calls), instance_hook, Callback(), *trainer.callbacks
    ]  # fmt: skip
    model = BoringModel()
    trainer.fit(model)
    for run in (trainer.validate, trainer.test, trainer.predict):
        run(model, verbose=False) if run != trainer.predict else run(model)
    return calls, len(idle_calls)


def test_callbacks_get_lightnings_hook_calls_but_the_idle_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a run chose no profiler, a hook that a callback does not override (Lightning's own does nothing) is not
    called: every other call is Lightning's, in its order, with the same `_current_fx_name`; with a profiler,
    Lightning's dispatch."""
    monkeypatch.setattr(call, "_call_callback_hooks", call._call_callback_hooks)  # restored after the test

    def trainer() -> Trainer:
        return Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=2, limit_test_batches=2,
                       limit_predict_batches=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                       enable_model_summary=False)  # fmt: skip

    lightnings, lightnings_idle = _hook_calls(trainer(), monkeypatch)
    ours = trainer()
    skip_idle_hooks(ours)
    skipped, skipped_idle = _hook_calls(ours, monkeypatch)
    assert skipped == lightnings and len({hook for _, hook, *_ in lightnings}) > 30
    assert ("LateRecorder", "setup", "setup") in lightnings
    assert lightnings_idle == 3 * 3 * 2 and skipped_idle == 0  # a plain callback, the instance hook's, the adder
    profiled = Trainer(profiler="simple", max_epochs=1, limit_train_batches=3, limit_val_batches=0, logger=False,
                       enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    skip_idle_hooks(profiled)
    assert _hook_calls(profiled, monkeypatch)[1] > 0
