"""Speed of the template, measured side by side in one process: `make bench` or `python -m benchmarks.run`.

1. overhead:  `train.py fit` (SimpleCNN, Fashion-MNIST) vs a bare PyTorch loop on the same
               in-memory data, model, batch size and seed; median epoch time, ratio.
2. data:      our datamodule vs torchvision's FashionMNIST + ToTensor/Normalize + DataLoader:
               loading alone, and loading + training (bare loop), images/s.
3. model:     SimpleCNN and ResNet-18 training throughput and achieved GFLOP/s against this
               machine's measured fp32 matmul peak, eager and with `--model.compile true`.
4. accuracy:  time to target accuracy of each shipped config, read from the TensorBoard logs of
               its latest run (`python train.py fit --config ...` first).

Runs unchanged on CPU and GPU. Timings are noisy on shared machines: the Makefile pins glibc's
malloc thresholds, every number is a median over repeats after a warm-up, and only ratios
measured in this same run are compared. Results: printed table + JSON (--out).
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torchvision
from lightning import Callback, Trainer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from datamodules import FashionMNISTDataModule
from models import ResNetClassifier, SimpleCNN
from train import TemplateCLI

ROOT = Path(__file__).resolve().parents[1]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


class EpochTimer(Callback):
    """Wall time of each training epoch (data loading + steps), as Lightning runs it."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_epoch_start(self, trainer: Trainer, pl_module: Any) -> None:
        sync()
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: Any) -> None:
        sync()
        self.times.append(time.perf_counter() - self._start)


def median_after_warmup(times: list[float]) -> tuple[float, float]:
    """Median and (max - min) spread, dropping the first (warm-up) measurement."""
    kept = times[1:] if len(times) > 1 else times
    return statistics.median(kept), max(kept) - min(kept)


def bare_loop_epochs(datamodule: FashionMNISTDataModule, epochs: int, batches: int, loader: Any = None) -> list[float]:
    """The classic loop: zero_grad / forward / loss / backward / step."""
    torch.manual_seed(42)
    net = SimpleCNN().net.to(DEVICE)
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.002, weight_decay=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = loader or datamodule.train_dataloader()
    times = []
    for _ in range(epochs):
        sync()
        start = time.perf_counter()
        for i, (images, labels) in enumerate(loader):
            if i == batches:
                break
            images, labels = images.to(DEVICE, non_blocking=True), labels.to(DEVICE, non_blocking=True)
            if images.dtype == torch.uint8:
                images, labels = datamodule.normalize(images), labels
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(net(images), labels)
            loss.backward()
            optimizer.step()
        sync()
        times.append(time.perf_counter() - start)
    return times


def lightning_fit_epochs(epochs: int, batches: int, workdir: Path) -> list[float]:
    """`train.py fit --config configs/simple_cnn.yaml`, training only (no validation), timed per epoch."""
    args = [
        "fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), f"--trainer.max_epochs={epochs}",
        f"--trainer.limit_train_batches={batches}", "--trainer.check_val_every_n_epoch=1000",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false", "--test_after_fit=false", "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.save_dir={workdir}", "--trainer.callbacks+=benchmarks.run.EpochTimer",
        f"--trainer.accelerator={DEVICE.type}", "--trainer.devices=1",
    ]  # fmt: skip
    cli = TemplateCLI(args=args)
    # By name: run as __main__, this module's EpochTimer is not the class the CLI imported.
    return next(c for c in cli.trainer.callbacks if type(c).__name__ == "EpochTimer").times


def bench_overhead(epochs: int, batches: int, workdir: Path) -> dict[str, Any]:
    datamodule = FashionMNISTDataModule(batch_size=128)
    datamodule.setup("fit")
    bare, fit = [], []
    for _ in range(2):  # interleaved, so drift of the machine hits both; each run's first epoch is warm-up
        bare += bare_loop_epochs(datamodule, epochs, batches)[1:]
        fit += lightning_fit_epochs(epochs, batches, workdir)[1:]
    bare_median, bare_spread = statistics.median(bare), max(bare) - min(bare)
    fit_median, fit_spread = statistics.median(fit), max(fit) - min(fit)
    return {
        "batches_per_epoch": batches,
        "bare_loop_epoch_s": round(bare_median, 3),
        "bare_loop_spread_s": round(bare_spread, 3),
        "train_py_fit_epoch_s": round(fit_median, 3),
        "train_py_fit_spread_s": round(fit_spread, 3),
        "ratio_fit_over_bare": round(fit_median / bare_median, 3),
        "goal": "<= 1.03",
    }


def torchvision_root(source: Path, workdir: Path) -> Path:
    """torchvision's FashionMNIST reads root/FashionMNIST/raw/<uncompressed IDX files>."""
    raw = workdir / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for gz in source.glob("*-ubyte.gz"):
        with gzip.open(gz) as f_in, open(raw / gz.name.removesuffix(".gz"), "wb") as f_out:
            shutil.copyfileobj(f_in, f_out)
    return workdir


def time_loader(loader: Any, transform: Callable | None, repeats: int) -> tuple[float, int]:
    """Median seconds per full pass over `loader` (after one warm-up pass), and the image count."""
    times, count = [], 0
    for _ in range(repeats + 1):
        count = 0
        start = time.perf_counter()
        for images, _labels in loader:
            images = images.to(DEVICE, non_blocking=True)
            if transform is not None:
                images = transform(images)
            count += len(images)
        sync()
        times.append(time.perf_counter() - start)
    return median_after_warmup(times)[0], count


def bench_data(workdir: Path, repeats: int, batches: int) -> dict[str, Any]:
    datamodule = FashionMNISTDataModule(batch_size=128)
    datamodule.setup("fit")
    ours_s, ours_n = time_loader(datamodule.train_dataloader(), datamodule.normalize, repeats)
    root = torchvision_root(Path(datamodule.resolve_files()), workdir)
    transform = torchvision.transforms.Compose(
        [torchvision.transforms.ToTensor(), torchvision.transforms.Normalize(datamodule.mean, datamodule.std)]
    )
    classic = torchvision.datasets.FashionMNIST(str(root), train=True, transform=transform)
    result: dict[str, Any] = {"ours_images_per_s": round(ours_n / ours_s)}
    for workers in (0, 2):
        loader = DataLoader(classic, batch_size=128, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
        seconds, count = time_loader(loader, None, repeats)
        result[f"torchvision_{workers}_workers_images_per_s"] = round(count / seconds)
    best_classic = max(v for k, v in result.items() if k.startswith("torchvision"))
    result["loading_speedup"] = round(result["ours_images_per_s"] / best_classic, 1)
    result["loading_goal"] = ">= 5x"
    # End to end: the same bare training loop fed by either pipeline.
    ours_train = median_after_warmup(bare_loop_epochs(datamodule, 3, batches))[0]
    classic_loader = DataLoader(classic, batch_size=128, shuffle=True, num_workers=0)
    classic_train = median_after_warmup(bare_loop_epochs(datamodule, 3, batches, classic_loader))[0]
    result.update(
        end_to_end_batches=batches,
        end_to_end_ours_s=round(ours_train, 3),
        end_to_end_torchvision_s=round(classic_train, 3),
        end_to_end_speedup=round(classic_train / ours_train, 2),
    )
    return result


def matmul_peak_gflops(size: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(size, size, device=DEVICE), torch.randn(size, size, device=DEVICE)
    for _ in range(2):
        a @ b
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9


def training_step_flops(net: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(net(images), labels).backward()
    net.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def bench_model(build: Callable[[], Any], batch: int, steps: int, peak: float, compile: bool) -> dict[str, Any]:
    images = torch.randn(batch, 1, 28, 28, device=DEVICE)
    labels = torch.randint(0, 10, (batch,), device=DEVICE)
    result: dict[str, Any] = {}
    for mode in ("eager", "compile") if compile else ("eager",):
        torch.manual_seed(0)
        net = build().net.to(DEVICE)
        flops = training_step_flops(net, images, labels)
        if mode == "compile":
            net.compile()
        optimizer = torch.optim.AdamW(net.parameters())
        compile_start = time.perf_counter()
        times = []
        for step in range(steps + 3):
            sync()
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(images), labels).backward()
            optimizer.step()
            sync()
            times.append(time.perf_counter() - start)
            if step == 0:
                first_step_s = time.perf_counter() - compile_start
        step_s = statistics.median(times[3:])
        result[mode] = {
            "images_per_s": round(batch / step_s),
            "gflops_per_s": round(flops / step_s / 1e9, 1),
            "fraction_of_matmul_peak": round(flops / step_s / 1e9 / peak, 3),
            "first_step_s": round(first_step_s, 1),
        }
    if compile:
        result["compile_speedup"] = round(result["compile"]["images_per_s"] / result["eager"]["images_per_s"], 2)
    result["train_gflop_per_image"] = round(flops / batch / 1e9, 4)
    return result


TARGETS = {"simple_cnn": 0.91, "vit_fashion_mnist": 0.88, "resnet_fmnist_pretrain": 0.93}


def time_to_accuracy(logs: Path) -> dict[str, Any]:
    """Seconds from a run's first event to its first validation with val_acc >= target."""
    result: dict[str, Any] = {}
    for name, target in TARGETS.items():
        runs = sorted((logs / name).glob("version_*"), key=lambda p: p.stat().st_mtime)
        if not runs:
            result[name] = f"no run in {logs / name}: python train.py fit --config configs/{name}.yaml"
            continue
        events, starts = [], []
        for event_file in runs[-1].glob("events.out.tfevents.*"):
            accumulator = EventAccumulator(str(event_file))
            accumulator.Reload()
            starts.append(accumulator.FirstEventTimestamp())
            if "val_acc" in accumulator.Tags()["scalars"]:
                events += accumulator.Scalars("val_acc")
        start = min(starts, default=0.0)
        reached = [e for e in sorted(events, key=lambda e: e.wall_time) if e.value >= target]
        result[name] = {
            "target_val_acc": target,
            "best_val_acc": round(max((e.value for e in events), default=0.0), 4),
            "seconds_to_target": round(reached[0].wall_time - start, 1) if reached else None,
            "run": str(runs[-1]),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/latest.json"))
    parser.add_argument("--batches", type=int, default=150, help="Training batches per timed epoch.")
    parser.add_argument("--epochs", type=int, default=3, help="Timed epochs per run (the first is warm-up).")
    parser.add_argument("--steps", type=int, default=20, help="Timed steps per model-throughput measurement.")
    parser.add_argument("--skip-compile", action="store_true", help="Skip torch.compile (slow to compile on CPU).")
    args = parser.parse_args()
    torch.manual_seed(0)
    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    results: dict[str, Any] = {
        "machine": {
            "device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else platform.processor() or "cpu",
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"),
        }
    }
    peak = matmul_peak_gflops()
    results["matmul_peak_gflops"] = round(peak, 1)
    results["overhead"] = bench_overhead(args.epochs, args.batches, workdir)
    print(json.dumps(results["overhead"], indent=2), flush=True)
    results["data"] = bench_data(workdir, repeats=2, batches=args.batches)
    print(json.dumps(results["data"], indent=2), flush=True)
    models = {"simple_cnn": (SimpleCNN, 128), "resnet18": (lambda: ResNetClassifier(input_shape=(1, 28, 28)), 128)}
    results["model"] = {}
    for name, (build, batch) in models.items():
        results["model"][name] = bench_model(build, batch, args.steps, peak, compile=not args.skip_compile)
        print(name, json.dumps(results["model"][name]), flush=True)
    results["time_to_accuracy"] = time_to_accuracy(ROOT / "logs")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(f"written to {args.out}")
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
