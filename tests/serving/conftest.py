"""Fixtures of the serving tests: the main run exported by export.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, best_checkpoint, run_cli


@pytest.fixture(scope="session")
def main_export(main_run: Path) -> subprocess.CompletedProcess:
    """`export.py` of the main run's best checkpoint into main_run/out/."""
    config = ["--config", str(ROOT / "configs/simple_cnn.yaml")]
    return run_cli(*config, f"--ckpt_path={best_checkpoint(main_run, 'simple_cnn')}", "--out=out", cwd=main_run,
                   script="export.py")  # fmt: skip


def assert_exported(result: subprocess.CompletedProcess, out: Path) -> None:
    for kind, file in (("torchscript", "net.ts"), ("onnx", "net.onnx"), ("state_dict", "net_state_dict.pt")):
        assert f"{kind:<11} out/{file}  max |logit difference| = " in result.stdout
        assert (out / file).is_file()
    assert "FAILED" not in result.stdout and (out / "serving.json").is_file()
