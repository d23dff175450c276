"""The benchmarks' statistics, and the GPU script as far as a CPU can run it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.stats import median_ci_ranks, summarize

ROOT = Path(__file__).resolve().parents[2]


def coverage(n: int, lo: int, hi: int) -> float:
    """Probability that the sorted sample's values at ranks lo..hi (0-based) bracket the true median."""
    below = sum(math.comb(n, k) for k in range(lo + 1)) / 2**n  # P(at most lo values below the median)
    above = sum(math.comb(n, k) for k in range(n - hi)) / 2**n
    return 1 - below - above


@pytest.mark.parametrize("n", [6, 7, 10, 20, 31, 40])
def test_the_median_interval_is_the_narrowest_with_95_percent_coverage(n: int) -> None:
    lo, hi = median_ci_ranks(n)
    assert coverage(n, lo, hi) >= 0.95
    assert coverage(n, lo + 1, hi - 1) < 0.95  # one rank narrower on both sides would not hold


def test_summary_of_known_values() -> None:
    summary = summarize([float(v) for v in range(1, 21)])  # 1..20
    assert (summary.median, summary.q1, summary.q3) == (10.5, 5.75, 15.25)
    assert (summary.ci_low, summary.ci_high, summary.n) == (6.0, 15.0, 20)  # x(6)..x(15), the textbook interval
    assert summary.relative_ci() == pytest.approx(4.5 / 10.5)


@pytest.mark.slow
def test_gpu_script_without_cuda_says_so_and_measures_nothing(tmp_path: Path) -> None:
    # This interpreter, not a .venv the script would first create and install (minutes); starting torch and
    # Lightning takes seconds on an idle machine and minutes on a loaded one: the limit leaves room for both.
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu.sh"), "--out", str(tmp_path)],
        env=os.environ | {"CUDA_VISIBLE_DEVICES": "", "PROJECT_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 2, run.stderr
    assert "no CUDA device is visible" in run.stderr and "nothing was measured" in run.stderr
    assert "Traceback" not in run.stderr + run.stdout
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.matrix  # nightly (make matrix)
def test_gpu_script_runs_every_part_on_a_cpu(tmp_path: Path) -> None:
    """`--allow-cpu`: the same code paths with tiny sizes (precisions, channels_last, overhead, a 2-process DDP)."""
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--allow-cpu", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "gpu.json").read_text())
    assert set(results["throughput"]) == {
        f"{model}, {variant}"
        for model in ("SimpleCNN 28 px", "ResNet-18 32 px", "ViT 28 px")
        for variant in ("fp32", "16-mixed", "bf16-mixed")
    } | {"SimpleCNN 28 px, 16-mixed channels_last", "ResNet-18 32 px, 16-mixed channels_last"}
    for entry in results["throughput"].values():
        assert entry["images_per_s"]["median"] > 0 and 0 < entry["fraction_of_peak"]["median"] < 1.5
    assert results["overhead"]["overhead_us_per_step"]["n"] == 2
    assert 0.5 < results["overhead"]["end_to_end_ratio"]["median"] < 2
    assert results["ddp"]["devices"] == 2 and results["ddp"]["images_per_s_2"] > 0
    assert "| SimpleCNN 28 px, fp32 |" in (tmp_path / "gpu.md").read_text()


@pytest.mark.slow
def test_profiling_a_step_prints_nothing_of_the_profiler_itself() -> None:
    """The CPU profiler (the table's share of time in convolutions and matmuls) runs without its library's
    `USDT:` start and stop lines or its failed look for a GPU on stderr, in a fresh process as `make bench` runs."""
    code = (
        "import torch\nfrom benchmarks.throughput import time_in_flop_ops\n"
        "share = time_in_flop_ops(lambda: torch.ones(64, 64) @ torch.ones(64, 64), steps=2)\nprint(f'{share:.2f}')"
    )
    environment = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert 0 < float(done.stdout) <= 1 and done.stderr == "", done.stderr


def test_the_bare_loop_runs_the_network_as_the_job_does(fashion_mnist_dir: Path) -> None:
    """The main job runs NHWC (`channels_last: true`), which is not a hyper-parameter: the bare loop's twin, and the
    Lightning-alone module, must run it the same way, or the overhead is measured against another network."""
    from lightning_template.engine.cli import ProjectCLI

    from benchmarks.overhead import JOB, ROOT, TINY, BareLoop, twin_of

    config = ProjectCLI(args=["--config", str(ROOT / JOB), *TINY, "--trainer.accelerator=cpu"], run=False)
    assert config.model.channels_last  # what the job asks, so that the check below means something
    config.datamodule.setup("fit")
    bare = BareLoop(config.model, config.datamodule, {"total_steps": 10, "warmup_steps": 1, "schedule": "cosine"})
    for twin in (bare.model, twin_of(config.model)):
        assert twin.channels_last and not twin.compile_net
    conv = next(m for m in bare.model.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
