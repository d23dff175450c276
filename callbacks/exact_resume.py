"""Bit-exact resume, from a checkpoint written at an epoch end, at a step, at a mid-epoch
validation, or on SIGTERM / Ctrl-C in the middle of an epoch.

What a resumed run must reproduce, and how:
- the order of samples: the samplers in `datamodules/sampling.py` derive it from
  (seed, epoch) and skip the batches Lightning's restored loop says are done;
- random numbers of the training step (dropout, on-device augmentation): re-seeded from
  (seed, epoch, rank) at every epoch start, and the generator states are saved in the
  checkpoint for a restart in the middle of an epoch; worker-side augmentation is seeded
  per sample (`datamodules.sampling.seeded_sample`);
- model, optimizer, scheduler and loop state: Lightning's checkpoint.

Stopping: SIGTERM (cluster pre-emption, `kill`) and the first Ctrl-C stop at the next
optimizer-step boundary (never between the micro-batches of one accumulated step) and
`ResumeCheckpoint` writes `last.ckpt` there; a second Ctrl-C aborts at once and writes a
checkpoint only if the loop happens to be at such a boundary. A checkpoint is never written
in the middle of a step or with non-finite weights.
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
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from datamodules.sampling import EpochSampler, derive_seed, global_seed


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def rng_states() -> dict[str, Any]:
    """Generator states in types `torch.load(weights_only=True)` accepts. On a GPU only this
    process's device: each DDP rank saves and restores its own."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
    }


def set_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    name, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if isinstance(states.get("cuda"), torch.Tensor) and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


def at_step_boundary(trainer: Trainer) -> bool:
    """No step is half done: no batch between forward and end, no accumulated gradient pending."""
    progress = trainer.fit_loop.epoch_loop.batch_progress.current
    done = progress.processed
    window_closed = done % trainer.accumulate_grad_batches == 0 or done >= trainer.num_training_batches
    return progress.started == progress.processed and window_closed


def weights_are_finite(pl_module: LightningModule) -> bool:
    return all(torch.isfinite(p).all() for p in pl_module.parameters())


class ResumeCheckpoint(ModelCheckpoint):
    """`last.ckpt`, rewritten at every epoch end (or validation) and on a graceful stop, never half a step.

    Installed in every run by train.py; `--ckpt_path last` resumes from it."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs = {"filename": "last", "enable_version_counter": False, "save_on_exception": True, **kwargs}
        super().__init__(**kwargs)

    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        if trainer.training and not at_step_boundary(trainer):
            rank_zero_warn(
                f"{filepath}: not written in the middle of an optimizer step (between micro-batches of an"
                " accumulated step, or inside a failing one); the previous checkpoint stays."
            )
            return
        if not weights_are_finite(trainer.lightning_module):
            rank_zero_warn(f"{filepath}: not written, the weights are not finite; the previous checkpoint stays.")
            return
        super()._save_checkpoint(trainer, filepath)


class ExactResume(Callback):
    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._saved: dict[str, Any] | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._pending_stop = False

    # -- checkpoint state ------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rng": rng_states()}
        trainer = self._trainer
        if trainer is not None and trainer.train_dataloader is not None:
            state.update(
                batch_size=trainer.train_dataloader.batch_size,
                world_size=trainer.world_size,
                batches_done=trainer.fit_loop.epoch_loop.batch_progress.current.processed,
            )
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = state_dict

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install_signal_handlers()
        if self._saved is None:
            return
        if getattr(trainer.train_dataloader, "num_workers", 0) > 0 and trainer.fit_loop._data_fetcher is not None:
            # Lightning created the loader's iterator before restoring its loop from the checkpoint
            # (to count the steps for the schedule), and the workers have already prefetched epoch 0's
            # first indices (Lightning #21938). Start it again, from the restored position.
            iter(trainer.fit_loop._data_fetcher)
        if not trainer.fit_loop.restarted_mid_epoch:
            return
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        if not isinstance(sampler, EpochSampler):
            raise TypeError(
                "Exact mid-epoch resume needs the training loader's sampler to be a"
                f" datamodules.sampling.EpochSampler (make_loader uses one); got {type(sampler).__name__}."
                " Resume from an epoch-end checkpoint instead."
            )
        self._check_same_batches(trainer)
        set_rng_states(self._saved["rng"])
        rank_zero_info(
            f"ExactResume: continuing epoch {trainer.current_epoch} after"
            f" {trainer.fit_loop.epoch_loop.batch_progress.current.processed} batches."
        )

    def _check_same_batches(self, trainer: Trainer) -> None:
        """Mid-epoch, the batches already trained are skipped: that needs the same batches."""
        saved = self._saved or {}
        now = {"batch_size": trainer.train_dataloader.batch_size, "world_size": trainer.world_size}
        changed = {k: (saved[k], v) for k, v in now.items() if k in saved and saved[k] != v}
        if changed:
            what = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
            raise ValueError(
                f"The checkpoint was written in the middle of an epoch with other batches ({what}): the samples"
                " already trained cannot be skipped exactly. Resume with the original --data.batch_size and"
                " --trainer.devices/num_nodes, or from a checkpoint written at the end of an epoch."
            )

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Shuffling, dropout and augmentation of an epoch then depend on nothing before it;
        # each rank draws its own dropout masks and augmentation offsets.
        seed_all(derive_seed(global_seed(), trainer.current_epoch, trainer.global_rank))

    # -- graceful stop -----------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        # Installed after Lightning's own SIGTERM handler, which is called once a stop is due.
        if threading.current_thread() is not threading.main_thread():
            return
        self._previous_handlers = {
            signal.SIGTERM: signal.signal(signal.SIGTERM, self._defer_stop),
            signal.SIGINT: signal.signal(signal.SIGINT, self._graceful_sigint),
        }

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}

    def _graceful_sigint(self, signum: int, frame: Any) -> None:
        rank_zero_info("Ctrl-C: stopping at the next step boundary and saving a checkpoint (press again to abort).")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), signal.SIGTERM)

    def _defer_stop(self, signum: int, frame: Any) -> None:
        self._pending_stop = True
        if self._trainer is not None and at_step_boundary(self._trainer):
            self._release_stop(self._trainer)  # between steps already: stop as soon as Lightning looks

    def _release_stop(self, trainer: Trainer) -> None:
        if not self._pending_stop:
            return
        self._pending_stop = False
        lightning_handler = self._previous_handlers.get(signal.SIGTERM)
        if callable(lightning_handler):  # stops DDP children too, and sets trainer.received_sigterm
            lightning_handler(signal.SIGTERM, None)
        else:
            trainer.received_sigterm = True

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if at_step_boundary(trainer):
            self._release_stop(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._release_stop(trainer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore_signal_handlers()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore_signal_handlers()  # teardown is not called when fit ends by an exception
