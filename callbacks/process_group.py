"""A clean exit for every DDP process: the process group is destroyed before Python shuts down."""

from __future__ import annotations

import atexit

import torch.distributed as dist
from lightning import Callback, LightningModule, Trainer


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class ProcessGroupTeardown(Callback):
    """Destroy torch.distributed's process group at the exit of each rank process (ddp, ddp_spawn, torchrun, SLURM).

    Lightning does this for NCCL only. A gloo group (DDP on CPUs) left alive keeps worker threads that free tensors,
    and so take the GIL, while the interpreter is shutting down: the process then dies with SIGABRT ("terminate
    called without an active exception") after its work is done, and the launcher reports the whole run as failed.
    An exit handler runs while the interpreter is still whole, in the main process and in spawned workers alike."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if dist.is_available() and dist.is_initialized():
            atexit.unregister(destroy_process_group)  # once per process, however many fit/test calls it makes
            atexit.register(destroy_process_group)
