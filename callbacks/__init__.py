"""Callbacks of this template, selectable in a config as `class_path: callbacks.<Name>`.
Lightning's own (ModelCheckpoint, EarlyStopping, LearningRateMonitor) are wired in `configs/`;
`ExactResume`, `FiniteLossGuard`, `AugmentedBatchImages` and `ConfusionMatrixImage` are added
to every run by train.py."""

from callbacks.exact_resume import ExactResume
from callbacks.finetuning import TwoStageFinetuning
from callbacks.finite_loss import FiniteLossGuard, NonFiniteLossError
from callbacks.prediction_writer import CSVPredictionWriter
from callbacks.visual import AugmentedBatchImages, ConfusionMatrixImage, WeightHistograms

__all__ = [
    "AugmentedBatchImages",
    "CSVPredictionWriter",
    "ConfusionMatrixImage",
    "ExactResume",
    "FiniteLossGuard",
    "NonFiniteLossError",
    "TwoStageFinetuning",
    "WeightHistograms",
]
