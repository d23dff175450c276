"""Multi-node launches on one machine: torchrun with 2 nodes x 1 process, and a SLURM job of 2 tasks
(the environment srun gives each task), requeued by SIGUSR1 and resumed exactly.

Both train from LitData chunks, so LitData shards the training data across the nodes, and
check what a cluster user relies on: one set of logs and checkpoints, every validation
sample evaluated once, and the same weights whichever launcher started the processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_template.streaming import StreamingImageDataModule
from lightning_template.tasks.classification import FashionMNISTDataModule

from convert import convert
from tests.conftest import ROOT, run_cli
from tests.helpers import free_port, max_difference, read_events

pytestmark = pytest.mark.processes

# 3 classes, about 300 validation images (an odd count: padding to equal shards would repeat one).
STREAMING = "lightning_template.streaming.StreamingImageDataModule"
SUBSET = {"classes": [0, 1, 7], "train_samples_per_class": 64, "val_size": 1001}
# No loader workers: a worker forked by a DDP rank now and then hung inside the fork (its rank waiting for a batch,
# the other rank in a collective) until the test's timeout.
TRAIN = [
    "--config", str(ROOT / "configs/simple_cnn.yaml"), "--data", STREAMING,
    "--data.batch_size=16", "--data.num_workers=0", "--model.dropout=0.25",
    "--trainer.max_epochs=2", "--trainer.limit_train_batches=5", "--trainer.enable_progress_bar=false",
    "--trainer.deterministic=true", "--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--test_after_fit=false",
]  # fmt: skip
JOB_ID = "4242"


def launch(commands: list[list[str]], envs: list[dict[str, str]], cwd: Path) -> list[subprocess.CompletedProcess]:
    """Start the processes together (as the nodes or tasks of one job) and wait for all of them."""
    processes = [
        subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for command, env in zip(commands, envs, strict=True)
    ]
    try:
        outputs = [process.communicate(timeout=300)[0] for process in processes]
    finally:  # a hung rank (a collective waiting for its peer) must not outlive the test
        for process in processes:
            process.kill()
    return [subprocess.CompletedProcess(p.args, p.returncode, out) for p, out in zip(processes, outputs, strict=True)]


def base_env() -> dict[str, str]:
    # One thread per process: two processes on two cores must not oversubscribe them.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "TORCHELASTIC"))}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory, fashion_mnist_dir) -> Path:
    output = tmp_path_factory.mktemp("multinode") / "fashion"
    convert(FashionMNISTDataModule(**SUBSET), str(output), chunk_bytes="64KB")
    return output


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory: pytest.TempPathFactory, stream: Path) -> tuple[Path, list[str]]:
    workdir = tmp_path_factory.mktemp("torchrun")
    endpoint = f"127.0.0.1:{free_port()}"
    commands = [
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", f"--node_rank={rank}",
         f"--rdzv-endpoint={endpoint}", str(ROOT / "train.py"), "fit", *TRAIN, f"--data.input_dir={stream}",
         "--trainer.num_nodes=2", "--trainer.devices=1", "--trainer.callbacks+=tests.helpers.RecordTrainingSamples",
         f"--trainer.callbacks.folder={workdir / 'samples'}"]
        for rank in (0, 1)
    ]  # fmt: skip
    results = launch(commands, [base_env(), base_env()], workdir)
    for result in results:
        assert result.returncode == 0, result.stdout[-4000:]
    return workdir, [result.stdout for result in results]


def final_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.slow
def test_torchrun_two_nodes_train_on_shards_and_write_one_run(torchrun_job, stream: Path) -> None:
    workdir, outputs = torchrun_job
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in "".join(outputs)
    assert sum(output.count("best checkpoint:") for output in outputs) == 1  # the summary comes from rank 0
    assert [p.name for p in (workdir / "logs/simple_cnn").iterdir()] == ["version_0"]
    checkpoints = workdir / "logs/simple_cnn/version_0/checkpoints"
    checkpoint = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 10  # 5 steps x 2 epochs, each step one batch per node
    # LitData's shards: in each epoch the two nodes train on different images, 5 batches of 16 each.
    seen = [json.loads((workdir / "samples" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for epoch in ("0", "1"):
        assert len(set(seen[0][epoch])) == len(set(seen[1][epoch])) == 80
        assert not set(seen[0][epoch]) & set(seen[1][epoch])
    assert seen[0]["0"] != seen[0]["1"]  # reshuffled each epoch
    # Every validation image once: one process evaluating the same weights gets the same metrics.
    val_samples = StreamingImageDataModule(input_dir=str(stream)).metadata["splits"]["val"]
    assert val_samples % 2 == 1
    single = run_cli(
        "validate", "--config", str(ROOT / "configs/simple_cnn.yaml"), "--data", STREAMING,
        f"--data.input_dir={stream}", f"--ckpt_path={checkpoints / 'last.ckpt'}", "--trainer.enable_progress_bar=false",
        "--trainer.logger=false", cwd=workdir,
    )  # fmt: skip
    logged = []  # the run's event files (the summary written after fit is a file of its own)
    for event_file in checkpoints.parent.glob("events.out.tfevents.*"):
        events = read_events(event_file)
        logged += events.Scalars("val_acc") if "val_acc" in events.Tags()["scalars"] else []
    two_nodes = max(logged, key=lambda event: event.step).value  # the last validation: the weights of last.ckpt
    one_process = float(re.search(r"val_acc\D+([0-9.]+)", single.stdout).group(1))
    assert two_nodes == pytest.approx(one_process, abs=1e-7)


@pytest.mark.slow
def test_slurm_job_requeued_on_sigusr1_resumes_exactly(torchrun_job, stream: Path, tmp_path: Path) -> None:
    """Two tasks with the variables srun sets; SIGUSR1 to rank 1 in epoch 0 (SLURM's warning before the time
    limit): both ranks save at the same step, rank 0 calls `scontrol requeue` (a stub that records it), the job
    stops; started again as SLURM would, it resumes from the saved checkpoint and ends with the weights of the
    uninterrupted torchrun job."""
    torchrun_dir, _ = torchrun_job
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "scontrol.log"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {record}\n')
    (bin_dir / "scontrol").chmod(0o755)
    args = [*TRAIN, f"--data.input_dir={stream}", "--trainer.num_nodes=1", "--trainer.devices=2",
            f"--trainer.default_root_dir=checkpoints/slurm-{JOB_ID}",
            f"--trainer.logger.init_args.version=slurm-{JOB_ID}"]  # fmt: skip
    signal_rank_1 = [
        "--trainer.callbacks+=tests.helpers.SignalAtBatch", "--trainer.callbacks.epoch=0",
        "--trainer.callbacks.batch=2", "--trainer.callbacks.signum=10", "--trainer.callbacks.rank=1",
    ]  # fmt: skip

    def job(extra: list[str]) -> list[subprocess.CompletedProcess]:
        port = str(free_port())
        envs = [
            {**base_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "SLURM_JOB_ID": JOB_ID,
             "SLURM_JOB_NAME": "lightning-template", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2",
             "SLURM_JOB_NUM_NODES": "1", "SLURM_NODELIST": "127.0.0.1", "SLURM_PROCID": str(rank),
             "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0", "MASTER_PORT": port}
            for rank in (0, 1)
        ]  # fmt: skip
        command = [sys.executable, str(ROOT / "train.py"), "fit", *args, *extra]
        return launch([command, command], envs, tmp_path)

    stopped = job(signal_rank_1)
    assert [r.returncode for r in stopped] == [143, 143], stopped[0].stdout[-3000:] + stopped[1].stdout[-3000:]
    assert record.read_text().split() == ["requeue", JOB_ID]  # once, by rank 0
    hpc = tmp_path / f"checkpoints/slurm-{JOB_ID}/hpc_ckpt_1.ckpt"
    assert torch.load(hpc, map_location="cpu", weights_only=False)["global_step"] == 3  # both ranks, same step

    resumed = job([])
    assert [r.returncode for r in resumed] == [0, 0], resumed[0].stdout[-3000:]
    assert (
        f"Restoring states from the checkpoint path at checkpoints/slurm-{JOB_ID}/hpc_ckpt_1.ckpt" in resumed[0].stdout
    )
    run_dir = tmp_path / f"logs/simple_cnn/slurm-{JOB_ID}"
    assert [p.name for p in (tmp_path / "logs/simple_cnn").iterdir()] == [run_dir.name]  # one run, continued
    expected = final_state(torchrun_dir / "logs/simple_cnn/version_0/checkpoints/last.ckpt")
    assert max_difference(final_state(run_dir / "checkpoints/last.ckpt"), expected) == 0.0
