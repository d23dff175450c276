"""The boundary with Lightning: every private or non-public attribute the engine touches exists in the installed
Lightning, and is touched in engine/lightning_internals.py alone."""

from __future__ import annotations

import ast
import functools

import lightning
import pytest
import torch
from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, WeightAveraging
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.trainer import call
from torchmetrics import MeanMetric

from lightning_template.engine import lightning_internals

from tests import engine_boundary


def owner(name: str) -> object:
    return {
        "trainer": lambda: Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False),
        "ModelCheckpoint": ModelCheckpoint,
        "EarlyStopping": lambda: EarlyStopping(monitor="val_loss"),
        "LightningModule": LightningModule,
        "WeightAveraging": WeightAveraging,
        "LightningCLI": lambda: LightningCLI,
        "cli": lambda: lightning.pytorch.cli,
        "call": lambda: call,
        "Metric": MeanMetric,
        "torch": lambda: torch,
        "batchnorm": lambda: torch.nn.modules.batchnorm,
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


def test_no_other_engine_module_reads_lightning_internals() -> None:
    """The adapter is the only place: found by what the code reads (a private name of Lightning's, torchmetrics' or
    torch's, a loop, its progress or a connector), not by a list of names already known."""
    reads = engine_boundary.non_public_reads()
    assert not reads, "\n".join(
        f"{read.file}:{read.line}: {read.what}: move it into lightning_template/engine/lightning_internals.py (a"
        " function named for what it does, its names in USED, a behaviour test)"
        for read in reads
    )


def test_used_names_every_private_name_the_adapter_touches() -> None:
    used = {part for _, path in lightning_internals.USED for part in path.split(".")}
    touched = {name for read in engine_boundary.all_reads() for name in read.private}
    assert touched <= used, f"add to lightning_internals.USED: {sorted(touched - used)}"


def test_the_docs_give_each_private_name_its_reason() -> None:
    """docs/extending.md's table of private names lists exactly those the engine touches, so that a name added or
    dropped is said there (what it is for, why no public API does it)."""
    text = (engine_boundary.ROOT / "docs" / "extending.md").read_text()
    table = text.split("### The private names the engine needs, and why", 1)[1].split("\n### ", 1)[0]
    listed = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    touched = {name for read in engine_boundary.all_reads() for name in read.private}
    assert listed == touched, (
        f"docs/extending.md's private names: add {sorted(touched - listed)}, remove {sorted(listed - touched)}"
    )


def test_the_boundary_check_finds_what_it_looks_for() -> None:
    """What the static check reads as non-public, and what it leaves (the engine's own private state, the standard
    library's)."""
    code = """
import os
import torch
from lightning.pytorch.trainer import call
from torch._utils import _flatten_dense_tensors
from torch.nn.modules.batchnorm import _BatchNorm

def f(trainer, self):
    loop = trainer.fit_loop
    trainer.fit_loop.epoch_loop._results
    trainer._signal_connector.received_sigterm
    torch._foreach_norm
    call._call_callback_hooks = None
    super()._save_checkpoint
    self._restarting, self.anything, os._exit, trainer.strategy.barrier
    """
    reads = list(engine_boundary.chain_reads(ast.parse(code), "f.py", own={"_call_callback_hooks", "_save_checkpoint"}))
    reads += engine_boundary.import_reads(ast.parse(code), "f.py")
    assert sorted(read.what for read in reads) == [
        "call._call_callback_hooks",
        "from torch._utils import _flatten_dense_tensors",
        "from torch.nn.modules.batchnorm import _BatchNorm",
        "super()._save_checkpoint",
        "torch._foreach_norm",
        "trainer._signal_connector.received_sigterm",
        "trainer.fit_loop",
        "trainer.fit_loop.epoch_loop._results",
    ]
