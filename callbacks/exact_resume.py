"""Bit-exact resume, also from a checkpoint written mid-epoch on SIGTERM or Ctrl-C.

What a resumed run must reproduce, and how:
- the order of samples: the samplers in `datamodules/sampling.py` derive it from
  (seed, epoch); after a mid-epoch stop the batches already trained on are skipped;
- random numbers of the training step (dropout, augmentation): re-seeded from
  (seed, epoch) at every epoch start, and the generator states are saved in the
  checkpoint for a restart in the middle of an epoch;
- model, optimizer, scheduler and loop state: Lightning's checkpoint.

Stopping: Lightning turns SIGTERM (cluster pre-emption, `kill`) into a stop after
the current batch; this callback does the same for the first Ctrl-C (SIGINT), so a
stop never lands between a gradient and its optimizer step. The checkpoint itself
is written by a `ModelCheckpoint(save_on_exception=True)` (see the configs); a
second Ctrl-C aborts at once. Limitation: a stop between the batches of one
gradient-accumulation step discards the partial accumulation.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from typing import Any

import numpy as np
import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from datamodules.sampling import global_seed


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def rng_states() -> dict[str, Any]:
    """Generator states in types `torch.load(weights_only=True)` accepts."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    name, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class ExactResume(Callback):
    def __init__(self) -> None:
        self._saved_rng: dict[str, Any] | None = None
        self._previous_sigint: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_states()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved_rng = state_dict["rng"]

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore_sigint()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore_sigint()  # teardown is not called when fit ends by an exception

    def _restore_sigint(self) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None

    def _graceful_sigint(self, signum: int, frame: Any) -> None:
        rank_zero_info("Ctrl-C: stopping after this batch and saving a checkpoint (press again to abort).")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), signal.SIGTERM)  # Lightning's own graceful stop

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Installed here, after Lightning has saved the handlers it restores when fit ends.
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._graceful_sigint)
        if not trainer.fit_loop.restarted_mid_epoch or self._saved_rng is None:
            return
        done_batches = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        loader = trainer.train_dataloader
        sampler = getattr(loader, "sampler", None)
        if not hasattr(sampler, "skip_next"):
            raise TypeError(
                f"Exact mid-epoch resume needs a sampler from datamodules/sampling.py; got {type(sampler).__name__}."
            )
        sampler.skip_next(done_batches * loader.batch_size)
        set_rng_states(self._saved_rng)
        rank_zero_info(f"ExactResume: continuing epoch {trainer.current_epoch} after batch {done_batches}.")

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Shuffling, dropout and augmentation of an epoch then depend on nothing before it.
        seed_all(global_seed() + trainer.current_epoch)
