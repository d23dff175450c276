"""Callbacks of this template, selectable in a config as `class_path: lightning_template.callbacks.<Name>`.

train.py installs in every run (`installed_callbacks`): `ExactResume`, `ResumeCheckpoint`, `CheckpointFacts`,
`FiniteLossGuard`, `ProcessGroupTeardown`, `AugmentedBatchImages`, `ConfusionMatrixImage`, Lightning's
`LearningRateMonitor` and a progress bar (console.py); and, configurable as flags,
Lightning's best-epoch `ModelCheckpoint` and `EarlyStopping` and the `CSVPredictionWriter` of `predict`."""

from lightning_template.callbacks.checkpoint_facts import CheckpointFacts
from lightning_template.callbacks.finetuning import TwoStageFinetuning
from lightning_template.callbacks.finite_loss import FiniteLossGuard, NonFiniteLossError
from lightning_template.callbacks.prediction_writer import CSVPredictionWriter
from lightning_template.callbacks.process_group import ProcessGroupTeardown
from lightning_template.callbacks.visual import AugmentedBatchImages, ConfusionMatrixImage, WeightHistograms
from lightning_template.resume import ExactResume, ResumeCheckpoint

__all__ = [
    "AugmentedBatchImages",
    "CSVPredictionWriter",
    "CheckpointFacts",
    "ConfusionMatrixImage",
    "ExactResume",
    "FiniteLossGuard",
    "NonFiniteLossError",
    "ProcessGroupTeardown",
    "ResumeCheckpoint",
    "TwoStageFinetuning",
    "WeightHistograms",
]
