from lightning_template.models.base import ClassificationModule
from lightning_template.models.resnet import ResNetClassifier
from lightning_template.models.seam import ClassifierNet
from lightning_template.models.simple_cnn import SimpleCNN
from lightning_template.models.transformer import TransformerClassifier

__all__ = ["ClassificationModule", "ClassifierNet", "ResNetClassifier", "SimpleCNN", "TransformerClassifier"]
