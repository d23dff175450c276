"""Classification: SimpleCNN, a transformer on text tokens or image patches, ResNet fine-tuning, their datamodules
and callbacks. Configs name them as `lightning_template.tasks.classification.<Name>`.

The names are imported when first asked for (PEP 562's module `__getattr__`), not with the package: a module of
it that needs no torch (`input_spec.py`, which a server of the model's exported files can read) stays torch-free.
"""

import importlib
from typing import Any

_WHERE = {
    "TwoStageFinetuning": "callbacks.finetuning",
    "AugmentedBatchImages": "callbacks.visual",
    "ConfusionMatrixImage": "callbacks.visual",
    "WeightHistograms": "callbacks.visual",
    "CIFAR10DataModule": "data.cifar",
    "ImageFolderDataModule": "data.image_folder",
    "InMemoryImageDataModule": "data.in_memory",
    "FashionMNISTDataModule": "data.mnist",
    "MNISTDataModule": "data.mnist",
    "TextClassificationDataModule": "data.text",
    "ClassificationModule": "models.base",
    "ResNetClassifier": "models.resnet",
    "ClassifierNet": "models.seam",
    "SimpleCNN": "models.simple_cnn",
    "TransformerClassifier": "models.transformer",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
