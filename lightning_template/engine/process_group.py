"""DDP processes: the gradients DDP does not average, and a clean exit of every process whose work is done."""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

import torch
import torch.distributed as dist
from lightning import Callback, LightningModule, Trainer
from torch.nn.parallel import DistributedDataParallel

from lightning_template.engine.lightning_internals import closes_accumulation_window


class ThawedParameterSync(Callback):
    """Under DDP, average the gradients of the parameters that were frozen when DDP wrapped the model and train since
    (a `BaseFinetuning`'s unfreezing, Lightning's `BackboneFinetuning` among them: Lightning #20340).

    DDP averages the gradients of the parameters that trained when it wrapped the model, and no others: without this,
    each process would train those parameters on its own gradients, the replicas would drift apart, and a checkpoint
    (rank 0's) would hold one of them. One all-reduce for all of them after a step's last backward pass (each backward
    pass in manual optimization): before mixed precision's loss scaling looks for overflows, so every process skips
    (or takes) the same steps. As DDP does, a parameter that some process used gets the average on every process.
    train.py runs its `on_fit_start` first; a Trainer built by hand lists it before any callback that unfreezes there.
    """

    def __init__(self) -> None:
        self._averaged_by_ddp: set[int] = set()

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning has just wrapped the model: DDP averages what trains now.
        self._averaged_by_ddp = {id(p) for p in pl_module.parameters() if p.requires_grad}

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not isinstance(trainer.strategy.model, DistributedDataParallel):
            return
        # In manual optimization DDP averages every backward pass, whatever the accumulation says (Lightning's
        # StochasticWeightAveraging sets a whole epoch's for its BatchNorm epoch, in which the module still steps).
        if pl_module.automatic_optimization and not closes_accumulation_window(trainer):
            return
        # Chosen alike on every process (what trains), not by which gradients this process has: the same collective.
        thawed = [p for p in pl_module.parameters() if p.requires_grad and id(p) not in self._averaged_by_ddp]
        if not thawed:
            return
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in thawed]
        used = torch.tensor([p.grad is not None for p in thawed], dtype=grads[0].dtype, device=grads[0].device)
        *averaged, used = averaged_across_processes([*grads, used], trainer.world_size)
        for parameter, grad, anywhere in zip(thawed, averaged, used.tolist(), strict=True):
            if anywhere:
                parameter.grad = grad


def averaged_across_processes(tensors: list[torch.Tensor], world_size: int) -> list[torch.Tensor]:
    """Each tensor averaged over the process group, in one collective for all of them."""
    summed = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(summed)
    pieces = (summed / world_size).split([t.numel() for t in tensors])
    return [piece.view_as(t) for piece, t in zip(pieces, tensors, strict=True)]


def leave(code: int) -> NoReturn:
    """Exit with `code` after a failed or stopped run. A process still in a process group leaves without the
    interpreter's exit, where gloo's threads, freeing tensors, can abort it (SIGABRT) after its work is done: its
    loggers were closed by Lightning as the run ended, and its output is flushed here."""
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_available() and dist.is_initialized():
        os._exit(code)
    sys.exit(code)


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
