"""Training tools: weight averaging (EMA, SWA), the batch-size finder and the learning-rate finder."""

from lightning_template.tools.averaging import EMAWeightAveraging, SWAWeightAveraging
from lightning_template.tools.batch_size import FitBatchSizeFinder
from lightning_template.tools.lr_finder import LRFinder

__all__ = ["EMAWeightAveraging", "FitBatchSizeFinder", "LRFinder", "SWAWeightAveraging"]
