"""Every Lightning private attribute the project touches exists in the installed Lightning."""

from __future__ import annotations

import functools
from pathlib import Path

import lightning
import pytest
from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, WeightAveraging
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.trainer import call
from torchmetrics import MeanMetric

from lightning_template.engine import lightning_internals


def owner(name: str) -> object:
    return {
        "trainer": lambda: Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False),
        "ModelCheckpoint": ModelCheckpoint,
        "EarlyStopping": lambda: EarlyStopping(monitor="val_loss"),
        "LightningModule": LightningModule,
        "WeightAveraging": WeightAveraging,
        "LightningCLI": lambda: LightningCLI,
        "call": lambda: call,
        "Metric": MeanMetric,
    }[name]()


@pytest.mark.parametrize(("owner_name", "path"), lightning_internals.USED, ids=lambda v: str(v))
def test_every_private_lightning_attribute_still_exists(owner_name: str, path: str) -> None:
    try:
        functools.reduce(getattr, path.split("."), owner(owner_name))
    except AttributeError:
        pytest.fail(
            f"Lightning {lightning.__version__} has no `{owner_name}.{path}`, which"
            " lightning_template/engine/lightning_internals.py uses: find where this release moved it and update"
            " that file"
            " (or pin the Lightning version in pyproject.toml)."
        )


def test_no_other_module_touches_lightning_internals() -> None:
    """The adapter is the only place: other modules call its functions (overriding a protected method of a
    Lightning class they subclass, with `super()`, is the one exception)."""
    package = Path(lightning_internals.__file__).parent
    names = {path.rpartition(".")[2] for _, path in lightning_internals.USED}
    offenders = [
        f"{file.relative_to(package.parent)}: .{name}"
        for file in package.rglob("*.py")
        if file.name != "lightning_internals.py"
        for line in file.read_text().splitlines()
        for name in names
        if name.startswith("_") and f".{name}" in line and "super()." not in line
    ]
    assert not offenders, offenders
