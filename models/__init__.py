from models.base import ClassificationModule
from models.resnet import ResNetClassifier
from models.simple_cnn import SimpleCNN
from models.transformer import TransformerClassifier

__all__ = ["ClassificationModule", "ResNetClassifier", "SimpleCNN", "TransformerClassifier"]
