"""What each function of engine/lightning_internals.py says or does, on a tiny real Trainer.

A Lightning release that changes what one of them relies on fails here, in the fast tier, naming the function
(not as "weights differ" in a resume test minutes later). Each run: one weight, four one-sample batches an epoch.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning import Callback, LightningDataModule, Trainer
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.trainer import call
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanMetric

from lightning_template.engine import lightning_internals as li

from tests.test_lightning_tripwires import (
    BATCHES,
    LinksWidth,
    Recorded,
    SaveAt,
    StatefulLoader,
    StatefulTiny,
    Tiny,
    fit,
    linked_cli,
)


def changed(function: str) -> str:
    return f"Lightning's behaviour that lightning_internals.{function} relies on changed: see its docstring"


class Validated(Tiny):
    """Tiny with a one-batch validation."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.layer(batch[0].float()).pow(2).mean())

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.arange(1)), batch_size=1)


class Recorder(Callback):
    """Calls `ask(trainer)` at the named hooks and keeps the answers, in order."""

    def __init__(self, ask: Any, *hooks: str) -> None:
        self.ask, self.answers = ask, []
        for hook in hooks:
            setattr(self, hook, self._record)

    def _record(self, trainer: Trainer, *args: Any) -> None:
        self.answers.append(self.ask(trainer))


def answers(tmp_path: Path, ask: Any, *hooks: str, model: Tiny | None = None, **kwargs: Any) -> list[Any]:
    recorder = Recorder(ask, *hooks)
    fit(tmp_path, model or Tiny(), [recorder], **kwargs)
    return recorder.answers


# -- where the loop is, in a run never stopped -----------------------------------------------------------------------


def test_batch_counters(tmp_path: Path) -> None:
    ends = answers(tmp_path, lambda t: (li.batch_index(t), li.batches_done(t)), "on_train_batch_end", max_epochs=1)
    assert ends == [(i, i + 1) for i in range(BATCHES)], changed("batch_index or batches_done")
    running = answers(tmp_path, li.batch_in_progress, "on_before_backward", "on_train_batch_end", max_epochs=1)
    assert running == [True, False] * BATCHES, changed("batch_in_progress")


def test_last_batch_and_accumulation(tmp_path: Path) -> None:
    ask = lambda t: (li.last_batch_trained(t), li.closes_accumulation_window(t))  # noqa: E731
    ends = answers(tmp_path, ask, "on_train_batch_end", max_epochs=1, accumulate_grad_batches=2)
    assert [last for last, _ in ends] == [False, False, False, True], changed("last_batch_trained")
    assert [closes for _, closes in ends] == [False, True] * 2, changed("closes_accumulation_window")


def test_epoch_counts(tmp_path: Path) -> None:
    counts = answers(tmp_path, li.epoch_counts, "on_train_epoch_start", "on_train_epoch_end")
    expected = [li.EpochCounts(0, 0, 0), li.EpochCounts(1, 1, 0), li.EpochCounts(1, 1, 1), li.EpochCounts(2, 2, 1)]
    assert counts == expected, changed("epoch_counts")


def test_logging_validation_and_stopping_schedule(tmp_path: Path) -> None:
    ends = answers(tmp_path, li.validation_due, "on_train_batch_end", model=Validated(), max_epochs=1,
                   limit_val_batches=1, val_check_interval=2)  # fmt: skip
    assert ends == [False, True] * 2, changed("validation_due")
    early = answers(tmp_path, li.may_stop_early, "on_train_epoch_end", max_epochs=3, min_epochs=2)
    assert early == [False, True, True], changed("may_stop_early")


def test_a_run_never_stopped_restarts_nothing(tmp_path: Path) -> None:
    ask = lambda t: (li.restarted_mid_epoch(t), li.keeps_first_train_iterator(t))  # noqa: E731
    assert set(answers(tmp_path, ask, "on_train_epoch_start")) == {(False, False)}, changed(
        "restarted_mid_epoch or keeps_first_train_iterator"
    )


def test_trainer_settings(tmp_path: Path) -> None:
    trainer = Trainer(default_root_dir=tmp_path, logger=False, use_distributed_sampler=False)
    assert isinstance(li.cluster_environment(trainer), LightningEnvironment), changed("cluster_environment")
    assert li.replaces_samplers(trainer) is False, changed("replaces_samplers")
    assert li.slurm_resume_path(trainer) is None, changed("slurm_resume_path")


# -- a resumed run ---------------------------------------------------------------------------------------------------


def resume_asking(tmp_path: Path, save: dict[str, Any], ask: Any, make: Any = Tiny, **kwargs: Any) -> Any:
    """`ask(trainer)` at the resumed run's `on_train_start`, where the engine reads the restored loop."""
    checkpoint = tmp_path / "stopped.ckpt"
    fit(tmp_path, make(), [SaveAt(checkpoint, **save)], **kwargs)
    recorder = Recorder(ask, "on_train_start")
    model = make()
    probe = fit(tmp_path, model, [recorder], ckpt_path=checkpoint, **kwargs)
    return recorder.answers[0], model, probe


def test_restart_stages(tmp_path: Path) -> None:
    ask = lambda t: (li.restarted_mid_epoch(t), li.restored_after_last_batch(t), li.batches_done(t))  # noqa: E731
    inside, *_ = resume_asking(tmp_path, {"epoch": 0, "batch": 1}, ask)
    assert inside == (True, False, 2), changed("restarted_mid_epoch, restored_after_last_batch or batches_done")
    after_last, *_ = resume_asking(tmp_path, {"epoch": 0, "batch": BATCHES - 1}, ask)
    assert after_last[:2] == (True, True), changed("restored_after_last_batch")


def test_start_next_epoch(tmp_path: Path) -> None:
    _, model, probe = resume_asking(tmp_path, {"epoch": 0, "batch": BATCHES - 1}, li.start_next_epoch)
    assert probe.epoch_starts == [1], changed("start_next_epoch")  # Lightning alone runs none (its tripwire)
    assert [epoch for epoch, _ in model.seen] == [1] * BATCHES, changed("start_next_epoch")


def test_finish_restarted_epoch(tmp_path: Path) -> None:
    finished, model, probe = resume_asking(tmp_path, {"epoch": 0}, li.finish_restarted_epoch, max_steps=2 * BATCHES)
    assert finished, changed("finish_restarted_epoch")
    # Epoch 0 is done: no batch of it, no end of it again; epoch 1 runs whole, started as in the run never stopped.
    assert [epoch for epoch, _ in model.seen] == [1] * BATCHES, changed("finish_restarted_epoch")
    assert probe.epoch_starts == [1] and [end for end, _ in probe.epoch_ends] == [1], changed("finish_restarted_epoch")


def test_load_train_loader_states(tmp_path: Path) -> None:
    StatefulLoader.loaded = []
    make = lambda: StatefulTiny(reads_stepping_batches=True)  # noqa: E731
    loaded, *_ = resume_asking(tmp_path, {"epoch": 0, "batch": 1}, li.load_train_loader_states, make=make)
    assert loaded and StatefulLoader.loaded == [{"position": 1}], changed("load_train_loader_states")


def test_plateau_steps(tmp_path: Path) -> None:
    class StepAtEpochEnd(Callback):
        def on_train_epoch_end(self, trainer: Trainer, pl_module: Any) -> None:
            li.let_lightning_step_plateau_schedulers(trainer)

    checkpoint = tmp_path / "stopped.ckpt"
    fit(tmp_path, Tiny(plateau=True), [SaveAt(checkpoint, epoch=0, batch=1)], max_epochs=1)
    model = Tiny(plateau=True)
    fit(tmp_path, model, [StepAtEpochEnd()], ckpt_path=checkpoint, max_epochs=1)
    assert model.trainer.lr_scheduler_configs[0].scheduler.last_epoch == 1, changed(
        "let_lightning_step_plateau_schedulers"
    )

    class StepNow(Callback):
        def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
            li.step_plateau_scheduler(trainer, trainer.lr_scheduler_configs[0].scheduler, torch.tensor(1.0))

    model = Tiny(plateau=True)
    fit(tmp_path, model, [StepNow()], max_epochs=1)
    assert model.trainer.lr_scheduler_configs[0].scheduler.last_epoch == 2, changed("step_plateau_scheduler")


# -- the loaders, the metrics, the checkpoints --------------------------------------------------------------------


def test_train_loader_hooks(tmp_path: Path) -> None:
    wrapped: list[Any] = []

    class Wrap(Callback):
        def setup(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
            li.wrap_train_loader(trainer, lambda loader: wrapped.append(loader) or loader)

        def on_train_epoch_end(self, trainer: Trainer, pl_module: Any) -> None:
            li.forget_train_loader(trainer)  # built again for the next epoch

    fit(tmp_path, Tiny(), [Wrap()])
    assert len(wrapped) == 2 and all(isinstance(x, DataLoader) for x in wrapped), changed(
        "wrap_train_loader or forget_train_loader"
    )

    calls: list[int] = []

    class Seed(Callback):
        def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
            self.undo = li.call_before_batch_hooks(trainer, lambda: calls.append(1))

        def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
            self.undo()

    fit(tmp_path, Tiny(), [Seed()], max_epochs=1)
    assert len(calls) == BATCHES, changed("call_before_batch_hooks")

    class Restart(Callback):
        def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
            if i == 1 and trainer.current_epoch == 0:
                li.restart_train_iterator(trainer)

    model = Tiny()
    fit(tmp_path, model, [Restart()], max_epochs=1, max_steps=BATCHES)
    assert [sample for _, sample in model.seen] == [0, 1, 0, 1], changed("restart_train_iterator")


def test_epoch_sums_and_metric_states(tmp_path: Path) -> None:
    class Logs(Tiny):
        def __init__(self) -> None:
            super().__init__()
            self.mean = MeanMetric()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.mean.update(batch[0].float())
            self.log("mean", self.mean, on_epoch=True, on_step=False)
            self.log("sum", batch[0].float().sum(), on_epoch=True, reduce_fx="sum")
            return super().training_step(batch, batch_idx)

    seen: dict[str, Any] = {}

    class Read(Callback):
        def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
            if i == 1:
                sums = li.epoch_sums(trainer)  # by Lightning's key ("training_step.sum")
                key = next(key for key in sums if key.endswith(".sum"))
                seen["sum"] = float(sums[key]["value"])
                li.add_epoch_sums(trainer, {key: sums[key]})  # folded in once more: 0+1 twice
                training, _ = li.metrics_lightning_resets(trainer)
                seen["resets"] = training
                state = li.metric_state(pl_module.mean)
                seen["updates"] = state["updates"]
                pl_module.mean.reset()
                li.load_metric_state(pl_module.mean, state)

    model = Logs()
    fit(tmp_path, model, [Read()], max_epochs=1)
    assert seen["sum"] == 1.0, changed("epoch_sums")
    assert float(model.trainer.callback_metrics["sum"]) == 0 + 1 + 0 + 1 + 2 + 3, changed("add_epoch_sums")
    assert seen["resets"] == [model.mean], changed("metrics_lightning_resets")
    assert seen["updates"] == 2 and float(model.trainer.callback_metrics["mean"]) == 1.5, changed(
        "metric_state or load_metric_state"
    )


def test_checkpoint_callback_internals(tmp_path: Path) -> None:
    written: list[str] = []

    class Writes(li.CheckpointWrites):
        def write_checkpoint(self, trainer: Trainer, filepath: str) -> None:
            written.append(Path(filepath).name)
            super().write_checkpoint(trainer, filepath)

    checkpoint = Writes(dirpath=tmp_path, filename="{epoch}", save_top_k=-1)
    trainer = Trainer(default_root_dir=tmp_path, logger=False, max_epochs=1, callbacks=[checkpoint],
                      enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(Tiny())
    assert written == ["epoch=0.ckpt"] and (tmp_path / "epoch=0.ckpt").exists(), changed("CheckpointWrites")
    assert li.reads_at_train_epoch_end(checkpoint, trainer), changed("reads_at_train_epoch_end")
    li.mark_saved_at(checkpoint, trainer.global_step)
    checkpoint.on_train_epoch_end(trainer, trainer.lightning_module)  # already saved at this step: nothing written
    assert written == ["epoch=0.ckpt"], changed("mark_saved_at")
    li.mark_saved_at(checkpoint, trainer.global_step - 1)
    checkpoint.on_train_epoch_end(trainer, trainer.lightning_module)
    assert len(written) == 2, changed("mark_saved_at")
    assert isinstance(checkpoint, ModelCheckpoint)


# -- outside the loops -----------------------------------------------------------------------------------------------


def test_record_only_links_taken(tmp_path: Path) -> None:
    class RecordsLinksTaken(LinksWidth):
        def before_instantiate_classes(self) -> None:
            li.record_only_links_taken(self)

    assert "width" not in linked_cli(Recorded, tmp_path, RecordsLinksTaken).model.hparams, changed(
        "record_only_links_taken"
    )
    taken = linked_cli(Sized, tmp_path, RecordsLinksTaken).model  # a model that takes it gets it, and records it
    assert taken.width == 3 and taken.hparams["width"] == 3, changed("record_only_links_taken")
    # The links as jsonargparse hands them to an instantiator: by target, with or without `init_args`.
    links = {"model.init_args.width": 3, "model.depth": 2, "model.init_args.head.init_args.size": 4, "data.size": 1}
    taken = li.links_taken("model", links, {"width": 1, "head": None})
    assert taken == {"model.init_args.width": 3, "model.init_args.head.init_args.size": 4, "data.size": 1}


def test_datamodules_named_by_class() -> None:
    from tests.test_lightning_tripwires import LightningDataModule

    calls: list[int] = []

    class Described(LightningDataModule):
        def train_dataloader(self) -> DataLoader:
            calls.append(1)
            raise RuntimeError("not set up yet")

    with li.datamodules_named_by_class():
        assert str(Described()) == "Described" and not calls, changed("datamodules_named_by_class")
    str(Described())
    assert calls == [1], changed("datamodules_named_by_class")  # Lightning's own again, after it


def test_torch_internals() -> None:
    assert li.is_batch_norm(torch.nn.BatchNorm2d(2)) and li.is_batch_norm(torch.nn.LazyBatchNorm1d()), changed(
        "is_batch_norm"
    )
    assert not li.is_batch_norm(torch.nn.LayerNorm(2)), changed("is_batch_norm")
    tensors = [torch.tensor([1.0, -3.0]), torch.tensor([2.0])]
    found = torch.zeros(1)
    li.flag_non_finite(tensors, found)
    assert float(found) == 0 and torch.equal(tensors[0], torch.tensor([1.0, -3.0])), changed("flag_non_finite")
    li.flag_non_finite([torch.tensor([float("nan")])], found)
    assert float(found) == 1, changed("flag_non_finite")


def test_skips_due_validation(tmp_path: Path) -> None:
    """Resumed from a checkpoint written at a batch's end, before the validation due after it (every 2 batches)."""
    settings = {"make": Validated, "max_epochs": 1, "limit_val_batches": 1, "val_check_interval": 2}
    skips, *_ = resume_asking(tmp_path, {"epoch": 0, "batch": 1}, li.skips_due_validation, **settings)
    assert skips is True, changed("skips_due_validation")
    skips, *_ = resume_asking(tmp_path, {"epoch": 0, "batch": 0}, li.skips_due_validation, **settings)
    assert skips is False, changed("skips_due_validation")  # none was due after batch 0


def test_stop_after_this_step(tmp_path: Path) -> None:
    class Stop(Callback):
        def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, i: int) -> None:
            if i == 1:
                li.stop_after_this_step(trainer)

    model = Tiny()
    with pytest.raises(SIGTERMException):  # Lightning's graceful stop, as after a SIGTERM
        fit(tmp_path, model, [Stop()], max_epochs=1)
    assert model.seen == [(0, 0), (0, 1)], changed("stop_after_this_step")


def test_skips_due_validation_at_its_end(tmp_path: Path) -> None:
    """Resumed at its end (`max_steps` reached): Lightning runs no loop, the engine asks at `on_fit_end`."""
    settings = {"max_steps": 2, "limit_val_batches": 1, "val_check_interval": 2}
    checkpoint = tmp_path / "stopped.ckpt"
    fit(tmp_path, Validated(), [SaveAt(checkpoint, epoch=0, batch=1)], **settings)  # before the validation due
    ended = tmp_path / "ended.ckpt"
    model = Validated()
    fit(tmp_path, model, [], **settings)
    model.trainer.save_checkpoint(ended)  # after the run's end, its validation included
    for path, skipped in ((checkpoint, True), (ended, False)):
        recorder = Recorder(li.skips_due_validation_at_its_end, "on_fit_end")
        model = Validated()
        fit(tmp_path, model, [recorder], ckpt_path=path, **settings)
        assert model.seen == [] and recorder.answers == [skipped], changed("skips_due_validation_at_its_end")


class SlowSteps(Callback):
    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(0.2)  # half a second of max_time stops the run after its third step at most


def test_restart_time_budgets(tmp_path: Path) -> None:
    class Restart(Callback):
        def on_load_checkpoint(self, trainer: Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
            li.restart_time_budgets(trainer, checkpoint)

    checkpoint, budget = tmp_path / "stopped.ckpt", {"max_time": {"seconds": 0.5}}
    stopped = Tiny()
    fit(tmp_path, stopped, [SaveAt(checkpoint, epoch=0), SlowSteps()], **budget)  # stopped by its Timer
    assert 0 < stopped.trainer.global_step < BATCHES
    model = Tiny()
    fit(tmp_path, model, [Restart(), SlowSteps()], ckpt_path=checkpoint, **budget)
    # Lightning alone trains nothing (its tripwire): this run trains for its own half second.
    assert model.seen and model.trainer.global_step > stopped.trainer.global_step, changed("restart_time_budgets")


def test_requeue_slurm_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir, record = tmp_path / "bin", tmp_path / "scontrol.log"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {record}\n')  # SLURM's command, as a job sees it
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    model = Tiny()
    fit(tmp_path, model, [], max_epochs=1)
    li.requeue_slurm_job(model.trainer, signal.SIGUSR1)
    requeued = record.read_text().split() if record.is_file() else []
    assert requeued == ["requeue", "4242"], changed("requeue_slurm_job")
    saved = torch.load(tmp_path / "hpc_ckpt_1.ckpt", weights_only=False)  # where a requeued job resumes from
    assert saved["global_step"] == BATCHES, changed("requeue_slurm_job")


# -- the CLI ---------------------------------------------------------------------------------------------------------


class Sized(Tiny):
    def __init__(self, width: int = 1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.width = width


class WidthData(LightningDataModule):
    def __init__(self, size: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()  # what Lightning's instantiator replaces with the parsed config
        self.width = size


class Parsed(Exception):
    """Raised by a CLI below once it has parsed its command line (nothing is built or run)."""


def test_cli_hooks(tmp_path: Path) -> None:
    class CheckpointHooked(li.CLIHooks):
        def apply_checkpoint(self) -> None:
            self.widths = [self.config.fit.model.width]  # as parsed, before the checkpoint is read
            super().apply_checkpoint()
            self.widths.append(self.config.fit.model.width)

        def before_instantiate_classes(self) -> None:
            raise Parsed(self)

    checkpoint = tmp_path / "sized.ckpt"
    model = Sized(width=3)
    fit(tmp_path, model, [], max_epochs=1, max_steps=1)
    model.trainer.save_checkpoint(checkpoint)
    with pytest.raises(Parsed) as parsed:
        CheckpointHooked(Sized, args=["fit", f"--ckpt_path={checkpoint}"], seed_everything_default=False)
    # Called once, where LightningCLI reads the checkpoint's hyper-parameters, which it reads in the parent's.
    assert getattr(parsed.value.args[0], "widths", None) == [1, 3], changed("CLIHooks")


def test_add_datamodule_hook(tmp_path: Path) -> None:
    class DataHooked(LightningCLI):
        def add_arguments_to_parser(self, parser: Any) -> None:
            parser.link_arguments("data.width", "model.width", apply_on="instantiate")

        def before_instantiate_classes(self) -> None:
            self.hooked: list[LightningDataModule] = []
            li.add_datamodule_hook(self, self.widen)

        def widen(self, datamodule: LightningDataModule) -> None:
            self.hooked.append(datamodule)
            datamodule.width = 7  # what the link hands the model, if the hook runs before it

    args = {"args": ["--data.size=3", f"--trainer.default_root_dir={tmp_path}"], "seed_everything_default": False}
    cli = DataHooked(Sized, WidthData, run=False, **args)
    assert cli.hooked == [cli.datamodule] and cli.model.width == 7, changed("add_datamodule_hook")
    # Built by Lightning's own instantiator, which records the config as the datamodule's hyper-parameters.
    recorded = {"size": 3, "_instantiator": "lightning.pytorch.cli.instantiate_module"}
    assert dict(cli.datamodule.hparams) == recorded, changed("add_datamodule_hook or _Instantiator")
    # A spawning DDP launcher pickles the parser (in the trainer's SaveConfigCallback), its instantiators with it:
    # the hook is an object, with its CLI and what it calls.
    hook = pickle.loads(
        pickle.dumps(li._Instantiator(LightningCLI(Sized, WidthData, run=False, **args), "data", print))
    )
    assert isinstance(hook(WidthData, size=4, applied_instantiation_links={}), WidthData), changed("_Instantiator")


# -- Lightning's dispatch of callback hooks --------------------------------------------------------------------------


def test_idle_hooks_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    lightnings = call._call_callback_hooks
    # Lightning's `Callback.on_train_batch_end` (which does nothing), counted.
    monkeypatch.setattr(Callback, "on_train_batch_end", lambda *args, **kwargs: calls.append("idle"))

    class Busy(Callback):
        def on_train_batch_end(self, trainer: Trainer, pl_module: Any, *args: Any) -> None:
            calls.append("busy" if call._call_callback_hooks is not lightnings else "Lightning's dispatch")
            pl_module.log("logged_by_a_callback", 1.0)  # Lightning's `_current_fx_name` is set for it

    def trainer(**kwargs: Any) -> Trainer:
        quiet = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
        made = Trainer(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=2, enable_model_summary=False,
                       **quiet, **kwargs)  # fmt: skip
        li.skip_idle_hooks(made)
        return made

    skipping = trainer(callbacks=[Callback(), Busy()])
    assert isinstance(skipping.profiler, li.HooksUnprofiled), changed("HooksUnprofiled")
    # What Lightning enters around each hook call: no generator made, nothing recorded.
    entered = skipping.profiler.profile("[Callback]Busy.on_train_batch_end")
    assert type(entered) is contextlib.nullcontext, changed("HooksUnprofiled")
    assert any(isinstance(c, li.IdleHooksSkipped) for c in skipping.callbacks), changed("IdleHooksSkipped")
    skipping.fit(Tiny())
    assert calls == ["busy"] * 2, changed("HooksUnprofiled or IdleHooksSkipped")  # Lightning's: idle ones too
    assert "logged_by_a_callback" in skipping.callback_metrics, changed("HooksUnprofiled")
    assert call._call_callback_hooks is lightnings, changed("IdleHooksSkipped")  # Lightning's own after the run

    class Fails(Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            raise RuntimeError("a run that raises")

    with pytest.raises(RuntimeError, match="a run that raises"):
        trainer(callbacks=[Fails()]).fit(Tiny())
    assert call._call_callback_hooks is lightnings, changed("IdleHooksSkipped")

    calls.clear()
    profiled = trainer(callbacks=[Callback(), Busy()], profiler="simple")  # kept, with Lightning's dispatch
    profiled.fit(Tiny())
    assert not isinstance(profiled.profiler, li.HooksUnprofiled) and calls.count("idle") == 2, changed(
        "HooksUnprofiled"
    )
