"""The SLURM batch script (configs/slurm/ddp.sbatch): the configuration it gives the job, and a requeue."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

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
