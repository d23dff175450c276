"""Speed of the project, every figure a median over interleaved repeats: `make bench` (`make bench-quick`).

1. framework overhead per step: `train.py fit` vs a bare PyTorch loop, with a network and batch so
   small that a step is nearly pure framework work (microseconds per step), in interleaved pairs;
   then as a fraction of each shipped model's real step time;
2. end to end: `train.py fit --config configs/simple_cnn.yaml` vs the bare loop, ratio per pair;
3. throughput and fraction of the matmul peak of the shipped models, peak and model in alternating windows;
4. data loading: the project's in-memory datamodule vs torchvision's per-image pipeline, pass by pass;
5. time to target accuracy of each shipped job, read from the TensorBoard logs of its latest run.

Medians come with their interquartile range (how single repeats scatter) and the 95 % confidence
interval of the median (how well the figure is known). Run nothing else meanwhile: on a shared CPU two
busy processes slow each other down several times. The Makefile pins glibc's malloc thresholds.
`--quick` prints the same table from fewer repeats (wider intervals), to check a change.
"""

from __future__ import annotations

import gzip
import json
import platform
import shutil
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torchvision
from jsonargparse import ArgumentParser
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

from lightning_template.script_args import script_parser
from lightning_template.tasks.classification import FashionMNISTDataModule

from benchmarks.overhead import end_to_end, lightning_floor, per_step_overhead, sync
from benchmarks.stats import Summary, describe, summarize
from benchmarks.throughput import StepSpec, interleaved_windows, job_model, time_in_flop_ops, training_step

ROOT = Path(__file__).resolve().parents[1]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
JOBS = {
    "SimpleCNN": "configs/simple_cnn.yaml",
    "ResNet-18": "configs/resnet_fmnist_pretrain.yaml",
    "ViT": "configs/vit_fashion_mnist.yaml",
}
TARGETS = {"simple_cnn": 0.91, "vit_fashion_mnist": 0.88, "resnet_fmnist_pretrain": 0.93}
SIZES = {  # full, quick
    "overhead_pairs": (30, 12),
    "end_to_end_pairs": (80, 10),
    "throughput_windows": (9, 3),
    "loading_passes": (9, 3),
}


def bench_overhead(pairs: int, workdir: Path) -> dict[str, Any]:
    """Per-step and per-epoch cost of `train.py fit` over the bare loop, tiny network, 300 steps per epoch."""
    steps = 300
    measured = per_step_overhead(DEVICE, steps, pairs, workdir)
    floor = lightning_floor(DEVICE, steps, pairs)
    return {
        "steps_per_epoch": steps,
        "overhead_us_per_step": summarize(measured["us_per_step"]).as_dict(1),
        "overhead_in_bare_steps": summarize(measured["in_bare_steps"]).as_dict(4),
        "lightning_alone_in_bare_steps": summarize(floor).as_dict(4),
        "bare_step_us": summarize(measured["bare_step_us"]).as_dict(1),
        "fit_step_us": summarize(measured["fit_step_us"]).as_dict(1),
        "epoch_end_ms": summarize(measured["epoch_end_ms"]).as_dict(2),
        "per_pair_us": [round(value, 1) for value in measured["us_per_step"]],
        "per_pair_bare_step_us": [round(value, 1) for value in measured["bare_step_us"]],
    }


def bench_end_to_end(pairs: int, workdir: Path) -> dict[str, Any]:
    """`train.py fit` of the main job vs the bare loop: epoch-time ratio per pair (epoch end included)."""
    steps = 20
    measured = end_to_end(DEVICE, steps, pairs, workdir)
    summary = summarize(measured["ratio"])
    return {
        "steps_per_epoch": steps,
        "ratio_fit_over_bare": summary.as_dict(4),
        "ci_half_width": round(summary.relative_ci(), 4),
        "fit_epoch_s": summarize(measured["fit_s"]).as_dict(3),
        "bare_epoch_s": summarize(measured["bare_s"]).as_dict(3),
        "goal": "ratio <= 1.03",
        "per_pair": [round(value, 4) for value in measured["ratio"]],
    }


def bench_throughput(windows: int, seconds: float, compile: bool) -> dict[str, Any]:
    """Training throughput per shipped model (synthetic batches of the job's shape), eager (and compiled)."""
    steps = {}
    for name, config in JOBS.items():
        model, batch, shape = job_model(config)
        eager = StepSpec(channels_last=model.hparams.get("channels_last", False))  # the memory format of the job
        variants = [("eager", eager)] + ([("compiled", replace(eager, compile=True))] if compile else [])
        for variant, spec in variants:
            step, flops = training_step(model, batch, shape, DEVICE, spec)
            steps[f"{name} {variant}"] = (step, flops, batch)
    peak_size = 4096 if DEVICE.type == "cuda" else 2048
    raw = interleaved_windows(steps, DEVICE, windows, seconds, peak_size)
    results = {
        name: {key: summarize(values).as_dict(4) for key, values in series.items()}
        | {"batch": steps[name][2], "train_gflop_per_step": round(steps[name][1] / 1e9, 3)}
        for name, series in raw.items()
    }
    if DEVICE.type == "cpu":  # the CPU profiler's times are the kernels' own; on a GPU they would be launch times
        for name, (step, _, _) in steps.items():
            if name.endswith("eager"):
                results[name]["time_in_conv_and_matmul"] = round(time_in_flop_ops(step), 4)
    return results


def torchvision_root(source: Path, workdir: Path) -> Path:
    """torchvision's FashionMNIST reads root/FashionMNIST/raw/<uncompressed IDX files>."""
    raw = workdir / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for gz in source.glob("*-ubyte.gz"):
        with gzip.open(gz) as f_in, open(raw / gz.name.removesuffix(".gz"), "wb") as f_out:
            shutil.copyfileobj(f_in, f_out)
    return workdir


def loading_pass(loader: Any, batches: int, transform: Any = None) -> float:
    """Images per second over the first `batches` batches, moved to the device (and normalized by `transform`)."""
    count, start = 0, time.perf_counter()
    for index, (images, _labels) in enumerate(loader):
        if index == batches:
            break
        images = images.to(DEVICE, non_blocking=True)
        if transform is not None:
            images = transform(images)
        count += len(images)
    sync(DEVICE)
    return count / (time.perf_counter() - start)


def bench_loading(passes: int, workdir: Path) -> dict[str, Any]:
    """100 batches of 128 per pass, the three pipelines in turn each round; speed-up per round."""
    batches = 100
    datamodule = FashionMNISTDataModule(batch_size=128)
    datamodule.setup("fit")
    ours_loader = datamodule.train_dataloader()
    transform = torchvision.transforms.Compose(
        [torchvision.transforms.ToTensor(), torchvision.transforms.Normalize(datamodule.mean, datamodule.std)]
    )
    root = torchvision_root(Path(datamodule.resolve_files()), workdir)
    classic = torchvision.datasets.FashionMNIST(str(root), train=True, transform=transform)
    pipelines = {
        "template": (ours_loader, datamodule.normalize),
        "torchvision_0_workers": (DataLoader(classic, batch_size=128, shuffle=True), None),
        "torchvision_2_workers": (
            DataLoader(classic, batch_size=128, shuffle=True, num_workers=2, persistent_workers=True),
            None,
        ),
    }
    rates: dict[str, list[float]] = {name: [] for name in pipelines}
    for round_ in range(passes + 1):  # round 0 warms up (worker start, page cache)
        for name, (loader, normalize) in pipelines.items():
            rate = loading_pass(loader, batches, normalize)
            if round_:
                rates[name].append(rate)
    references = zip(rates["torchvision_0_workers"], rates["torchvision_2_workers"], strict=True)
    best_reference = [max(pair) for pair in references]
    return {name: summarize(values).as_dict(0) for name, values in rates.items()} | {
        "speedup_over_best_torchvision": summarize(
            [ours / ref for ours, ref in zip(rates["template"], best_reference, strict=True)]
        ).as_dict(2),
        "goal": ">= 5x",
    }


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


def markdown(results: dict[str, Any]) -> str:
    """The table docs/benchmarks.md shows."""
    machine = results["machine"]
    run = "quick" if results["quick"] else "full"
    head = (
        f"{machine['device']}, {machine['threads']} threads, torch {machine['torch']}, {machine['date']}; "
        f"{run} run, {results['wall_s']:.0f} s. Median (IQR; 95 % CI of the median, n)."
    )
    rows = ["| figure | value |", "|---|---|"]
    overhead = results["overhead"]
    us = Summary(**overhead["overhead_us_per_step"])
    rows.append(f"| `train.py fit` overhead per step (tiny network, batch 8) | {describe(us, 'µs')} |")
    relative = describe(Summary(**overhead["overhead_in_bare_steps"]), digits=3)
    rows.append(f"| the same, in bare-loop steps of the same pair (machine speed cancels) | {relative} |")
    alone = describe(Summary(**overhead["lightning_alone_in_bare_steps"]), digits=3)
    rows.append(f"| Lightning alone (no callbacks, logger, metrics), in bare-loop steps: the floor | {alone} |")
    rows.append(
        f"| bare loop step / fit step, tiny network | {describe(Summary(**overhead['bare_step_us']), 'µs')} / "
        f"{describe(Summary(**overhead['fit_step_us']), 'µs')} |"
    )
    epoch_end = describe(Summary(**overhead["epoch_end_ms"]), "ms", digits=1)
    rows.append(f"| `train.py fit` cost per epoch end (checkpoint, logs) | {epoch_end} |")
    e2e = results["end_to_end"]
    rows.append(
        f"| end to end, SimpleCNN job: fit epoch / bare epoch ({e2e['steps_per_epoch']} steps) | "
        f"{describe(Summary(**e2e['ratio_fit_over_bare']), digits=3)}; CI ±{e2e['ci_half_width'] * 100:.1f} % |"
    )
    for name, entry in results["throughput"].items():
        step_us = Summary(**entry["step_s"]).median * 1e6
        share = us.median / step_us * 100
        rows.append(f"| {name}: images/s (batch {entry['batch']}) | {describe(Summary(**entry['images_per_s']))} |")
        rows.append(
            f"| {name}: fraction of matmul peak (peak {Summary(**entry['peak_gflops_per_s']).median:.0f} GFLOP/s) | "
            f"{describe(Summary(**entry['fraction_of_peak']), '%', scale=100, digits=1)} |"
        )
        if name.endswith("eager"):
            rows.append(
                f"| {name}: per-step overhead as a share of its step | {share:.2f} % of {step_us / 1e3:.1f} ms |"
            )
        if "time_in_conv_and_matmul" in entry:  # why the fraction of peak is what it is
            in_flop_ops = entry["time_in_conv_and_matmul"]
            own = Summary(**entry["fraction_of_peak"]).median / in_flop_ops
            rows.append(
                f"| {name}: share of the step in convolutions and matmuls (the only counted FLOPs); their own "
                f"fraction of peak | {in_flop_ops * 100:.0f} %; {own * 100:.0f} % |"
            )
    loading = results["loading"]
    rows.append(
        f"| loading, images/s: template / torchvision 0 / 2 workers | "
        f"{Summary(**loading['template']).median:,.0f} / {Summary(**loading['torchvision_0_workers']).median:,.0f} / "
        f"{Summary(**loading['torchvision_2_workers']).median:,.0f} |"
    )
    speedup = describe(Summary(**loading["speedup_over_best_torchvision"]), "x", digits=1)
    rows.append(f"| loading speed-up over the best torchvision | {speedup} |")
    return head + "\n\n" + "\n".join(rows) + "\n"


def parser() -> ArgumentParser:
    parser = script_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="Fewer repeats (under 3 minutes on 2 CPU cores).")
    parser.add_argument("--compile", action="store_true", help="Also time the models with torch.compile.")
    parser.add_argument(
        "--out", type=str | None, default=None, help="JSON results; null: benchmarks/results/bench[-quick].json."
    )
    return parser


def main() -> None:
    args = parser().parse_args()
    sizes = {key: value[1] if args.quick else value[0] for key, value in SIZES.items()}
    out = (
        Path(args.out)
        if args.out
        else ROOT / "benchmarks" / "results" / ("bench-quick.json" if args.quick else "bench.json")
    )
    start = time.perf_counter()
    # The CLI runs in this process with its own arguments; it warns that sys.argv holds others (this script's).
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
    torch.manual_seed(0)
    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    results: dict[str, Any] = {
        "machine": {
            "device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else platform.processor() or "cpu",
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M"),
        },
        "quick": args.quick,
        "sizes": sizes,
    }
    try:
        results["overhead"] = bench_overhead(sizes["overhead_pairs"], workdir)
        results["end_to_end"] = bench_end_to_end(sizes["end_to_end_pairs"], workdir)
        results["throughput"] = bench_throughput(sizes["throughput_windows"], 1.0, args.compile)
        results["loading"] = bench_loading(sizes["loading_passes"], workdir)
        results["time_to_accuracy"] = time_to_accuracy(ROOT / "logs")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["wall_s"] = round(time.perf_counter() - start, 1)
    table = markdown(results)
    results["table"] = table
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(table)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
