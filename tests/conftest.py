from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="session")
def fashion_mnist_dir() -> Path:
    if not (SYSTEM_FASHION_MNIST / "train-images-idx3-ubyte.gz").is_file():
        pytest.fail("Fashion-MNIST is needed by the tests: `apt-get install dataset-fashion-mnist`.")
    return SYSTEM_FASHION_MNIST


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `train.py` in a fresh process, as a user would, and fail with its output if it fails."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        pytest.fail(
            f"train.py {' '.join(args)} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
        )
    return result
