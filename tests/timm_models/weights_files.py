"""Weights files as timm writes them, for the tests of the timm extra and the offline runs of its job config."""

from __future__ import annotations

from pathlib import Path

import torch


def saved_by_timm(backbone: str, folder: Path) -> Path:
    """`folder`/<backbone>/, written by timm's `save_for_hf` from a fixed random initialization of the backbone at
    timm's defaults (3 channels, 1000 classes, 224 px): model.safetensors, pytorch_model.bin and config.json."""
    import timm  # here, not at the top: the test processes that never write a file do not import it
    from timm.models import save_for_hf

    target = folder / backbone
    if not (target / "model.safetensors").is_file():
        with torch.random.fork_rng():  # the caller's random stream must not depend on whether the file existed
            torch.manual_seed(5)
            save_for_hf(timm.create_model(backbone), str(target), safe_serialization="both")
    return target
