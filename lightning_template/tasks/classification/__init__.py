"""Classification: SimpleCNN, a transformer on text tokens or image patches, ResNet fine-tuning, their datamodules
and callbacks. Configs name them as `lightning_template.tasks.classification.<Name>`."""

from lightning_template.tasks.classification.callbacks.finetuning import TwoStageFinetuning
from lightning_template.tasks.classification.callbacks.visual import (
    AugmentedBatchImages,
    ConfusionMatrixImage,
    WeightHistograms,
)
from lightning_template.tasks.classification.data.cifar import CIFAR10DataModule
from lightning_template.tasks.classification.data.image_folder import ImageFolderDataModule
from lightning_template.tasks.classification.data.in_memory import InMemoryImageDataModule
from lightning_template.tasks.classification.data.mnist import FashionMNISTDataModule, MNISTDataModule
from lightning_template.tasks.classification.data.text import TextClassificationDataModule
from lightning_template.tasks.classification.models.base import ClassificationModule
from lightning_template.tasks.classification.models.resnet import ResNetClassifier
from lightning_template.tasks.classification.models.seam import ClassifierNet
from lightning_template.tasks.classification.models.simple_cnn import SimpleCNN
from lightning_template.tasks.classification.models.transformer import TransformerClassifier

__all__ = [
    "AugmentedBatchImages",
    "CIFAR10DataModule",
    "ClassificationModule",
    "ClassifierNet",
    "ConfusionMatrixImage",
    "FashionMNISTDataModule",
    "ImageFolderDataModule",
    "InMemoryImageDataModule",
    "MNISTDataModule",
    "ResNetClassifier",
    "SimpleCNN",
    "TextClassificationDataModule",
    "TransformerClassifier",
    "TwoStageFinetuning",
    "WeightHistograms",
]
