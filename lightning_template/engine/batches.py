"""The same batches in a resumed run: the training loader continues from the loop's position, and every training
batch draws its random numbers from a seed of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from lightning_template.engine.errors import ConfigError
from lightning_template.engine.lightning_internals import (
    batches_done,
    call_before_batch_hooks,
    keeps_first_train_iterator,
    last_batch_trained,
    load_train_loader_states,
    restart_train_iterator,
    restarted_mid_epoch,
    restored_after_last_batch,
    wrap_train_loader,
)
from lightning_template.engine.sampling import (
    ResumesFromLoop,
    derive_seed,
    global_seed,
    resumable_loader,
    seed_host,
)

# What a mid-epoch resume must find the same to skip the batches already trained.
SHAPE = ("batch_size", "world_size", "num_workers")


def seed_all(seed: int) -> None:
    seed_host(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)
    if torch.backends.mps.is_available():
        torch.mps.manual_seed(seed)


class ResumableBatches(Callback):
    """A resumed run trains the batches the run never stopped would have, in its order, with its random numbers.

    Guarantees:
    - the training loader is rebuilt to continue from the loop's position (`resumable_loader`), or said, in one line
      at the run's start, not to be able to continue from the middle of an epoch (and why);
    - every training batch draws from a generator seeded by (seed, epoch, batch, rank), set as the batch is handed
      to the module's batch hooks (and at an epoch's start, at each batch's end, after a validation inside an
      epoch): no generator state to save, and each DDP rank has its own stream;
    - at a resume, the loader's iterator, which Lightning made before restoring the checkpoint, is made again from
      the restored position; at the first epoch's start, after that epoch's seeding;
    - a mid-epoch resume with other batches (batch size, world size, streamed workers) is refused in one line.

    `ExactResume` calls what a resume needs (`restart`, `next_epoch_starts_here`, `continue_mid_epoch`), in its
    order; this callback's own hooks seed the batches. Its state is the batches' shape (`SHAPE`)."""

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._seed = 0  # the run's --seed_everything
        self._saved: dict[str, Any] = {}  # the checkpoint's batches (SHAPE)
        self.inexact: str | None = None  # why the training loader cannot continue mid-epoch, if it cannot
        self._iterate_anew = False  # resumed between epochs: the next epoch's loader iterator is made after seeding
        self._undo_batch_hooks: Callable[[], None] | None = None
        self._seeded_at_hand_over = False  # batches reach the module's batch hooks (no `dataloader_iter` step)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = trainer
        if stage == "fit":
            self._seed = global_seed()  # read once: it is fixed before the run starts, and read every batch
            wrap_train_loader(trainer, self._resumable)

    def _resumable(self, loader: Any) -> Any:
        loader, self.inexact = resumable_loader(loader, self._trainer)
        return loader

    # -- checkpoint state: what the epoch consumed, to refuse a resume that cannot skip it exactly --
    def state_dict(self) -> dict[str, Any]:
        trainer = self._trainer
        if trainer is None or trainer.train_dataloader is None:
            return {}
        loader = trainer.train_dataloader  # several loaders (a dict or list) have no batch size of their own
        state = {"batch_size": getattr(loader, "batch_size", None), "world_size": trainer.world_size}
        if isinstance(loader, ResumesFromLoop) and loader.worker_dependent:  # streamed: workers own chunk shares
            state["num_workers"] = loader.num_workers
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = state_dict

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        # A checkpoint written when ExactResume was the one callback of exact resume holds this state in ExactResume's
        # (every callback's on_load_checkpoint runs before any load_state_dict).
        states = checkpoint.get("callbacks") or {}
        if self.state_key not in states and (older := states.get("ExactResume")):
            states[self.state_key] = {key: older[key] for key in SHAPE if key in older}

    # -- at a resume, called by ExactResume ----------------------------------------------------
    def warn_if_inexact(self, trainer: Trainer) -> None:
        """A training loader that cannot continue from the middle of an epoch, said at a run's start, and at a
        resume after an epoch's last batch (the next epoch starts from its start)."""
        between_epochs = not restarted_mid_epoch(trainer) or restored_after_last_batch(trainer)
        if not (self.inexact and between_epochs):
            return
        rank_zero_warn(
            f"ExactResume: {self.inexact}, which cannot continue from the middle of an epoch: a run stopped there"
            " (SIGTERM, Ctrl-C, a step checkpoint) resumes with that epoch's data from its start, not exactly."
            " Checkpoints written at epoch ends resume exactly. A map-style Dataset in a plain DataLoader"
            " (shuffle=True or False) is resumed exactly."
        )
        loaders = trainer.train_dataloader  # one, or several in a dict or list
        loaders = list(loaders.values()) if isinstance(loaders, dict) else loaders
        loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
        if any(getattr(loader, "persistent_workers", False) for loader in loaders):
            rank_zero_warn(
                "ExactResume: the training loader, kept as it is, keeps its worker processes from epoch to epoch"
                " (persistent_workers=True): random numbers they draw (a random transform in the dataset) run on"
                " across epochs, and a resumed run's new workers start other streams, so even from an epoch's end"
                " it resumes exactly only if its workers draw none. With persistent_workers=False (and no generator"
                " of the loader's own) each epoch's workers are seeded from the run's seed."
            )

    def restart(self, trainer: Trainer) -> None:
        """The training iterator made again, from the restored position, where Lightning made it before the restore;
        resumed between epochs, made again at the next epoch's start, after its seeding."""
        self._iterate_anew = not restarted_mid_epoch(trainer)
        loaded = load_train_loader_states(trainer)
        workers = getattr(trainer.train_dataloader, "num_workers", 0) > 0
        if loaded or workers:
            # Lightning created the loader's iterator before restoring its loop from the checkpoint (to count the
            # steps for the schedule): its workers have already prefetched epoch 0's first indices (Lightning
            # #21938), a StatefulDataLoader started from its beginning. Start it again, from the restored position.
            restart_train_iterator(trainer)

    def next_epoch_starts_here(self) -> None:
        """Restarted after an epoch's last batch: the next epoch is seeded, and its iterator made, at its start (as
        between epochs)."""
        self._iterate_anew = True

    def continue_mid_epoch(self, trainer: Trainer, done: int) -> bool:
        """Resumed after `done` batches of an epoch: seeded there; whether the loader skips them (else said why not,
        where a batch of the epoch is left to train); refused if the batches are not the checkpoint's."""
        self._seed_batch(trainer, done)
        if self.inexact and last_batch_trained(trainer):  # written after the epoch's last batch: none is trained again
            return True
        if self.inexact:
            rank_zero_warn(
                f"ExactResume: resuming epoch {trainer.current_epoch} after {done} batches, but {self.inexact}: it"
                " starts the epoch's data again, so the rest of this epoch is not the run that was stopped."
            )
            return False
        self._check_same_batches(trainer)
        return True

    def _check_same_batches(self, trainer: Trainer) -> None:
        """Mid-epoch, the batches already trained are skipped: that needs the same batches."""
        saved = self._saved
        loader = trainer.train_dataloader
        now = {"batch_size": loader.batch_size, "world_size": trainer.world_size, "num_workers": loader.num_workers}
        changed = {k: (saved[k], v) for k, v in now.items() if k in saved and saved[k] != v}
        if changed:
            what = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items())
            raise ConfigError(
                f"The checkpoint was written in the middle of an epoch with other batches ({what}): the samples"
                " already trained cannot be skipped exactly. Resume with the original --data.batch_size,"
                " --trainer.devices/num_nodes (and --data.num_workers for streamed data), or from a checkpoint"
                " written at the end of an epoch."
            )

    # -- one random stream per (seed, epoch, batch, rank) ---------------------------------------
    def _seed_batch(self, trainer: Trainer, batch: int) -> None:
        seed_all(derive_seed(self._seed, trainer.current_epoch, batch, trainer.global_rank))

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._undo_batch_hooks = call_before_batch_hooks(trainer, self._seed_training_batch)
        self._seeded_at_hand_over = False

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._seed_batch(trainer, 0)
        if self._iterate_anew:
            self._iterate_anew = False
            # Lightning made the iterator before the run was seeded for this epoch, and keeps it for the first epoch of
            # a resumed run: a sampler that draws its order from torch's generator (a batch sampler's RandomSampler)
            # would take another order than the run never stopped. Made again, after the epoch's seeding.
            if keeps_first_train_iterator(trainer):
                restart_train_iterator(trainer)

    def _seed_training_batch(self) -> None:
        """Seeded as each training batch is handed to the module's batch hooks, before it is augmented on the device
        there: random numbers drawn after the last batch (in the module's on_train_batch_end) are not in its stream."""
        trainer = self._trainer
        if trainer is not None and trainer.training:
            self._seeded_at_hand_over = True
            self._seed_batch(trainer, batches_done(trainer))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if not self._seeded_at_hand_over:  # a training_step that takes a `dataloader_iter`: no batch hooks run
            self._seed_batch(trainer, batches_done(trainer))

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:  # validation inside an epoch
            self._seed_batch(trainer, batches_done(trainer))

    def _undo(self) -> None:
        if self._undo_batch_hooks is not None:
            self._undo_batch_hooks()
            self._undo_batch_hooks = None

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._undo()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._undo()
