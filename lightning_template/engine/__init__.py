"""The engine: what every run gets, whatever its LightningModule and LightningDataModule.

`train.py` (engine/cli.py) installs these callbacks in every run; a config names them as
`lightning_template.engine.<Name>`. A project does not need to edit anything in this package:
its own code is its tasks (`lightning_template/tasks/`), and `copier update` keeps this package current.

The names are imported when first asked for (PEP 562's module `__getattr__`): `engine.errors`, which code without
torch may raise (a server of exported files), is imported without torch and Lightning.
"""

import importlib
from typing import Any

_WHERE = {
    "CSVPredictionWriter": "predictions",
    "CheckpointFacts": "checkpoint",
    "EpochMetrics": "epoch_metrics",
    "ExactResume": "resume",
    "FiniteLossGuard": "finite_loss",
    "GracefulStop": "stopping",
    "NonFiniteLossError": "finite_loss",
    "ProcessGroupTeardown": "process_group",
    "ResumableBatches": "batches",
    "ResumeCheckpoint": "resume",
    "ThawedParameterSync": "process_group",
    "UnsavedState": "unsaved_state",
    "exact_resume": "resume",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
