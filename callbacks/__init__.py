"""Callbacks of this template, selectable in a config as `class_path: callbacks.<Name>`.
Lightning's own (ModelCheckpoint, EarlyStopping, LearningRateMonitor) are wired in `configs/`."""

from callbacks.finetuning import TwoStageFinetuning
from callbacks.prediction_writer import CSVPredictionWriter

__all__ = ["CSVPredictionWriter", "TwoStageFinetuning"]
