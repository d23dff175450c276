"""The SLURM batch script (configs/slurm/ddp.sbatch): the configuration it gives the job, and a requeue."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import ROOT, train_process
from tests.helpers import same_state

JOB_ID = "4242"


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "TORCHELASTIC"))}


@pytest.mark.slow
def test_the_sbatch_script_gives_the_configuration_the_tests_run(tmp_path: Path) -> None:
    """configs/slurm/ddp.sbatch as SLURM runs it (sbatch's variables set, `srun` replaced by a stub that
    prints the configuration its command parses to, instead of training)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f'#!/bin/sh\nshift\nexec {sys.executable} "$@" --print_config\n')
    (bin_dir / "srun").chmod(0o755)
    env = {**base_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": JOB_ID,
           "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "4"}  # fmt: skip
    done = subprocess.run(
        ["bash", "configs/slurm/ddp.sbatch", "--data.batch_size=32"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    config = yaml.safe_load(done.stdout)
    trainer = config["trainer"]
    assert (trainer["strategy"], int(trainer["num_nodes"]), int(trainer["devices"])) == ("ddp", 2, 4)
    assert trainer["default_root_dir"] == f"checkpoints/slurm-{JOB_ID}"
    assert trainer["logger"]["init_args"]["version"] == f"slurm-{JOB_ID}"
    assert config["data"]["init_args"]["batch_size"] == 32  # the script passes its arguments on


@pytest.mark.slow
def test_a_requeue_at_a_step_with_a_validation_due_waits_for_it_and_the_job_resumes_exactly(tmp_path: Path) -> None:
    """One SLURM task, its requeue signal (SIGUSR1) after a batch with a validation due: the job stops at the step
    after that validation and the best checkpoint's update, and the requeued job (the same command, no --ckpt_path)
    ends with the weights, the best checkpoint and the validations of the job never stopped."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "scontrol.log"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = {**base_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": JOB_ID, "SLURM_NTASKS": "1",
           "SLURM_JOB_NAME": "train", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}  # fmt: skip
    csv_logger = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir=logs"]
    args = ["fit", "--model=tests.plain_task.Regressor", "--data=tests.plain_task.RegressionData",
            "--data.train_size=320", "--trainer.max_epochs=2", "--trainer.val_check_interval=0.5",
            "--trainer.limit_val_batches=2", "--trainer.enable_progress_bar=false", *csv_logger,
            f"--trainer.logger.version=slurm-{JOB_ID}", f"--trainer.default_root_dir=checkpoints/{JOB_ID}"]  # fmt: skip
    requeue = ["--trainer.callbacks+=tests.helpers.SignalAtBatch", "--trainer.callbacks.epoch=1",
               "--trainer.callbacks.batch=4", f"--trainer.callbacks.signum={int(signal.SIGUSR1)}"]  # fmt: skip
    train_process(args, tmp_path / "full", env=env)
    train_process([*args, *requeue], tmp_path / "job", expect=143, env=env)
    assert record.read_text().split() == ["requeue", JOB_ID]
    resumed = train_process(args, tmp_path / "job", env=env)
    said = resumed.stdout + resumed.stderr
    assert "hpc_ckpt_1.ckpt" in said and "continuing epoch 1 after 6 batches" in said and "Warning" not in said

    def ended(job: str) -> tuple[dict[str, torch.Tensor], list[str], list[tuple[str, str]]]:
        run = tmp_path / job / f"logs/regressor/slurm-{JOB_ID}"
        weights = torch.load(run / "checkpoints/last.ckpt", weights_only=True)["state_dict"]
        best = sorted(p.name for p in (run / "checkpoints").glob("epoch=*.ckpt"))
        with open(run / "metrics.csv", newline="") as f:
            validations = [(row["step"], row["val_loss"]) for row in csv.DictReader(f) if row.get("val_loss")]
        return weights, best, validations

    (weights, best, validations), (full_weights, full_best, full_validations) = ended("job"), ended("full")
    assert same_state(weights, full_weights) and best == full_best and validations == full_validations
