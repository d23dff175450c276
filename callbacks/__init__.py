"""Callbacks of this template, selectable in a config as `class_path: callbacks.<Name>`.

train.py installs `ExactResume`, `ResumeCheckpoint`, `FiniteLossGuard`, `AugmentedBatchImages`,
`ConfusionMatrixImage`, `ServingSpec` and `CSVPredictionWriter` in every run, next to Lightning's best-epoch
`ModelCheckpoint`, `EarlyStopping` and `LearningRateMonitor`."""

from callbacks.averaging import SWAWeightAveraging
from callbacks.batch_size import FitBatchSizeFinder
from callbacks.exact_resume import ExactResume, ResumeCheckpoint
from callbacks.finetuning import TwoStageFinetuning
from callbacks.finite_loss import FiniteLossGuard, NonFiniteLossError
from callbacks.lr_finder import LRFinder
from callbacks.prediction_writer import CSVPredictionWriter
from callbacks.serving_spec import ServingSpec
from callbacks.visual import AugmentedBatchImages, ConfusionMatrixImage, WeightHistograms

__all__ = [
    "AugmentedBatchImages",
    "CSVPredictionWriter",
    "ConfusionMatrixImage",
    "ExactResume",
    "FiniteLossGuard",
    "FitBatchSizeFinder",
    "LRFinder",
    "NonFiniteLossError",
    "ResumeCheckpoint",
    "SWAWeightAveraging",
    "ServingSpec",
    "TwoStageFinetuning",
    "WeightHistograms",
]
