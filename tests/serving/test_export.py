"""export.py: TorchScript, ONNX and the state dict of a checkpoint reproduce its logits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT
from tests.helpers import same_state
from tests.serving.conftest import assert_exported


@pytest.mark.slow
def test_export_of_images_round_trips(main_export: subprocess.CompletedProcess, main_run: Path) -> None:
    """Images (fixed shape): TorchScript, ONNX and the state dict reproduce the logits (export.py checks each;
    token ids of dynamic length: tests/serving/test_text_serving.py)."""
    assert_exported(main_export, main_run / "out")


@pytest.mark.slow
def test_the_documented_snippet_loads_the_exported_state_dict(main_export, main_run: Path) -> None:
    start = "import json, torch\nfrom lightning_template.tasks import classification\n"
    snippet = start + (ROOT / "docs/tools.md").read_text().partition("```python\n" + start)[2].partition("```")[0]
    namespace: dict = {}
    exec(snippet.replace("exports/simple_cnn", str(main_run / "out")), namespace)
    trained = torch.load(main_run / "out/net_state_dict.pt", weights_only=True)
    assert same_state(namespace["net"].state_dict(), trained)
