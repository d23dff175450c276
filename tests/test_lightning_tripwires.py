"""Tripwires: each Lightning bug the engine corrects, shown on plain Lightning (no engine code runs here).

Each test asserts that the installed Lightning still behaves as the correction assumes. The day a release fixes the
bug, its test fails naming the correction to delete: kept, it would correct what is no longer wrong. The list, with
the upstream issues and the versions they hold for, is in docs/extending.md ("Corrections of Lightning").
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import BackboneFinetuning
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tests.helpers import free_port

BATCHES = 4  # per epoch, one sample each


def fixed_by_lightning(correction: str, issue: str = "") -> str:
    upstream = f" ({issue})" if issue else ""
    return (
        f"Lightning {lightning.__version__} no longer has the bug{upstream} that {correction} corrects: delete that"
        " correction (and its call), this tripwire, and its line in docs/extending.md's corrections."
    )


class Tiny(LightningModule):
    """One weight, four one-sample batches an epoch; records what each batch trained on."""

    def __init__(self, plateau: bool = False, reads_stepping_batches: bool = False, workers: int = 0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.plateau, self.reads_stepping_batches, self.workers = plateau, reads_stepping_batches, workers
        self.seen: list[tuple[int, int]] = []  # (epoch, sample)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        self.seen.append((self.current_epoch, int(x.item())))
        loss = self.layer(x.float()).pow(2).mean()
        self.log("loss", loss, on_epoch=True)
        return loss

    def configure_optimizers(self) -> Any:
        if self.reads_stepping_batches:
            assert self.trainer.estimated_stepping_batches > 0
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
        if not self.plateau:
            return optimizer
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "loss"}}

    def train_dataloader(self) -> DataLoader:
        data = TensorDataset(torch.arange(BATCHES))
        return DataLoader(data, batch_size=1, num_workers=self.workers)


class SaveAt(Callback):
    """Writes a checkpoint where a checkpoint callback would: at a batch's end, or at an epoch's end."""

    def __init__(self, path: Path, epoch: int, batch: int | None = None) -> None:
        self.path, self.epoch, self.batch = path, epoch, batch

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            trainer.save_checkpoint(self.path)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: Any) -> None:
        if self.batch is None and trainer.current_epoch == self.epoch:
            trainer.save_checkpoint(self.path)


class Probe(Callback):
    """What Lightning's loop says at each epoch's start and end."""

    def __init__(self) -> None:
        self.epoch_starts: list[int] = []
        self.epoch_ends: list[tuple[int, int]] = []  # (current_epoch, epochs counted processed)
        self.should_stop_at_start: bool | None = None

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.should_stop_at_start = trainer.should_stop

    def on_train_epoch_start(self, trainer: Trainer, pl_module: Any) -> None:
        self.epoch_starts.append(trainer.current_epoch)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: Any) -> None:
        self.epoch_ends.append((trainer.current_epoch, trainer.fit_loop.epoch_progress.current.processed))


def fit(tmp_path: Path, model: Tiny, callbacks: list[Callback], ckpt_path: Path | None = None, **kwargs: Any) -> Probe:
    probe = Probe()
    settings: dict[str, Any] = {"max_epochs": 2, "limit_val_batches": 0, "num_sanity_val_steps": 0, **kwargs}
    trainer = Trainer(
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*callbacks, probe],
        **settings,
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return probe


def resumed(tmp_path: Path, save: dict[str, Any], make: Callable[[], Tiny] = Tiny, **kwargs: Any) -> tuple[Tiny, Probe]:
    """A run of `make()` stopped once its checkpoint is written (`save`: SaveAt's epoch and batch), then resumed from
    it with another."""
    checkpoint = tmp_path / "stopped.ckpt"
    fit(tmp_path, make(), [SaveAt(checkpoint, **save)], **kwargs)
    model = make()
    return model, fit(tmp_path, model, [], ckpt_path=checkpoint, **kwargs)


# -- a run with max_steps restarted at an epoch's end (a checkpoint written in on_train_epoch_end) ----------------


def test_tripwire_restart_at_epoch_end_counts_the_epoch_processed_twice(tmp_path: Path) -> None:
    _, probe = resumed(tmp_path, {"epoch": 0}, max_steps=2 * BATCHES)
    # The run never stopped ends epoch 0 once, with 1 epoch processed; the resumed one runs that end (its
    # on_train_epoch_end hooks) again and counts 2.
    assert probe.epoch_ends[0] == (0, 2), fixed_by_lightning("lightning_internals.finish_restarted_epoch")


def test_tripwire_restart_at_epoch_end_trains_one_more_batch_of_it(tmp_path: Path) -> None:
    model, _ = resumed(tmp_path, {"epoch": 0}, max_steps=2 * BATCHES)
    # The epoch had no validation to wait for: the resumed run trains a fifth batch of epoch 0.
    assert [epoch for epoch, _ in model.seen].count(0) == 1, fixed_by_lightning(
        "lightning_internals.finish_restarted_epoch"
    )


# -- a run stopped by --trainer.max_time (Lightning's Timer) ---------------------------------------------------------


class SlowSteps(Callback):
    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(0.2)  # half a second of max_time stops the run after its third step at most


def test_tripwire_timer_resumes_with_the_time_the_stopped_run_trained(tmp_path: Path) -> None:
    checkpoint, budget = tmp_path / "stopped.ckpt", {"max_time": {"seconds": 0.5}}
    stopped = Tiny()
    fit(tmp_path, stopped, [SaveAt(checkpoint, epoch=0), SlowSteps()], **budget)  # Lightning ends the epoch there
    assert 0 < stopped.trainer.global_step < BATCHES
    model = Tiny()
    fit(tmp_path, model, [SlowSteps()], ckpt_path=checkpoint, **budget)
    assert model.seen == [], fixed_by_lightning("lightning_internals.restart_time_budgets")


# -- restarted from a checkpoint written at an epoch's last batch, before the epoch's end -------------------------


def test_tripwire_restart_after_last_batch_skips_next_epoch_start_hooks(tmp_path: Path) -> None:
    _, probe = resumed(tmp_path, {"epoch": 0, "batch": BATCHES - 1})
    # Lightning counts epoch 0 done and runs epoch 1 as the restarted one: without its on_train_epoch_start.
    assert probe.epoch_starts == [], fixed_by_lightning("lightning_internals.start_next_epoch")


# -- a ReduceLROnPlateau stepped at epoch ends, restarted inside an epoch -------------------------------------------


def test_tripwire_restarted_epoch_takes_no_plateau_step(tmp_path: Path) -> None:
    never_stopped = Tiny(plateau=True)
    fit(tmp_path, never_stopped, [], max_epochs=1)
    assert never_stopped.trainer.lr_scheduler_configs[0].scheduler.last_epoch == 1  # stepped at epoch 0's end
    model, _ = resumed(tmp_path, {"epoch": 0, "batch": 1}, make=lambda: Tiny(plateau=True), max_epochs=1)
    # The restarted loop skips that step.
    assert model.trainer.lr_scheduler_configs[0].scheduler.last_epoch == 0, fixed_by_lightning(
        "lightning_internals.let_lightning_step_plateau_schedulers"
    )


# -- the training loader, when configure_optimizers reads trainer.estimated_stepping_batches ----------------------


class StatefulLoader(DataLoader):
    """A loader with a state of its own, which Lightning saves in the checkpoint and should give back."""

    loaded: list[dict[str, Any]] = []

    def state_dict(self) -> dict[str, Any]:
        return {"position": 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        StatefulLoader.loaded.append(state)


class StatefulTiny(Tiny):
    def train_dataloader(self) -> DataLoader:
        return StatefulLoader(TensorDataset(torch.arange(BATCHES)), batch_size=1)


def test_tripwire_loader_states_not_loaded_when_optimizers_read_stepping_batches(tmp_path: Path) -> None:
    StatefulLoader.loaded = []
    resumed(tmp_path, {"epoch": 0, "batch": 1}, make=StatefulTiny)
    assert StatefulLoader.loaded == [{"position": 1}]  # given back, where configure_optimizers reads nothing
    StatefulLoader.loaded = []
    resumed(tmp_path, {"epoch": 0, "batch": 1}, make=lambda: StatefulTiny(reads_stepping_batches=True))
    assert StatefulLoader.loaded == [], fixed_by_lightning(
        "lightning_internals.load_train_loader_states", "Lightning #20550"
    )


def test_tripwire_workers_prefetch_before_the_sampler_epoch_is_set(tmp_path: Path) -> None:
    class SamplerTiny(Tiny):
        def train_dataloader(self) -> DataLoader:
            data = TensorDataset(torch.arange(BATCHES))
            sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
            return DataLoader(data, batch_size=1, sampler=sampler, num_workers=1, persistent_workers=False)

    torch.manual_seed(0)
    never_stopped = SamplerTiny()
    fit(tmp_path, never_stopped, [])
    model, _ = resumed(tmp_path, {"epoch": 0}, make=SamplerTiny)
    epoch = {e: [sample for seen_epoch, sample in never_stopped.seen if seen_epoch == e] for e in (0, 1)}
    assert epoch[0] != epoch[1]
    # The resumed run's epoch 1 comes in epoch 0's order: its workers drew the indices before set_epoch(1).
    assert [sample for _, sample in model.seen] == epoch[0], fixed_by_lightning(
        "the restart of the training iterator in ResumableBatches.restart"
        " (lightning_internals.restart_train_iterator) and sampling.EpochSampler's reading of the epoch from the loop",
        "Lightning #21938",
    )


# -- what a checkpoint does not hold --------------------------------------------------------------------------------


def test_tripwire_should_stop_is_not_restored(tmp_path: Path) -> None:
    class StopAndSave(SaveAt):
        def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
            trainer.should_stop = True  # as early stopping decides, before the step's checkpoint
            super().on_train_batch_end(trainer, *args)

    checkpoint = tmp_path / "stopped.ckpt"
    fit(tmp_path, Tiny(), [StopAndSave(checkpoint, epoch=0, batch=0)], max_epochs=1)
    probe = fit(tmp_path, Tiny(), [], ckpt_path=checkpoint, max_epochs=1)
    assert probe.should_stop_at_start is False, fixed_by_lightning("ExactResume._stop_as_decided")


# -- outside the loops ----------------------------------------------------------------------------------------------


def test_tripwire_datamodule_str_calls_its_loaders() -> None:
    class Described(LightningDataModule):
        calls = 0

        def train_dataloader(self) -> DataLoader:
            Described.calls += 1
            raise RuntimeError("not set up yet")

    str(Described())
    assert Described.calls == 1, fixed_by_lightning("lightning_internals.datamodules_named_by_class")


class Recorded(Tiny):
    """Tiny that records its arguments (it takes none) as its hyper-parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.save_hyperparameters()


class StatesWidth(LightningDataModule):
    width = 3  # a fact about the data, linked into the model's argument `width` where it has one


class LinksWidth(LightningCLI):
    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("data.width", "model.init_args.width", apply_on="instantiate")


def linked_cli(model: type, tmp_path: Path, cli: type[LightningCLI] = LinksWidth) -> LightningCLI:
    """A LightningCLI that links the datamodule's `width` into `model`, built (nothing run)."""
    args = [f"--model={model.__module__}.{model.__qualname__}", f"--data={__name__}.StatesWidth"]
    return cli(args=[*args, f"--trainer.default_root_dir={tmp_path}"], run=False, seed_everything_default=False)


def test_tripwire_a_link_the_model_does_not_take_is_among_its_hyper_parameters(tmp_path: Path) -> None:
    """jsonargparse counts the link as applied (it sets nothing), and LightningCLI records each applied link: a
    checkpoint would hand the model an argument it does not take."""
    model = linked_cli(Recorded, tmp_path).model
    assert model.hparams.get("width") == 3, fixed_by_lightning("lightning_internals.record_only_links_taken")


def test_tripwire_failing_on_exception_skips_teardown(tmp_path: Path) -> None:
    class Fails(Tiny):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise ValueError("the run fails")

    class SaveFails(Callback):
        def on_exception(self, trainer: Trainer, pl_module: Any, exception: BaseException) -> None:
            raise OSError("the disk is full")

    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(OSError, match="disk is full"):
            fit(tmp_path, Fails(), [SaveFails()])
        left = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, before)
    # Lightning's SIGTERM handler is left installed: its teardown, which restores the handlers, did not run.
    assert left is not before, fixed_by_lightning("ResumeCheckpoint.on_exception's try/except around the save")


# -- DDP (2 processes on CPU, gloo) ----------------------------------------------------------------------------------


class WithBackbone(LightningModule):
    """A backbone that BackboneFinetuning freezes until epoch 1, and a head; 8 one-sample batches an epoch in all,
    each process training on its own half (Lightning's DistributedSampler)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone, self.head = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.head(self.backbone(x.float().view(-1, 1))).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.head.parameters(), lr=0.01)  # BackboneFinetuning adds the backbone's group

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.arange(1, 9)), batch_size=1)


def _finetune_rank(rank: int, port: int, folder: Path) -> None:
    """One DDP process, as torchrun starts it: the model's weights after an epoch frozen and one unfrozen."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", NODE_RANK="0",
                      RANK=str(rank), LOCAL_RANK=str(rank))  # fmt: skip
    torch.manual_seed(0)
    model = WithBackbone()
    unfreezing = BackboneFinetuning(unfreeze_backbone_at_epoch=1)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[unfreezing], default_root_dir=folder)  # fmt: skip
    trainer.fit(model)
    torch.save({name: value.detach().clone() for name, value in model.state_dict().items()}, folder / f"{rank}.pt")
    dist.destroy_process_group()  # gloo's threads, left alive, can abort the process as it exits


@pytest.mark.slow
@pytest.mark.processes
def test_tripwire_ddp_does_not_average_the_gradients_of_parameters_unfrozen_after_wrapping(tmp_path: Path) -> None:
    ranks = mp.start_processes(_finetune_rank, args=(free_port(), tmp_path), nprocs=2, join=False).processes
    deadline = time.monotonic() + 240
    for process in ranks:
        process.join(timeout=max(1.0, deadline - time.monotonic()))
    for process in ranks:
        if process.is_alive():
            process.kill()
            process.join()
    assert [process.exitcode for process in ranks] == [0, 0]
    replicas = [torch.load(tmp_path / f"{rank}.pt") for rank in (0, 1)]
    # DDP averages the head's gradients (it trained when DDP wrapped the model): the replicas hold the same head.
    assert all(torch.equal(replicas[0][k], replicas[1][k]) for k in ("head.weight", "head.bias"))
    # The backbone, unfrozen at epoch 1, trained on each process's own gradients: two backbones.
    assert not torch.equal(replicas[0]["backbone.weight"], replicas[1]["backbone.weight"]), fixed_by_lightning(
        "process_group.ThawedParameterSync", "Lightning #20340"
    )
