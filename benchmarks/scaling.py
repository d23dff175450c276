"""How cost grows: `make bench-scale` or `python -m benchmarks.scaling`.

1. memory:   peak resident memory and time of one training epoch (data only: every batch loaded and
             normalized as the model would get it, no model step) of the in-memory, image-file and
             streaming datamodules, as the training set grows 1x, 4x, 16x (Fashion-MNIST's first
             `--base` training images, replicated; the files are hard links of one set of PNGs).
             Each cell runs in a fresh process, with `num_workers=0`, so its peak is its own.
2. pipeline: images/s delivered to the model for a folder of JPEG files at 224 px (Fashion-MNIST
             images enlarged to 256x256 RGB): torchvision's ImageFolder + transforms (the reference),
             the project's ImageFolder datamodule, and the streaming datamodule from encoded and from
             pre-resized chunks; same workers, same batch size, after one warm-up pass, steady rate
             (from the second batch). "To the model" includes the project's on-device crop, flip and
             normalization (here on the CPU, in the main process); "loader alone" stops at the batch.
3. ddp:      `train.py fit` epoch time of SimpleCNN on 1 process (2 threads) vs 2 DDP processes
             (gloo, 1 thread each) at the same global batch.

Writes benchmarks/results/scaling.json and prints Markdown tables. Runs unchanged on a GPU
machine (the pipeline then ends on the GPU, and DDP uses NCCL over the visible GPUs).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torchvision
from jsonargparse import ArgumentParser
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import transforms

from lightning_template.script_args import script_parser
from lightning_template.streaming import StreamingImageDataModule
from lightning_template.tasks.classification import FashionMNISTDataModule, ImageFolderDataModule
from lightning_template.tasks.classification.data.idx import load_split

from convert import convert

ROOT = Path(__file__).resolve().parents[1]
FASHION = Path("/usr/share/datasets/fashion-mnist")
SCALES = (1, 4, 16)
KINDS = ("in-memory", "files", "streaming")


def fashion(base: int) -> tuple[torch.Tensor, torch.Tensor]:
    folder = FASHION if FASHION.is_dir() else FashionMNISTDataModule().resolve_files()
    images, labels = load_split(folder, "train")
    return images[:base], labels[:base]


class ReplicatedFashion(FashionMNISTDataModule):
    """Fashion-MNIST's first `base` training images, `scale` times (validation: the next 100)."""

    def __init__(self, base: int, scale: int, **kwargs: Any) -> None:
        super().__init__(val_size=100, **kwargs)
        self.base, self.scale = base, scale

    def load_splits(self) -> Any:
        images, labels = fashion(self.base + 100)
        train = torch.cat([images[: self.base]] * self.scale + [images[self.base :]])
        train_labels = torch.cat([labels[: self.base]] * self.scale + [labels[self.base :]])
        return (train, train_labels), (images[:100], labels[:100])


def write_files(work: Path, base: int) -> None:
    """PNG class folders, replicated by hard links (train-<scale>x/), and LitData chunks (stream-<scale>x/)."""
    images, labels = fashion(base)
    originals = work / "png"
    for index, (image, label) in enumerate(zip(images, labels.tolist(), strict=True)):
        (originals / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[0].numpy()).save(originals / str(label) / f"{index}.png")
    for scale in SCALES:
        root = work / f"files-{scale}x"
        for split, copies in (("train", scale), ("val", 1)):
            for path in originals.rglob("*.png"):
                for copy in range(copies):
                    target = root / split / path.parent.name / f"{copy}-{path.name}"
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.link(path, target)
        convert(ReplicatedFashion(base, scale), str(work / f"stream-{scale}x"), chunk_bytes="64MB")


def datamodule(kind: str, work: Path, base: int, scale: int) -> Any:
    if kind == "in-memory":
        return ReplicatedFashion(base, scale, batch_size=256)
    if kind == "files":
        return ImageFolderDataModule(
            root=str(work / f"files-{scale}x"), image_size=28, batch_size=256, num_workers=0,
            mean=(0.286,) * 3, std=(0.353,) * 3,
        )  # fmt: skip
    return StreamingImageDataModule(input_dir=str(work / f"stream-{scale}x"), batch_size=256, num_workers=0)


def data_epoch(dm: Any) -> tuple[int, float]:
    """(images, seconds) of one pass over the training loader, each batch normalized as the model gets it."""
    dm.prepare_data()
    dm.setup("fit")
    normalize = getattr(dm, "on_after_batch_transfer", lambda batch, index: batch)
    count, start = 0, time.perf_counter()
    for batch in dm.train_dataloader():
        images, _ = normalize(batch, 0)
        count += len(images)
    return count, time.perf_counter() - start


def memory_cell(kind: str, work: Path, base: int, scale: int) -> dict[str, Any]:
    """One cell, in this (fresh) process."""
    torch.set_num_threads(1)
    before = resident_mb("VmRSS")
    count, seconds = data_epoch(datamodule(kind, work, base, scale))
    peak = resident_mb("VmHWM")
    # At the epoch's end: anonymous memory (the process's own) and file pages mapped into it (chunks
    # read through mmap: page cache the kernel can drop, counted in RSS while mapped).
    return {
        "kind": kind, "scale": scale, "images": count, "epoch_s": seconds, "peak_rss_mb": peak,
        "growth_mb": peak - before, "anon_mb": resident_mb("RssAnon"), "file_mb": resident_mb("RssFile"),
    }  # fmt: skip


def resident_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process, from /proc (ru_maxrss would include the parent's before exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_table(work: Path, base: int) -> list[dict[str, Any]]:
    write_files(work, base)
    rows = []
    for kind in KINDS:
        for scale in SCALES:
            command = [sys.executable, "-m", "benchmarks.scaling", "--cell", kind, str(work), str(base), str(scale)]
            out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    return rows


def jpeg_folder(work: Path, count: int) -> Path:
    """Fashion-MNIST images enlarged to 256x256 RGB JPEG (quality 90), class folders train/ and val/."""
    images, labels = fashion(count)
    root = work / "jpeg"
    for index, (image, label) in enumerate(zip(images, labels.tolist(), strict=True)):
        for split in ("train", "val") if index < 10 else ("train",):
            folder = root / split / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            picture = Image.fromarray(image[0].numpy()).convert("RGB").resize((256, 256), Image.Resampling.BICUBIC)
            picture.save(folder / f"{index}.jpg", quality=90)
    return root


def throughput(batches: Any, finish: Any) -> float:
    """images/s of one pass, after a warm-up pass and from its second batch on: the steady rate, without
    starting workers (the streaming loader starts them each epoch, the others keep them)."""
    for _ in batches():
        pass
    count, start = 0, 0.0
    for index, batch in enumerate(batches()):
        if index == 1:
            start = time.perf_counter()
        count += len(finish(batch)[0]) if index else 0
    seconds = time.perf_counter() - start
    return count / seconds


def pipeline_table(work: Path, count: int, workers: int, batch_size: int, repeats: int) -> list[dict[str, Any]]:
    root = jpeg_folder(work, count)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    reference = torchvision.datasets.ImageFolder(
        str(root / "train"),
        transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                            transforms.ToTensor(), transforms.Normalize(mean, std)]),
    )  # fmt: skip
    reference_loader = DataLoader(reference, batch_size=batch_size, shuffle=True, num_workers=workers,
                                  persistent_workers=True)  # fmt: skip
    files = ImageFolderDataModule(root=str(root), batch_size=batch_size, num_workers=workers)
    files.setup("fit")
    rows = [
        ("torchvision ImageFolder + transforms (reference)", lambda: reference_loader, lambda b: b),
        ("ImageFolderDataModule", files.train_dataloader, lambda b: files.on_after_batch_transfer(b, 0)),
    ]
    for images in ("encoded", "raw"):
        output = work / f"jpeg-{images}"
        convert(ImageFolderDataModule(root=str(root), num_workers=0), str(output), images=images, chunk_bytes="64MB")
        streamed = StreamingImageDataModule(input_dir=str(output), batch_size=batch_size, num_workers=workers)
        streamed.setup("fit")
        streamed.trainer = None  # not training: evaluation crop; the random crop costs the same
        name = f"streaming, {'JPEG bytes' if images == 'encoded' else 'pre-resized uint8 (256 px)'} chunks"
        rows.append((name, streamed.train_dataloader, lambda b, dm=streamed: dm.on_after_batch_transfer(b, 0)))
    rates: dict[str, dict[str, list[float]]] = {name: {"model": [], "loader": []} for name, _, _ in rows}
    for _ in range(repeats):  # interleaved: a slow spell of the machine hits every pipeline alike
        for name, batches, finish in rows:
            rates[name]["model"].append(throughput(batches, finish))
            rates[name]["loader"].append(throughput(batches, lambda batch: batch))
    results = []
    for name, _, _ in rows:
        model, loader = sorted(rates[name]["model"]), sorted(rates[name]["loader"])
        results.append({
            "pipeline": name, "images_per_s": statistics.median(model), "range": [model[0], model[-1]],
            "loader_only_images_per_s": statistics.median(loader), "loader_range": [loader[0], loader[-1]],
        })  # fmt: skip
        print(results[-1], flush=True)
    for row in results:
        row["vs_reference"] = row["images_per_s"] / results[0]["images_per_s"]
    return results


def epoch_seconds(output: str) -> list[float]:
    return [float(s) for s in re.findall(r"^epoch \d+/\d+ .*\(([0-9.]+) s\)", output, flags=re.M)]


def ddp_table(work: Path, batches: int) -> list[dict[str, Any]]:
    common = [
        sys.executable, str(ROOT / "train.py"), "fit", "--config", str(ROOT / "configs/simple_cnn.yaml"),
        "--trainer.max_epochs=3", f"--trainer.limit_train_batches={batches}", "--trainer.limit_val_batches=0",
        "--trainer.logger=false", "--test_after_fit=false",
    ]  # fmt: skip
    runs = {
        "1 process, 2 threads, batch 128": ([*common, "--data.batch_size=128"], {}),
        "2 DDP processes (gloo), 1 thread each, batch 64 each": (
            [*common, "--data.batch_size=64", "--trainer.strategy=ddp", "--trainer.devices=2",
             "--trainer.accelerator=cpu"], {"OMP_NUM_THREADS": "1"},
        ),
    }  # fmt: skip
    results = []
    for name, (command, env) in runs.items():
        done = subprocess.run(command, cwd=work, capture_output=True, text=True, env={**os.environ, **env})
        assert done.returncode == 0, done.stderr[-3000:]
        seconds = epoch_seconds(done.stdout)[1:]  # the first epoch warms up
        images = batches * 128
        results.append({"setup": name, "epoch_s": min(seconds), "images_per_s": images / min(seconds)})
        print(results[-1], flush=True)
    return results


def markdown(results: dict[str, Any]) -> str:
    """The tables of the parts measured (this run's or an earlier one's, from the JSON file)."""
    lines: list[str] = []
    if "memory" in results:
        lines += [
            "| datamodule | train images | epoch s | peak RSS MB | growth over imports MB"
            " | anon / file-mapped MB at end |",
            "|---|---|---|---|---|---|",
        ]
        for r in results["memory"]:
            memory = f"{r['peak_rss_mb']:.0f} | +{r['growth_mb']:.0f} | {r['anon_mb']:.0f} / {r['file_mb']:.0f}"
            lines.append(f"| {r['kind']} {r['scale']}x | {r['images']:,} | {r['epoch_s']:.2f} | {memory} |")
        lines.append("")
    if "pipeline" in results:
        lines += [
            "| pipeline (224 px JPEG) | images/s to the model, median (range) | vs reference | loader alone |",
            "|---|---|---|---|",
        ]
        for r in results["pipeline"]:
            model = f"{r['images_per_s']:,.0f} ({r['range'][0]:,.0f}-{r['range'][1]:,.0f})"
            loader = f"{r['loader_only_images_per_s']:,.0f} ({r['loader_range'][0]:,.0f}-{r['loader_range'][1]:,.0f})"
            lines.append(f"| {r['pipeline']} | {model} | {r['vs_reference']:.2f}x | {loader} |")
        lines.append("")
    if "ddp" in results:
        lines += ["| DDP on this machine | epoch s | images/s |", "|---|---|---|"]
        lines += [f"| {r['setup']} | {r['epoch_s']:.2f} | {r['images_per_s']:,.0f} |" for r in results["ddp"]]
    return "\n".join(lines)


def parser() -> ArgumentParser:
    parser = script_parser(__doc__.partition("\n\n")[0])
    parser.add_argument("--base", type=int, default=20000, help="Training images at 1x.")
    parser.add_argument("--jpegs", type=int, default=2048, help="JPEG files of the pipeline benchmark.")
    parser.add_argument("--workers", type=int, default=2, help="Loader workers of the pipeline benchmark.")
    parser.add_argument("--batch_size", type=int, default=64, help="Batch size of the pipeline benchmark.")
    parser.add_argument("--ddp_batches", type=int, default=60, help="Batches of 128 per DDP epoch.")
    parser.add_argument("--repeats", type=int, default=5, help="Interleaved passes per pipeline (median).")
    parser.add_argument("--parts", nargs="+", default=["memory", "pipeline", "ddp"], help="Which tables to measure.")
    parser.add_argument("--out", type=str, default=str(ROOT / "benchmarks/results/scaling.json"), help="JSON results.")
    return parser


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--cell":
        kind, work, base, scale = sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(memory_cell(kind, work, base, scale)))
        return
    args = parser().parse_args()
    out = Path(args.out)
    results: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    results["machine"] = {"cpus": os.cpu_count(), "torch": torch.__version__, "cuda": torch.cuda.is_available()}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "memory" in args.parts:
            results["memory"] = memory_table(work, args.base)
        if "pipeline" in args.parts:
            results["pipeline"] = pipeline_table(work, args.jpegs, args.workers, args.batch_size, args.repeats)
        if "ddp" in args.parts:
            results["ddp"] = ddp_table(work, args.ddp_batches)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(markdown(results))


if __name__ == "__main__":
    main()
