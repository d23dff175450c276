"""`make bench-main`: the main job (`make train`) for 3 seeds, in turn with another job or another version of it.

Each run is `python train.py fit --config <job> --seed_everything <seed>` in a fresh process and a fresh folder,
timed from start to exit (start-up, training, validation and the test pass included), as a user runs it. The jobs
alternate within each seed, so a machine that slows down during the benchmark slows both alike.

    python -m benchmarks.main_job                      # configs/simple_cnn.yaml against simple_cnn_classic.yaml
    python -m benchmarks.main_job --against v0.3.0     # against the main job of another commit, tag or branch

`--against REF` checks REF out in a temporary git worktree and runs its own train.py, package and job config there
(its package first on PYTHONPATH). Results: a table on stdout and benchmarks/results/main_job.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from jsonargparse import ArgumentParser

from lightning_template.script_args import script_parser

ROOT = Path(__file__).resolve().parents[1]
MAIN = "configs/simple_cnn.yaml"


@dataclass(frozen=True)
class Job:
    name: str
    root: Path  # the checkout whose train.py, package and config run
    config: str

    def run(self, seed: int, workdir: Path) -> tuple[float, float]:
        """(wall seconds, test accuracy) of one `train.py fit` with `seed`."""
        args = [sys.executable, str(self.root / "train.py"), "fit", "--config", str(self.root / self.config)]
        args += ["--seed_everything", str(seed), "--trainer.enable_progress_bar=false"]
        env = {**os.environ, "PYTHONPATH": str(self.root)}  # its own package, before any installed one
        start = time.perf_counter()
        done = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(f"{self.name} seed {seed} failed:\n{done.stderr[-3000:]}")
        accuracy = re.search(r"test accuracy: ([0-9.]+)", done.stdout)
        return seconds, float(accuracy.group(1)) if accuracy else float("nan")


@contextlib.contextmanager
def checkout(ref: str, folder: Path) -> Iterator[Path]:
    """`ref` of this repository in a temporary worktree under `folder`."""
    path = folder / "against"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), ref], cwd=ROOT, check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


def mean_std(values: list[float], decimals: int) -> str:
    spread = f" ± {statistics.stdev(values):.{decimals}f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.{decimals}f}{spread}"


def compare(jobs: list[Job], seeds: list[int], workdir: Path) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {job.name: [] for job in jobs}
    for seed in seeds:
        for job in jobs:  # alternating: each seed runs every job back to back
            with tempfile.TemporaryDirectory(dir=workdir) as run_dir:
                seconds, accuracy = job.run(seed, Path(run_dir))
            results[job.name].append({"seed": seed, "seconds": seconds, "test_acc": accuracy})
            print(f"{job.name:44} seed {seed:4}: {seconds:6.1f} s, test accuracy {accuracy:.4f}", flush=True)
    print(f"\n{'job':44} {'wall time (s)':>16} {'test accuracy (%)':>20}")
    for name, runs in results.items():
        seconds = [r["seconds"] for r in runs]
        accuracy = [100 * r["test_acc"] for r in runs]
        print(f"{name:44} {mean_std(seconds, 1):>16} {mean_std(accuracy, 2):>20}")
    return results


def parser() -> ArgumentParser:
    parser = script_parser(__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 7, 123], help="Seeds of each job, run in turn.")
    parser.add_argument("--against", help="A commit, tag or branch whose main job runs in turn with this one's.")
    parser.add_argument(
        "--out", type=str, default=str(ROOT / "benchmarks" / "results" / "main_job.json"), help="JSON results."
    )
    return parser


def main() -> None:
    options = parser().parse_args()
    out = Path(options.out)
    main_job = Job(f"main ({MAIN})", ROOT, MAIN)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if options.against:
            other = Job(f"{options.against} ({MAIN})", stack.enter_context(checkout(options.against, Path(tmp))), MAIN)
        else:
            other = Job("classic (configs/simple_cnn_classic.yaml)", ROOT, "configs/simple_cnn_classic.yaml")
        results = compare([main_job, other], options.seeds, Path(tmp))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
