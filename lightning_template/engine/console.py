"""What a run prints: Rich's progress bar in a terminal, one line per epoch anywhere else.

A progress bar redraws itself many times a second; in a log file (CI, `nohup`, `| tee`) every
redraw stays, and a short run writes megabytes of frames. `EpochLines` prints the epoch's
metrics once, when the epoch (and its validation) is over.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar

from lightning_template.engine.sampling import inside_an_epoch


class EpochLines(ProgressBar):
    LOSSES_KEY = "epoch_line_losses"

    def __init__(self) -> None:
        super().__init__()
        self._enabled = True
        self._epoch_start, self._loss_sum, self._batches = 0.0, 0.0, 0
        self._resumed: tuple[float, int] | None = None  # the epoch's loss sum and batches in the checkpoint

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if inside_an_epoch(trainer):  # not a callback state: a resume in a terminal has no EpochLines to take it
            checkpoint[self.LOSSES_KEY] = (float(self._loss_sum), self._batches)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._resumed = checkpoint.get(self.LOSSES_KEY)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # A run resumed in the middle of an epoch gets no on_train_epoch_start for it: its time counts from here, its
        # train_loss from the epoch's first batch.
        self.on_train_epoch_start(trainer, pl_module)
        if self._resumed is not None and inside_an_epoch(trainer):
            self._loss_sum, self._batches = self._resumed
        self._resumed = None

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch_start = time.monotonic()
        self._loss_sum, self._batches = 0.0, 0

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:  # summed on the device: no synchronization per step
            # Summed in float32: a bfloat16 sum stops growing after a few hundred batches.
            self._loss_sum, self._batches = self._loss_sum + loss.detach().float(), self._batches + 1

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._enabled or not trainer.is_global_zero:
            return
        metrics = {
            name.removesuffix("_epoch"): float(value)
            for name, value in sorted(trainer.callback_metrics.items())
            if value.numel() == 1 and not name.endswith("_step") and not name.startswith("lr-")
        }
        if self._batches:  # the epoch's mean, not the last batch's value that train_loss holds
            # Lightning hands over the loss divided by the accumulation count (what it back-propagates): undone.
            metrics["train_loss"] = float(self._loss_sum / self._batches) * trainer.accumulate_grad_batches
        if trainer.optimizers:  # the first param group's rate (the monitor logs every group's)
            metrics["lr"] = trainer.optimizers[0].param_groups[0]["lr"]
        shown = "  ".join(f"{name} {value:.4g}" for name, value in metrics.items())
        total = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        elapsed = time.monotonic() - self._epoch_start
        print(f"epoch {trainer.current_epoch + 1}{total}  {shown}  ({elapsed:.1f} s)", flush=True)


def progress_bar() -> ProgressBar:
    """Rich's progress bar when stdout is a terminal, else `EpochLines`."""
    return RichProgressBar() if sys.stdout.isatty() else EpochLines()


# Lines of libraries that are not the project's or the user's: an advertisement, and messages about Lightning's own
# steps. Each filter names the logger or module it comes from and the message, so nothing else is hidden.
LIGHTNING_LINES = (
    "💡 Tip:",  # advertisements for hosted services
    "Loading `train_dataloader` to estimate number of stepping batches.",  # the schedule's step count, not news
    "An SIGTERMException was raised with message:",  # a stop asked for: ExactResume says where it stopped
)
ENGINE = Path(__file__).resolve().parent  # lightning_template/engine/
LIBRARY_WARNINGS = (
    # torch deprecated LeafSpec, which Lightning's own pytree helper still uses: nothing the user wrote calls it.
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, r"lightning\.pytorch\.utilities\._pytree"),
)


def _project_warnings_as_lines(format_warning: Any) -> Any:
    """Python's (or Lightning's) warning format, but a warning the engine gives is its one line alone: its message
    names what it is about (`ExactResume: ...`), not the engine's file and line. Any other keeps its place."""

    def format(message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
        if Path(os.path.realpath(filename)).is_relative_to(ENGINE):
            return f"{message}\n"
        return format_warning(message, category, filename, lineno, line)

    return format


LIGHTNING_LOGGERS = (
    "lightning.pytorch",
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
)


class _DropLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(LIGHTNING_LINES)


def quiet_library_noise() -> Callable[[], None]:
    """Drop the lines of LIGHTNING_LINES from Lightning's console log and the warnings of LIBRARY_WARNINGS raised
    inside those libraries, and the torch profiler's own log lines; print this engine's warnings as their one line.
    Returns what undoes it, but for the warning filters: `library_noise_quieted` restores those."""
    # Kineto, the torch profiler's library (configs/presets/profile_torch.yaml), prints `USDT:` lines at its start
    # and stop, and an error for a missing GPU, below level 6; it reads the level when a profiler first starts.
    kineto_set = "KINETO_LOG_LEVEL" in os.environ
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    dropped, loggers = _DropLines(), [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    for logger in loggers:
        logger.addFilter(dropped)
    for message, category, module in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    format_warning = warnings.formatwarning
    warnings.formatwarning = _project_warnings_as_lines(format_warning)

    def undo() -> None:
        for logger in loggers:
            logger.removeFilter(dropped)
        warnings.formatwarning = format_warning
        if not kineto_set:
            os.environ.pop("KINETO_LOG_LEVEL", None)

    return undo


@contextlib.contextmanager
def library_noise_quieted() -> Iterator[None]:
    """`quiet_library_noise` for a run of the CLI: Python's warning filters and format, Lightning's loggers and the
    environment are as they were after it, returned or raised, so that a plain Lightning Trainer run later in the
    same process (a notebook's) prints and warns as in a fresh one."""
    with warnings.catch_warnings():  # and what the run's own code adds to the filters
        undo = quiet_library_noise()
        try:
            yield
        finally:
            undo()


QUIETED = "quieted_warnings"  # a datamodule's class attribute: the start of library warnings wrong about its data


def quiet_warnings_of(datamodule: object) -> None:
    """Ignore for the rest of the run the library warnings whose message starts as one its class names in
    `quieted_warnings` (a dataset whose length a warning doubts, say). Called inside `library_noise_quieted`, whose
    end restores the filters: nothing outlives the run."""
    for message in getattr(datamodule, QUIETED, ()):
        warnings.filterwarnings("ignore", message=re.escape(message))


# A process that a DDP launcher spawned for a run (ddp_spawn's workers import the engine when they unpickle the
# trainer) is quieted for its life, which is the run's.
if multiprocessing.parent_process() is not None:
    quiet_library_noise()
