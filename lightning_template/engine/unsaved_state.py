"""State of the module that no checkpoint holds, named at the resume that cannot give it back.

A module's buffer registered with `persistent=False` and a plain attribute (`self.seen += 1`, a float annealed at
each step) are in no `state_dict`: a run resumed from a checkpoint starts them from the values its own start gave
them, not from the stopped run's, and whatever they steer (a loss weight, a schedule of the module's own) differs
without a word. `UnsavedState` compares them at each checkpoint with their values at the start of training (no cost
at the steps in between; a value that was None then, a cache its `forward` builds, is not state) and records a
fingerprint of each that changed; the resumed run, once the module's `on_load_checkpoint` has run (which may give some
back), names at its start, in one line, those that do not hold the recorded value, and where to keep them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn
from torchmetrics import Metric

PLAIN = (bool, int, float, complex, str, torch.Tensor)  # what a counter or an annealed value is
MODULE_OWN = {"training"}  # nn.Module's own plain attribute: train or eval mode, which fit sets


def _fingerprint(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes()
        return f"{value.dtype}{tuple(value.shape)}:" + hashlib.blake2b(data, digest_size=16).hexdigest()
    return f"{type(value).__name__}:{value!r}"


def unsaved_values(module: LightningModule) -> dict[str, Any]:
    """The module's buffers that its `state_dict` leaves out (`persistent=False`), and the plain values it keeps as
    attributes of its own (names without a leading `_`), by dotted name. Not a torchmetrics metric's states, which
    `EpochMetrics` puts in every checkpoint."""
    saved = module.state_dict(keep_vars=True).keys()
    values = {name: buffer for name, buffer in module.named_buffers() if name not in saved}
    metrics = [f"{prefix}." for prefix, part in module.named_modules() if isinstance(part, Metric)]
    for prefix, part in module.named_modules():
        if any(f"{prefix}.".startswith(metric) for metric in metrics):  # a metric, or a part of one
            continue
        for attribute, value in vars(part).items():
            plain = isinstance(value, PLAIN) and not isinstance(value, nn.Parameter)
            if plain and not attribute.startswith("_") and attribute not in MODULE_OWN:
                values[f"{prefix}.{attribute}".lstrip(".")] = value
    return values


def fingerprints(module: LightningModule) -> dict[str, str]:
    return {name: _fingerprint(value) for name, value in unsaved_values(module).items()}


class UnsavedState(Callback):
    """Names, at a resume, the module's state that changed in the stopped run and that no checkpoint held (see the
    module's docstring). Installed in every run by train.py."""

    def __init__(self) -> None:
        self._module: LightningModule | None = None
        self._at_start: dict[str, str] = {}
        self._saved: dict[str, str] | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._module, self._at_start = pl_module, fingerprints(pl_module)
        saved, self._saved = self._saved or {}, None
        lost = sorted(name for name, value in saved.items() if self._at_start.get(name) != value)
        if lost:
            names = ", ".join(lost[:4]) + (", ..." if len(lost) > 4 else "")
            rank_zero_warn(
                f"ExactResume: the module's {names} changed during the run that wrote the checkpoint and no checkpoint"
                " holds them (a plain attribute, or a buffer registered with persistent=False): they go on from this"
                " run's start values, not the stopped run's, so what they steer differs. Keep them in"
                " on_save_checkpoint/on_load_checkpoint, or register them as persistent buffers."
            )

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._module = None

    def state_dict(self) -> dict[str, Any]:
        if self._module is None:  # outside training (a checkpoint saved by hand before or after fit)
            return {}
        # Values the module had at the start of training: not a cache that its forward builds from None.
        now = fingerprints(self._module)
        return {"changed": {k: v for k, v in now.items() if k in self._at_start and self._at_start[k] != v}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = state_dict.get("changed")
