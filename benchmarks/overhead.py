"""What `train.py fit` costs over a hand-written PyTorch loop, measured as interleaved A/B pairs.

One `train.py fit` run (the project's CLI, configs, callbacks, metrics and logging, unchanged) is
timed epoch by epoch; right after each of its epochs, inside the same process, the same number of
steps of a bare loop runs and is timed: the same network architecture, the same
optimizer groups and learning-rate schedule, the same in-memory batches normalized on the device.
Each (fit epoch, bare epoch) pair ran back to back, so a slow phase of a shared machine hits both
sides of a pair; the figures are medians over pairs of the per-pair difference or ratio.

Two uses (`benchmarks.run`):
- per-step overhead: a network and batch so small that a step is nearly pure framework work, so
  the difference per step is the framework's cost in microseconds, with little compute noise on it;
- end to end: the shipped SimpleCNN job, ratio of epoch times (the figure users feel).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning import Callback, LightningModule, Trainer

from lightning_template.tasks.classification import InMemoryImageDataModule
from lightning_template.tasks.classification.models.base import ClassificationModule
from lightning_template.tasks.optim import WarmupSchedule

ROOT = Path(__file__).resolve().parents[1]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def twin_of(module: ClassificationModule, module_class: type | None = None) -> ClassificationModule:
    """A fresh module of `module`'s hyper-parameters that runs as it does: `compile` and `channels_last` are not
    hyper-parameters (a checkpoint does not fix them), so they are copied apart."""
    hparams = {k: v for k, v in module.hparams.items() if not k.startswith("_")}
    return (module_class or type(module))(**hparams, compile=module.compile_net, channels_last=module.channels_last)


class BareLoop:
    """The loop a careful user writes by hand, for a twin of the project's model: a fresh network of the same
    architecture, the project's optimizer groups and learning-rate schedule; no metrics, no logging."""

    def __init__(self, module: ClassificationModule, datamodule: InMemoryImageDataModule, schedule: dict) -> None:
        twin = twin_of(module)
        twin.configure_model()  # the same memory format (channels_last) and compilation as the project's run
        self.device = module.device
        self.model = twin.to(self.device).train()  # its forward only lays the batch out as the network expects
        self.loss_fn = twin.loss_fn
        self.optimizer = twin.make_optimizer(twin.parameter_groups("head") + twin.parameter_groups("backbone"))
        self.scheduler = WarmupSchedule(self.optimizer, **schedule)
        self.data = datamodule
        self.loader = datamodule.train_dataloader()

    def epoch(self, steps: int) -> float:
        """Seconds for `steps` training steps, loading included (as in Lightning's epoch)."""
        sync(self.device)
        start = time.perf_counter()
        for index, (images, labels) in enumerate(self.loader):
            if index == steps:
                break
            images = self.data.normalize(images.to(self.device, non_blocking=True))
            labels = labels.to(self.device, non_blocking=True)
            loss = self.loss_fn(self.model(images), labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
        sync(self.device)
        return time.perf_counter() - start


@dataclass(frozen=True)
class FitEpoch:
    steps_s: float  # epoch start to the end of its last step (loading, steps, per-step logging and callbacks)
    epoch_end_s: float  # what follows until the next epoch starts: epoch-end logging, metrics, last.ckpt

    @property
    def total_s(self) -> float:
        return self.steps_s + self.epoch_end_s


class PairedEpochs(Callback):
    """Right after each training epoch of the run, one bare-loop epoch of as many steps, timed apart.

    Timestamps at each epoch start, at the epoch-end hook (before the checkpoint callbacks and the
    module's own epoch end) and at the end of training; the bare epoch's time is taken out of the
    fit epoch's end part, so a fit epoch counts everything `train.py fit` does per epoch.
    """

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.step_ends: list[float] = []
        self.bare_s: list[float] = []

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        hparams = {k: v for k, v in trainer.datamodule.hparams.items() if not k.startswith("_")}
        datamodule = type(trainer.datamodule)(**hparams)  # its own loader over the same data
        datamodule.setup("fit")
        if getattr(datamodule, "augment", False):
            raise ValueError("the bare loop does not augment: benchmark a job without data.augment")
        schedule = trainer.lr_scheduler_configs[0].scheduler.factor_kwargs
        self.bare = BareLoop(pl_module, datamodule, schedule)
        self.steps = trainer.num_training_batches

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sync(pl_module.device)
        self.starts.append(time.perf_counter())

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sync(pl_module.device)
        self.step_ends.append(time.perf_counter())
        self.bare_s.append(self.bare.epoch(self.steps))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sync(pl_module.device)
        self.starts.append(time.perf_counter())

    def fit_epochs(self) -> list[FitEpoch]:
        return [
            FitEpoch(steps_s=step_end - start, epoch_end_s=next_start - step_end - bare)
            for start, step_end, bare, next_start in zip(
                self.starts[:-1], self.step_ends, self.bare_s, self.starts[1:], strict=True
            )
        ]


def paired_epochs(
    config: str, steps: int, pairs: int, overrides: list[str], workdir: Path
) -> tuple[list[FitEpoch], list[float]]:
    """`train.py fit --config config` for `pairs` + 1 epochs of `steps` steps, without validation, each epoch
    followed by a bare-loop epoch; (fit seconds, bare seconds) per pair, the first pair (warm-up) dropped."""
    from lightning_template.engine.cli import ProjectCLI  # the CLI of train.py itself, run in this process

    args = [
        "fit", "--config", str(ROOT / config), f"--trainer.max_epochs={pairs + 1}",
        f"--trainer.limit_train_batches={steps}", "--trainer.check_val_every_n_epoch=100000",
        "--trainer.num_sanity_val_steps=0", "--test_after_fit=false",
        f"--trainer.logger.init_args.save_dir={workdir}", f"--trainer.default_root_dir={workdir}",
        "--trainer.callbacks+=benchmarks.overhead.PairedEpochs", *overrides,
    ]  # fmt: skip
    cli = ProjectCLI(args=args)
    timer = next(c for c in cli.trainer.callbacks if isinstance(c, PairedEpochs))
    return timer.fit_epochs()[1:], timer.bare_s[1:]


JOB = "configs/simple_cnn.yaml"
# The per-step job: SimpleCNN cut to one channel per conv, batch 8, so a step is nearly all framework work.
TINY = ["--data.batch_size=8", "--model.channels=[1,1]", "--model.hidden=4"]


def one_device(device: torch.device) -> list[str]:
    return [f"--trainer.accelerator={'gpu' if device.type == 'cuda' else 'cpu'}", "--trainer.devices=1"]


def per_step_overhead(device: torch.device, steps: int, pairs: int, workdir: Path) -> dict[str, list[float]]:
    """The tiny job's pairs, per pair: overhead in µs per step, the same in units of the pair's own bare step
    (a whole run on a slower phase of a shared machine moves the microseconds, not this), both steps in µs, and
    the fit epoch's end in ms."""
    fit, bare = paired_epochs(JOB, steps, pairs, TINY + one_device(device), workdir)
    return {
        "us_per_step": [(f.steps_s - b) / steps * 1e6 for f, b in zip(fit, bare, strict=True)],
        "in_bare_steps": [(f.steps_s - b) / b for f, b in zip(fit, bare, strict=True)],
        "bare_step_us": [b / steps * 1e6 for b in bare],
        "fit_step_us": [f.steps_s / steps * 1e6 for f in fit],
        "epoch_end_ms": [f.epoch_end_s * 1e3 for f in fit],
    }


def lightning_floor(device: torch.device, steps: int, pairs: int) -> list[float]:
    """What Lightning itself costs per step, in bare-loop steps of the same pair: the tiny job's network and data
    in a plain Trainer (no callbacks, logger, checkpoints or progress bar) whose training step only returns the
    loss, paired with the bare loop as `train.py fit` is. The project cannot go below this while on Lightning."""
    from lightning_template.engine.cli import ProjectCLI

    config = ProjectCLI(args=["--config", str(ROOT / JOB), *TINY], run=False)
    module_class = type(config.model)

    class LightningOnly(module_class):  # the same network and optimizer, nothing else in the step
        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            images, labels = batch
            return self.loss_fn(self(images), labels)

    module = twin_of(config.model, LightningOnly)
    timer = PairedEpochs()
    trainer = Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, max_epochs=pairs + 1,
        limit_train_batches=steps, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[timer],
    )  # fmt: skip
    trainer.fit(module, datamodule=config.datamodule)
    fit, bare = timer.fit_epochs()[1:], timer.bare_s[1:]
    return [(f.steps_s - b) / b for f, b in zip(fit, bare, strict=True)]


def end_to_end(device: torch.device, steps: int, pairs: int, workdir: Path) -> dict[str, list[float]]:
    """The shipped job's pairs: fit and bare epoch seconds (epoch end included) and their ratio, per pair."""
    fit, bare = paired_epochs(JOB, steps, pairs, one_device(device), workdir)
    fit_s = [f.total_s for f in fit]
    return {"ratio": [f / b for f, b in zip(fit_s, bare, strict=True)], "fit_s": fit_s, "bare_s": bare}
