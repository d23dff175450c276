"""export.py: TorchScript, ONNX and the state dict of a checkpoint reproduce its logits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.serving.conftest import assert_exported


@pytest.mark.slow
def test_export_of_images_round_trips(main_export: subprocess.CompletedProcess, main_run: Path) -> None:
    """Images (fixed shape): TorchScript, ONNX and the state dict reproduce the logits (export.py checks each;
    token ids of dynamic length: tests/serving/test_text_serving.py)."""
    assert_exported(main_export, main_run / "out")
