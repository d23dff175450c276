"""Training throughput of the shipped models, and the fraction of the machine's matmul peak they reach.

A model's training step (forward, loss, backward, optimizer step on one synthetic batch of its job's
shape and batch size) and a square fp32 matmul are timed in alternating windows: the peak is measured
next to each model window, so a slow phase of a shared machine lowers both and the fraction of peak
per window pair stays meaningful. Figures are medians over windows (`benchmarks.stats`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from lightning_template.engine.console import quiet_library_noise
from lightning_template.tasks.classification.models.base import ClassificationModule

from benchmarks.overhead import sync

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class StepSpec:
    """What one timed training step runs."""

    precision: str = "32-true"  # or 16-mixed / bf16-mixed (autocast)
    channels_last: bool = False
    compile: bool = False


def job_model(config: str, overrides: list[str] = ()) -> tuple[ClassificationModule, int, tuple[int, ...]]:
    """The model of a job config as `train.py` builds it, its batch size and input shape."""
    from lightning_template.engine.cli import ProjectCLI

    args = ["--config", str(ROOT / config), "--trainer.logger=false", *overrides]
    cli = ProjectCLI(args=args, run=False)
    datamodule = cli.datamodule
    return cli.model, datamodule.batch_size, tuple(datamodule.input_shape)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "32-true":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def training_step(
    model: ClassificationModule, batch: int, input_shape: tuple[int, ...], device: torch.device, spec: StepSpec
) -> tuple[Callable[[], None], int]:
    """A closure running one training step of `model.net` (as the bare loop would), and its FLOPs (fp32 count)."""
    net = model.net.to(device).train()
    images = torch.randn(batch, *input_shape, device=device)
    labels = torch.randint(0, model.num_classes, (batch,), device=device)
    if spec.channels_last:
        net = net.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    with FlopCounterMode(display=False) as counter:
        model.loss_fn(net(images), labels).backward()
    net.zero_grad(set_to_none=True)
    optimizer = model.make_optimizer(model.parameter_groups("head") + model.parameter_groups("backbone"))
    scaler = torch.amp.GradScaler(device.type, enabled=spec.precision == "16-mixed")
    forward = torch.compile(net) if spec.compile else net

    def step() -> None:
        with autocast(device, spec.precision):
            loss = model.loss_fn(forward(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return step, counter.get_total_flops()


def matmul_window(device: torch.device, size: int, seconds: float) -> float:
    """GFLOP/s of back-to-back fp32 `size`x`size` matmuls over about `seconds`."""
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    a @ b
    sync(device)
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or count < 2:
        a @ b
        count += 1
        if count % 8 == 0 or device.type != "cuda":
            sync(device)
    sync(device)
    elapsed = time.perf_counter() - start
    return 2 * size**3 * count / elapsed / 1e9


def step_window(step: Callable[[], None], device: torch.device, seconds: float) -> float:
    """Seconds per step over as many whole steps as fit in about `seconds` (2 at least)."""
    sync(device)
    count, start = 0, time.perf_counter()
    while count < 2 or time.perf_counter() - start < seconds:
        step()
        count += 1
        sync(device)
    return (time.perf_counter() - start) / count


def interleaved_windows(
    steps: dict[str, tuple[Callable[[], None], int, int]],
    device: torch.device,
    windows: int,
    seconds: float,
    peak_size: int,
    warmup_steps: int = 3,
) -> dict[str, dict[str, list[float]]]:
    """For each window round and each model in turn: a matmul-peak window, then a model window.

    `steps`: name -> (step closure, FLOPs per step, batch size). Returns per model the lists
    `step_s`, `images_per_s`, `gflops_per_s`, `peak_gflops_per_s`, `fraction_of_peak` (one per window)."""
    for step, _, _ in steps.values():
        for _ in range(warmup_steps):
            step()
    sync(device)
    out: dict[str, dict[str, list[float]]] = {name: {} for name in steps}
    for _ in range(windows):
        for name, (step, flops, batch) in steps.items():
            peak = matmul_window(device, peak_size, seconds / 3)
            step_s = step_window(step, device, seconds)
            achieved = flops / step_s / 1e9
            for key, value in (
                ("step_s", step_s),
                ("images_per_s", batch / step_s),
                ("gflops_per_s", achieved),
                ("peak_gflops_per_s", peak),
                ("fraction_of_peak", achieved / peak),
            ):
                out[name].setdefault(key, []).append(value)
    return out


# The operations FlopCounterMode counts, as the CPU profiler names their kernels (forward and backward).
FLOP_OPS = {"aten::mkldnn_convolution", "aten::convolution_backward", "aten::mm", "aten::addmm", "aten::bmm"}


def time_in_flop_ops(step: Callable[[], None], steps: int = 5) -> float:
    """The share of a training step's CPU time spent in convolutions and matmuls, the only operations whose FLOPs
    count towards the fraction of peak: the rest (normalization, activations, pooling, dropout, the optimizer)
    moves memory without counted FLOPs, so a step can reach at most this share of the matmul rate's fraction."""
    quiet_library_noise()  # before the profiler's first start: its library's log lines
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(steps):
            step()
    events = profiler.key_averages()
    total = sum(event.self_cpu_time_total for event in events)
    return sum(event.self_cpu_time_total for event in events if event.key in FLOP_OPS) / total
