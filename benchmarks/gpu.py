"""The GPU benchmark, unattended: `bash benchmarks/gpu.sh` (or `python -m benchmarks.gpu`), sized for ~6 minutes.

On the first CUDA machine available, in one go:
1. training throughput and fraction of the fp32 matmul peak of SimpleCNN (28 px), ResNet-18 at 224 px
   and the ViT, in fp32, `16-mixed`, `bf16-mixed` (where supported), `channels_last` (convnets) and
   `torch.compile`, the variants in alternating windows (`benchmarks.throughput`);
2. the per-step framework overhead of `train.py fit` over a bare loop, and the end-to-end ratio on
   the SimpleCNN job (`benchmarks.overhead`), on one GPU;
3. DDP: `train.py fit --trainer.strategy=ddp` on all visible GPUs vs one, same batch per GPU, images/s.

Writes `<out>/gpu.json` and `<out>/gpu.md`. Without CUDA it says so and exits with status 2, having
measured nothing. `--allow-cpu` runs every part on the CPU with tiny sizes: a check of the script
itself, not a measurement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from jsonargparse import ArgumentParser
from lightning import Callback, LightningModule, Trainer

from lightning_template.script_args import script_parser

from benchmarks.overhead import end_to_end, per_step_overhead, sync
from benchmarks.stats import Summary, describe, summarize
from benchmarks.throughput import StepSpec, interleaved_windows, job_model, training_step

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = 2


class EpochClock(Callback):
    """Writes the wall time of every training epoch (rank 0) to `path` as JSON, for the DDP comparison."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.times: list[float] = []

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sync(pl_module.device)
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sync(pl_module.device)
        self.times.append(time.perf_counter() - self._start)
        if trainer.is_global_zero:
            self.path.write_text(json.dumps(self.times))


def variants(convnet: bool, device: torch.device, compile: bool) -> dict[str, StepSpec]:
    specs = {"fp32": StepSpec(), "16-mixed": StepSpec("16-mixed")}
    if device.type == "cpu" or torch.cuda.is_bf16_supported():
        specs["bf16-mixed"] = StepSpec("bf16-mixed")
    if convnet:
        specs["16-mixed channels_last"] = StepSpec("16-mixed", channels_last=True)
    if compile:
        specs["16-mixed compile"] = StepSpec("16-mixed", compile=True)
    return specs


def bench_throughput(device: torch.device, smoke: bool) -> dict[str, Any]:
    from lightning_template.tasks.classification import ResNetClassifier

    small = ["--data.batch_size=4"] if smoke else []
    resnet_shape = (3, 32, 32) if smoke else (3, 224, 224)
    builders = {
        "SimpleCNN 28 px": lambda: job_model("configs/simple_cnn.yaml", small),
        # 224 px on a GPU; 32 px when checking the script on a CPU (where fp16 autocast crawls).
        f"ResNet-18 {resnet_shape[1]} px": lambda: (
            ResNetClassifier(input_shape=resnet_shape),
            2 if smoke else 64,
            resnet_shape,
        ),
        "ViT 28 px": lambda: job_model("configs/vit_fashion_mnist.yaml", small),
    }
    steps = {}
    for name, build in builders.items():
        for variant, spec in variants(not name.startswith("ViT"), device, compile=not smoke).items():
            model, batch, shape = build()  # a fresh model per variant: compile and channels_last change it
            step, flops = training_step(model, batch, shape, device, spec)
            steps[f"{name}, {variant}"] = (step, flops, batch)
    raw = interleaved_windows(steps, device, windows=1 if smoke else 3, seconds=0.05 if smoke else 0.5,
                              peak_size=256 if smoke else 8192)  # fmt: skip
    return {name: {key: summarize(values).as_dict(4) for key, values in series.items()} for name, series in raw.items()}


def bench_overhead(device: torch.device, workdir: Path, smoke: bool) -> dict[str, Any]:
    steps, pairs = (5, 2) if smoke else (300, 15)
    e2e_steps, e2e_pairs = (3, 2) if smoke else (50, 10)
    return {
        "overhead_us_per_step": summarize(per_step_overhead(device, steps, pairs, workdir / "tiny")["us_per_step"]),
        "end_to_end_ratio": summarize(end_to_end(device, e2e_steps, e2e_pairs, workdir / "e2e")["ratio"]),
    }


def ddp_images_per_s(devices: int, workdir: Path, smoke: bool) -> float:
    """`train.py fit` of the SimpleCNN job on `devices` GPUs (DDP), batch 128 per GPU; best of epochs 2-3."""
    clock = workdir / f"epochs-{devices}.json"
    batches = 4 if smoke else 200
    accelerator = "cpu" if smoke else "gpu"
    command = [
        sys.executable, str(ROOT / "train.py"), "fit", "--config", str(ROOT / "configs/simple_cnn.yaml"),
        f"--trainer.accelerator={accelerator}", f"--trainer.devices={devices}", "--trainer.max_epochs=3",
        f"--trainer.strategy={'ddp' if devices > 1 else 'auto'}", f"--trainer.limit_train_batches={batches}",
        "--trainer.limit_val_batches=0", "--test_after_fit=false", "--data.batch_size=128",
        f"--trainer.logger.init_args.save_dir={workdir / 'logs'}", f"--trainer.default_root_dir={workdir}",
        "--trainer.callbacks+=benchmarks.gpu.EpochClock", f"--trainer.callbacks.path={clock}",
    ]  # fmt: skip
    environment = os.environ | {"PYTHONPATH": str(ROOT)}
    if smoke:
        environment |= {"OMP_NUM_THREADS": "1"}  # two CPU processes on shared cores
    subprocess.run(command, check=True, env=environment, cwd=ROOT, timeout=240, stdout=subprocess.DEVNULL)
    seconds = min(json.loads(clock.read_text())[1:])
    return batches * 128 * devices / seconds


def bench_ddp(device: torch.device, workdir: Path, smoke: bool) -> dict[str, Any]:
    count = 2 if smoke else torch.cuda.device_count()
    if count < 2:
        return {"skipped": f"{count} GPU visible: DDP needs 2 or more"}
    one, all_ = ddp_images_per_s(1, workdir, smoke), ddp_images_per_s(count, workdir, smoke)
    return {"devices": count, "images_per_s_1": round(one), f"images_per_s_{count}": round(all_),
            "speedup": round(all_ / one, 2), "efficiency": round(all_ / one / count, 3)}  # fmt: skip


def markdown(results: dict[str, Any]) -> str:
    lines = [f"{results['device']}, torch {results['torch']}, {results['date']}, {results['wall_s']:.0f} s", ""]
    lines += ["| model, variant | images/s | fraction of fp32 matmul peak |", "|---|---|---|"]
    for name, entry in results["throughput"].items():
        images = describe(Summary(**entry["images_per_s"]))
        fraction = describe(Summary(**entry["fraction_of_peak"]), "%", scale=100, digits=1)
        lines.append(f"| {name} | {images} | {fraction} |")
    overhead = results["overhead"]
    lines += ["", f"`train.py fit` overhead per step: {describe(Summary(**overhead['overhead_us_per_step']), 'µs')}"]
    lines.append(
        f"End to end, SimpleCNN job, fit / bare: {describe(Summary(**overhead['end_to_end_ratio']), digits=3)}"
    )
    lines.append(f"DDP: {json.dumps(results['ddp'])}")
    return "\n".join(lines) + "\n"


def parser() -> ArgumentParser:
    parser = script_parser(__doc__)
    parser.add_argument(
        "--out", type=str, default=str(ROOT / "benchmarks" / "results"), help="Folder for gpu.json/.md."
    )
    parser.add_argument("--allow-cpu", action="store_true", help="Check the script on a CPU with tiny sizes.")
    return parser


def main() -> None:
    args = parser().parse_args()
    out = Path(args.out)
    if not torch.cuda.is_available() and not args.allow_cpu:
        print(
            "benchmarks.gpu: no CUDA device is visible (torch.cuda.is_available() is False), nothing was measured.\n"
            "Run it on a machine with an NVIDIA GPU and a CUDA build of torch; `python -m benchmarks.gpu "
            "--allow-cpu` checks the script on a CPU.",
            file=sys.stderr,
        )
        sys.exit(NO_CUDA)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    smoke = device.type == "cpu"
    start = time.perf_counter()
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (script check, not a measurement)",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        workdir = Path(tmp)
        for part, run in (
            ("throughput", lambda: bench_throughput(device, smoke)),
            ("overhead", lambda: bench_overhead(device, workdir, smoke)),
            ("ddp", lambda: bench_ddp(device, workdir, smoke)),
        ):
            print(f"benchmarks.gpu: {part} ...", flush=True)
            try:
                results[part] = run()
            except Exception as error:  # one failed part must not lose the others' figures
                results[part] = {"error": f"{type(error).__name__}: {error}"}
    for key, value in results.get("overhead", {}).items():
        if isinstance(value, Summary):
            results["overhead"][key] = value.as_dict(4)
    results["wall_s"] = round(time.perf_counter() - start, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results) if not any("error" in results[p] for p in ("throughput", "overhead")) else ""
    (out / "gpu.md").write_text(table or json.dumps(results, indent=2))
    print(table or json.dumps(results, indent=2))
    print(f"written to {out / 'gpu.json'} and {out / 'gpu.md'}")
    failed = [part for part in ("throughput", "overhead", "ddp") if "error" in results[part]]
    if failed:
        sys.exit(f"benchmarks.gpu: failed parts: {', '.join(failed)} (their errors are in gpu.json)")


if __name__ == "__main__":
    main()
