"""Serving speed: `make bench-serve` or `python -m benchmarks.serving`.

For SimpleCNN (Fashion-MNIST) and the text transformer (data/fortunes, `make text-data`), each
served by serve.py with the torch backend and with the exported ONNX file: requests per second
and p50/p99 latency of `POST /predict` with one input per request, at 1, 8 and 32 concurrent
clients (threads of this process, one HTTP session each), after a warm-up. Next to it, in the
same run, `train.py predict`'s throughput on the test split (batches of 128, no HTTP): the
ceiling that batching requests can approach.

The checkpoints are trained briefly here (speed does not depend on accuracy). On a machine with
few cores the clients share the CPU with the server: read the figures as this machine's, not
the server's alone. Results: printed Markdown table + JSON (--out).
"""

from __future__ import annotations

import base64
import io
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests
import torch
from jsonargparse import ArgumentParser
from PIL import Image

from lightning_template.engine.checkpoint import RunCheckpoint
from lightning_template.engine.cli import ROOT, ProjectCLI
from lightning_template.script_args import script_parser
from lightning_template.serving.launch import background_server
from lightning_template.tasks.classification.data.idx import read_idx

JOBS = {
    "simple_cnn": ["--config", str(ROOT / "configs/simple_cnn.yaml")],
    "transformer_text": ["--config", str(ROOT / "configs/transformer_text.yaml")],
}
SHORT = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=20", "--trainer.limit_val_batches=2"]
SHORT += ["--trainer.enable_progress_bar=false", "--test_after_fit=false"]


def train_and_export(job: str, workdir: Path) -> tuple[Path, Path]:
    """A briefly trained checkpoint of `job` and its ONNX export."""
    run = workdir / job
    ProjectCLI(args=["fit", *JOBS[job], *SHORT, f"--trainer.default_root_dir={run}",
                      f"--trainer.logger.init_args.save_dir={run}"])  # fmt: skip
    checkpoint = next(run.glob("*/version_0/checkpoints/last.ckpt"))
    export = [sys.executable, str(ROOT / "export.py"), *JOBS[job], f"--ckpt_path={checkpoint}", f"--out={run}/export"]
    subprocess.run(export, check=True, capture_output=True, cwd=ROOT)
    return checkpoint, run / "export/net.onnx"


def predict_throughput(job: str, checkpoint: Path, workdir: Path) -> float:
    """Inputs per second of `train.py predict` over the test split (warm: the second of two passes)."""
    data = []  # the text datamodule predicts a file, with the checkpoint's vocabulary
    if job != "simple_cnn":
        data = [f"--data.predict_file={ROOT / 'data/fortunes/test.jsonl'}"]
    cli = ProjectCLI(
        args=[*JOBS[job], "--trainer.enable_progress_bar=false", "--trainer.logger=false",
              f"--predictions.output_file={workdir}/p.csv", *data, "--data.batch_size=128"],
        run=False,
    )  # fmt: skip
    state = RunCheckpoint.read(checkpoint).datamodule_state(type(cli.datamodule).__qualname__)
    if state is not None:
        cli.datamodule.load_state_dict(state)
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        outputs = cli.trainer.predict(cli.model, datamodule=cli.datamodule, ckpt_path=str(checkpoint))
        seconds.append(time.perf_counter() - start)
    return sum(len(batch) for batch in outputs) / seconds[-1]


def payloads(job: str, count: int) -> list[dict[str, Any]]:
    if job == "simple_cnn":
        images = read_idx(Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"))[:count]
        encoded = []
        for image in images:
            buffer = io.BytesIO()
            Image.fromarray(image.numpy()).save(buffer, format="PNG")
            encoded.append({"image": base64.b64encode(buffer.getvalue()).decode()})
        return encoded
    lines = (ROOT / "data/fortunes/test.jsonl").read_text().splitlines()[:count]
    return [{"text": json.loads(line)["text"]} for line in lines]


def load_test(url: str, bodies: list[dict[str, Any]], clients: int, seconds: float) -> dict[str, float]:
    """`clients` threads posting one input per request back to back for `seconds`; rps and latency."""
    latencies: list[float] = []
    batch_sizes: list[int] = []
    lock, stop = threading.Lock(), time.perf_counter() + seconds

    def client(offset: int) -> None:
        session, i = requests.Session(), offset
        while time.perf_counter() < stop:
            start = time.perf_counter()
            response = session.post(f"{url}/predict", json=bodies[i % len(bodies)], timeout=60)
            elapsed = time.perf_counter() - start
            response.raise_for_status()
            with lock:
                latencies.append(elapsed)
                batch_sizes.append(response.json()["batch_size"])
            i += clients

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    latencies.sort()
    return {
        "rps": len(latencies) / wall,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "mean_batch": statistics.fmean(batch_sizes),
        "requests": len(latencies),
    }


def parser() -> ArgumentParser:
    parser = script_parser(__doc__)
    parser.add_argument("--out", type=str, default="benchmarks/results/serving.json", help="JSON results.")
    parser.add_argument(
        "--clients", type=int, nargs="+", default=[1, 8, 32], help="Concurrent clients of each load level."
    )
    parser.add_argument("--seconds", type=float, default=8.0, help="Duration of each load level.")
    return parser


def main() -> None:
    args = parser().parse_args()
    out = Path(args.out)
    results: dict[str, Any] = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads", "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for job in JOBS:
            checkpoint, onnx = train_and_export(job, workdir)
            predict = predict_throughput(job, checkpoint, workdir)
            results["rows"].append({"model": job, "backend": "train.py predict", "clients": "-", "rps": predict})
            bodies = payloads(job, 256)
            for backend, flag, path in (("torch", "--ckpt_path", checkpoint), ("onnx", "--onnx_path", onnx)):
                with background_server(flag, str(path), cwd=workdir) as url:
                    load_test(url, bodies, 4, 2.0)  # warm-up
                    for clients in args.clients:
                        row = {"model": job, "backend": backend, "clients": clients}
                        row |= load_test(url, bodies, clients, args.seconds)
                        results["rows"].append(row)
                        print(row, flush=True)
    table = ["| model | backend | clients | inputs/s | p50 ms | p99 ms | mean batch |", "|---|---|---|---|---|---|---|"]
    for row in results["rows"]:
        if row["clients"] == "-":
            table.append(f"| {row['model']} | {row['backend']} (batches of 128) | - | {row['rps']:.0f} | | | 128 |")
        else:
            table.append(
                f"| {row['model']} | {row['backend']} | {row['clients']} | {row['rps']:.0f} | {row['p50_ms']:.1f}"
                f" | {row['p99_ms']:.1f} | {row['mean_batch']:.1f} |"
            )
    print("\n".join(table))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
