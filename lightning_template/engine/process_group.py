"""A clean exit for every DDP process whose work is done: the process group is destroyed before Python shuts down."""

from __future__ import annotations

import atexit

import torch.distributed as dist
from lightning import Callback, LightningModule, Trainer


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class ProcessGroupTeardown(Callback):
    """Destroy torch.distributed's process group when a rank process that finished its work exits (ddp, ddp_spawn,
    torchrun, SLURM).

    Lightning does this for NCCL only. A gloo group (DDP on CPUs) left alive keeps worker threads that free tensors,
    and so take the GIL, while the interpreter is shutting down: the process then dies with SIGABRT ("terminate
    called without an active exception") after its work is done, and the launcher reports the whole run as failed.
    An exit handler runs while the interpreter is still whole, in the main process and in spawned workers alike.

    Destroying the group waits for the rank's collectives in flight, so it is only done once a trainer call has
    finished: a rank that failed or was stopped (SIGTERM, Ctrl-C, SLURM requeue) leaves at once, as the ranks may
    have left their loops at different collectives, which the others would never join."""

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        atexit.unregister(destroy_process_group)  # once per process, however many trainer calls it makes
        atexit.register(destroy_process_group)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        atexit.unregister(destroy_process_group)
