"""`make bench-main`: the main job (`make train`) against the previous default, for 3 seeds, alternating.

Each run is `python train.py fit --config <job> --seed_everything <seed>` in a fresh process and a fresh
folder, timed from start to exit (start-up, training, validation and the test pass included), as a user
runs it. The jobs alternate within each seed, so a machine that slows down during the benchmark slows both.
Results: a table on stdout and benchmarks/results/main_job.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = {
    "main (configs/simple_cnn.yaml)": "simple_cnn.yaml",
    "classic (simple_cnn_classic.yaml)": "simple_cnn_classic.yaml",
}


def run(config: str, seed: int, workdir: Path) -> tuple[float, float]:
    """(wall seconds, test accuracy) of one `train.py fit` of `config` with `seed`."""
    args = [sys.executable, str(ROOT / "train.py"), "fit", "--config", str(ROOT / "configs" / config)]
    args += ["--seed_everything", str(seed), "--trainer.enable_progress_bar=false"]
    start = time.perf_counter()
    done = subprocess.run(args, cwd=workdir, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{config} seed {seed} failed:\n{done.stderr[-3000:]}")
    accuracy = re.search(r"test accuracy: ([0-9.]+)", done.stdout)
    return seconds, float(accuracy.group(1)) if accuracy else float("nan")


def mean_std(values: list[float], decimals: int) -> str:
    spread = f" ± {statistics.stdev(values):.{decimals}f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.{decimals}f}{spread}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 7, 123])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "main_job.json")
    options = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in JOBS}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in options.seeds:
            for name, config in JOBS.items():  # alternating: each seed runs both jobs back to back
                seconds, accuracy = run(config, seed, Path(tmp))
                results[name].append({"seed": seed, "seconds": seconds, "test_acc": accuracy})
                print(f"{name:42} seed {seed:4}: {seconds:6.1f} s, test accuracy {accuracy:.4f}", flush=True)
    print(f"\n{'job':42} {'wall time (s)':>16} {'test accuracy (%)':>20}")
    for name, runs in results.items():
        seconds = [r["seconds"] for r in runs]
        accuracy = [100 * r["test_acc"] for r in runs]
        print(f"{name:42} {mean_std(seconds, 1):>16} {mean_std(accuracy, 2):>20}")
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
