"""The checkpoint a run starts from (`--ckpt_path <file>` or `last`), read once, into one record.

What the CLI needs from it before anything is built — the model's class and hyper-parameters, the tracker run to
continue, a datamodule's saved state (a vocabulary), the tensors' shapes — comes from this record; the Trainer then
loads the file itself, to restore the weights and the loops. The file is memory-mapped: reading the record costs
no copy of the weights.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lightning_template.engine.errors import ConfigError, MissingFileError
from lightning_template.engine.tracking import CHECKPOINT_KEY


@dataclass(frozen=True)
class RunCheckpoint:
    path: Path
    hyper_parameters: dict[str, Any]  # as the model saved them; LightningCLI adds `_class_path`
    entries: dict[str, Any]  # the checkpoint's other top-level entries: {datamodule class name: its state_dict()}...
    tracker_runs: dict[str, str]  # {logger class: run id} of the run that wrote it
    shapes: dict[str, tuple[int, ...]]  # of the model's state dict
    global_step: int
    best_model_path: str | None  # the run's best-epoch checkpoint when this one was written, if it had one

    @property
    def model_class(self) -> str | None:
        return self.hyper_parameters.get("_class_path")

    @classmethod
    def read(cls, path: str | Path, option: str = "--ckpt_path") -> RunCheckpoint:
        """The record of `path`; a one-line error if it is missing or not a readable checkpoint."""
        path = Path(path)
        if not path.is_file():
            raise MissingFileError(
                f"{option} {path}: no such file. Checkpoints are in logs/<name>/version_*/checkpoints/."
            )
        if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut-off file has no central directory
            raise ConfigError(
                f"{option} {path}: not a readable PyTorch checkpoint (truncated or corrupt)."
                " Use another one, e.g. the best-epoch checkpoint next to it."
            )
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as err:
            reason = str(err).strip().splitlines()[0][:200]
            raise ConfigError(
                f"{option} {path}: not a readable PyTorch checkpoint ({type(err).__name__}: {reason})."
            ) from err
        if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
            raise ConfigError(f"{option} {path}: not a Lightning checkpoint (no state_dict); for weights alone use"
                              " --model.weights, where the model takes them.")  # fmt: skip
        held = {"state_dict", "hyper_parameters", "callbacks", "loops", "optimizer_states", "lr_schedulers"}
        return cls(
            path=path,
            hyper_parameters=dict(checkpoint.get("hyper_parameters") or {}),
            entries={k: v for k, v in checkpoint.items() if k not in held},
            tracker_runs=dict(checkpoint.get(CHECKPOINT_KEY, {})),
            shapes={k: tuple(v.shape) for k, v in checkpoint["state_dict"].items() if isinstance(v, torch.Tensor)},
            global_step=int(checkpoint.get("global_step", 0)),
            best_model_path=_best_of(checkpoint.get("callbacks") or {}),
        )

    def best_checkpoint(self) -> Path | None:
        """The run's best-epoch checkpoint, found next to this one (its folder may have moved since), if it is there."""
        if not self.best_model_path:
            return None
        beside = self.path.parent / Path(self.best_model_path).name
        return next((p for p in (beside, Path(self.best_model_path)) if p.is_file()), None)

    def datamodule_state(self, class_name: str) -> dict[str, Any] | None:
        """What the datamodule of class `class_name` saved (its `state_dict()`), as Lightning stores it."""
        state = self.entries.get(class_name)
        return state if isinstance(state, dict) else None

    def mismatched_shapes(self, state_dict: dict[str, torch.Tensor]) -> list[str]:
        """`name: checkpoint (..) vs model (..)` for each tensor both have with another shape."""
        return [
            f"{name}: checkpoint {self.shapes[name]} vs model {tuple(tensor.shape)}"
            for name, tensor in state_dict.items()
            if name in self.shapes and self.shapes[name] != tuple(tensor.shape)
        ]


def _best_of(callbacks: dict[str, Any]) -> str | None:
    """The best checkpoint that a run's monitoring ModelCheckpoint recorded (the project's BestCheckpoint first)."""
    states = [
        (not name.startswith("BestCheckpoint"), state["best_model_path"])
        for name, state in callbacks.items()
        if isinstance(state, dict) and state.get("monitor") and state.get("best_model_path")
    ]
    return min(states)[1] if states else None
