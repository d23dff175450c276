"""Several worker processes on one machine: one per GPU, or on a CPU each with its share of the threads.

`tune.py --workers N` and `multirun.py --workers N` start N copies of themselves (`--workers 1`,
`--threads K`, `CUDA_VISIBLE_DEVICES` set to one device each). The copies share the work through
what they already share: a study's storage (tune.py) or the runs' folders (multirun.py), so the
same workers can as well be started by hand or by SLURM on several machines (configs/slurm/).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import torch
from jsonargparse import ArgumentParser

from lightning_template.engine.errors import ConfigError

FORWARDED = (signal.SIGTERM, signal.SIGINT)
WORKER_FLAG = "--worker"


def process_token(pid: int | None = None) -> str:
    """pid and start time (Linux /proc), so a reused pid is not taken for the process that died."""
    pid = os.getpid() if pid is None else pid
    try:
        return f"{pid}:{Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[19]}"
    except (OSError, IndexError):
        return f"{pid}:"


def process_alive(token: str) -> bool:
    """Whether the process of `token`, on this machine, still runs (a zombie, killed but not reaped yet, does not)."""
    pid = int(token.split(":")[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return False
    except (OSError, IndexError):
        pass
    return process_token(pid) == token


def set_threads(threads: int | None) -> None:
    """This process's share of the CPU threads (`--threads`), for the tensors' own threads and OpenMP's."""
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads {threads}: give a number of threads of at least 1.")
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


def assignments(workers: int, accelerator: str) -> list[dict[str, str]]:
    """The environment of each worker: one GPU each (CUDA_VISIBLE_DEVICES), and a share of the CPU threads."""
    if workers < 1:
        raise ConfigError(f"--workers {workers}: give a number of worker processes of at least 1.")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # not on macOS
    threads = str(max(1, cores // workers))
    if accelerator == "cpu" or not torch.cuda.is_available():
        return [{"OMP_NUM_THREADS": threads} for _ in range(workers)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if workers > len(devices):
        raise ConfigError(
            f"--workers {workers}: {len(devices)} GPU(s) visible ({','.join(devices)}), and each worker takes one:"
            f" give --workers {len(devices)} or fewer, or --trainer.accelerator=cpu."
        )
    return [{"OMP_NUM_THREADS": threads, "CUDA_VISIBLE_DEVICES": devices[i]} for i in range(workers)]


def add_options(parser: ArgumentParser) -> None:
    parser.add_argument(
        "--workers", type=int, default=1, help="Processes at once on this machine: one per GPU, or CPU threads shared."
    )
    parser.add_argument(
        "--threads", type=int | None, default=None, help="CPU threads of this process; null: torch's own count."
    )
    # Set on the processes `--workers N` starts: the one that started them writes the final results.
    parser.add_argument(WORKER_FLAG, action="store_true", help=argparse.SUPPRESS)


def launch(script: str, argvs: Sequence[Sequence[str]], environments: list[dict[str, str]]) -> list[int]:
    """Run `script argv --workers 1 --threads K` for each argv and environment at once; their exit codes when all
    have ended. A SIGTERM or Ctrl-C of this process is passed on to each, which stops as a lone one would."""
    workers: list[subprocess.Popen] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signum)

    before = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        for i, (argv, env) in enumerate(zip(argvs, environments, strict=True)):
            command = [sys.executable, script, *argv, "--workers=1", f"--threads={env['OMP_NUM_THREADS']}", WORKER_FLAG]
            # In a session of its own: a Ctrl-C in the terminal reaches it once, through this process.
            workers.append(subprocess.Popen(command, env={**os.environ, **env}, start_new_session=True))
            device = f"GPU {env['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in env else "CPU"
            print(f"worker {i}: pid {workers[-1].pid}, {device}, {env['OMP_NUM_THREADS']} thread(s)", flush=True)
        while any(worker.poll() is None for worker in workers):  # each reaped as it ends
            time.sleep(0.5)
        return [worker.returncode for worker in workers]
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def describe(code: int) -> str:
    return f"ended by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
