"""The core stands alone: it runs with every extra unimportable. What an extra is (its paths) is listed in
pyproject.toml's [tool.lightning_template.extras]."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import QUICK, ROOT

TOOL = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
EXTRAS: dict[str, list[str]] = TOOL["lightning_template"]["extras"]
# The extras' packages, and the third-party libraries only they use.
EXTRA_MODULES = ["mlflow", "wandb"]  # the trackers': their loggers are the core's, their packages optional
# extra:search
EXTRA_MODULES += ["lightning_template.search", "optuna"]
# /extra:search
# extra:serving
EXTRA_MODULES += ["lightning_template.serving", "litserve", "onnx", "onnxruntime"]
# /extra:serving
# extra:streaming
EXTRA_MODULES += ["lightning_template.streaming", "litdata"]
# /extra:streaming
# extra:tools
EXTRA_MODULES += ["lightning_template.tools"]
# /extra:tools
# extra:timm
EXTRA_MODULES += ["lightning_template.timm_models", "timm"]
# /extra:timm
# extra:hf
# transformers stays importable: torchmetrics imports it wherever it is installed, and a project without this extra
# does not have it.
EXTRA_MODULES += ["lightning_template.hf_models", "peft"]
# /extra:hf


@pytest.mark.slow
def test_the_core_trains_with_every_extra_unimportable(tmp_path: Path) -> None:
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in EXTRA_MODULES)  # `import` of it fails
    code = f"import sys; {blocked}; from lightning_template.engine.cli import main; main()"
    args = ["fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), *QUICK, "--trainer.max_epochs=1"]
    args += ["--trainer.limit_train_batches=3", "--test_after_fit=true"]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "test accuracy:" in done.stdout
    assert (tmp_path / "logs/simple_cnn/version_0/checkpoints/last.ckpt").is_file()


def test_every_path_of_an_extra_exists() -> None:
    for name, paths in EXTRAS.items():
        for path in paths:
            assert (ROOT / path).exists(), f"[tool.lightning_template.extras] {name}: {path} does not exist"
