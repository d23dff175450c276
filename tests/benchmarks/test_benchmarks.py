"""The benchmarks' statistics, the GPU script as far as a CPU can run it, and the per-step costs they found."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks.stats import median_ci_ranks, summarize
from lightning_template.data import FashionMNISTDataModule
from lightning_template.models import SimpleCNN
from lightning_template.resume.exact_resume import seed_all

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


def test_seeding_per_batch_sets_torch_manual_seed_states_in_microseconds() -> None:
    seed_all(1234)
    ours = torch.rand(4), torch.randn(2)
    torch.manual_seed(1234)
    assert torch.equal(ours[0], torch.rand(4)) and torch.equal(ours[1], torch.randn(2))
    # ExactResume seeds every training batch. torch.manual_seed costs ~2 ms per call on this kind of CPU while
    # CUDA is not initialized (it formats a stack trace for deferred CUDA seeding): 2 ms per step of overhead.
    timings = []
    for _ in range(50):
        start = time.perf_counter()
        seed_all(1234)
        timings.append(time.perf_counter() - start)
    assert statistics.median(timings) < 100e-6  # about 10 µs; torch.manual_seed: 550 µs here, 2 ms in a fit


def test_train_loss_is_logged_when_written_and_train_acc_is_the_epoch_accuracy(
    quick_trainer, fashion_mnist_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each `self.log` costs about 0.3 ms on this kind of CPU (more for a metric object): train_loss only in the steps
    whose values reach the logger and in the epoch's last, train_acc once per epoch, and still the accuracy over
    every training sample of the epoch."""
    calls: list[str] = []
    log = SimpleCNN.log
    monkeypatch.setattr(
        SimpleCNN, "log", lambda self, name, *args, **kwargs: calls.append(name) or log(self, name, *args, **kwargs)
    )
    model = SimpleCNN(channels=(4, 8), hidden=16, dropout=0.0)
    correct, seen = [], []

    def record(module, inputs, logits):  # the logits the step's loss and metric see
        correct.append(int((logits.argmax(1) == record.targets).sum()))
        seen.append(len(logits))

    original_step = model.training_step

    def step(batch, batch_idx):
        record.targets = batch[1]
        return original_step(batch, batch_idx)

    model.training_step = step
    model.net.register_forward_hook(record)
    trainer = quick_trainer(limit_train_batches=7, limit_val_batches=0, log_every_n_steps=3)
    trainer.fit(model, datamodule=FashionMNISTDataModule(batch_size=16))
    assert calls.count("train_loss") == 3 and calls.count("train_acc") == 1  # steps 3 and 6 (logged), 7 (last)
    assert float(trainer.callback_metrics["train_acc"]) == pytest.approx(sum(correct) / sum(seen), abs=1e-6)


def test_gpu_script_without_cuda_says_so_and_measures_nothing(tmp_path: Path) -> None:
    # This interpreter, not a .venv the script would first create and install (minutes); starting torch and
    # Lightning takes seconds on an idle machine and minutes on a loaded one: the limit leaves room for both.
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu.sh"), "--out", str(tmp_path)],
        env=os.environ | {"CUDA_VISIBLE_DEVICES": "", "TEMPLATE_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 2, run.stderr
    assert "no CUDA device is visible" in run.stderr and "nothing was measured" in run.stderr
    assert "Traceback" not in run.stderr + run.stdout
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
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
