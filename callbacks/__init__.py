"""Callbacks of this template, selectable in a config as `class_path: callbacks.<Name>`.

train.py installs in every run (`installed_callbacks`): `ExactResume`, `ResumeCheckpoint`, `TrackerRun`,
`ServingSpec`, `FiniteLossGuard`, `ProcessGroupTeardown`, `AugmentedBatchImages`, `ConfusionMatrixImage`, Lightning's
`LearningRateMonitor` and a progress bar (callbacks/console.py); and, configurable as flags, Lightning's
best-epoch `ModelCheckpoint` and `EarlyStopping` and the `CSVPredictionWriter` of `predict`."""

from callbacks.averaging import EMAWeightAveraging, SWAWeightAveraging
from callbacks.batch_size import FitBatchSizeFinder
from callbacks.exact_resume import ExactResume, ResumeCheckpoint
from callbacks.finetuning import TwoStageFinetuning
from callbacks.finite_loss import FiniteLossGuard, NonFiniteLossError
from callbacks.lr_finder import LRFinder
from callbacks.prediction_writer import CSVPredictionWriter
from callbacks.process_group import ProcessGroupTeardown
from callbacks.serving_spec import ServingSpec
from callbacks.visual import AugmentedBatchImages, ConfusionMatrixImage, WeightHistograms

__all__ = [
    "AugmentedBatchImages",
    "CSVPredictionWriter",
    "ConfusionMatrixImage",
    "EMAWeightAveraging",
    "ExactResume",
    "FiniteLossGuard",
    "FitBatchSizeFinder",
    "LRFinder",
    "NonFiniteLossError",
    "ProcessGroupTeardown",
    "ResumeCheckpoint",
    "SWAWeightAveraging",
    "ServingSpec",
    "TwoStageFinetuning",
    "WeightHistograms",
]
