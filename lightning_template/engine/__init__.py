"""The engine: what every run gets, whatever its LightningModule and LightningDataModule.

`train.py` (engine/cli.py) installs these callbacks in every run; a config names them as
`lightning_template.engine.<Name>`. A project does not need to edit anything in this package:
its own code is its tasks (`lightning_template/tasks/`), and `copier update` keeps this package current.
"""

from lightning_template.engine.checkpoint_facts import CheckpointFacts
from lightning_template.engine.finite_loss import FiniteLossGuard, NonFiniteLossError
from lightning_template.engine.predictions import CSVPredictionWriter
from lightning_template.engine.process_group import ProcessGroupTeardown
from lightning_template.engine.resume import ExactResume, ResumeCheckpoint

__all__ = [
    "CSVPredictionWriter",
    "CheckpointFacts",
    "ExactResume",
    "FiniteLossGuard",
    "NonFiniteLossError",
    "ProcessGroupTeardown",
    "ResumeCheckpoint",
]
