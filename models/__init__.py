from models.base import ClassificationModule
from models.resnet import ResNetClassifier
from models.seam import ClassifierNet
from models.simple_cnn import SimpleCNN
from models.transformer import TransformerClassifier

__all__ = ["ClassificationModule", "ClassifierNet", "ResNetClassifier", "SimpleCNN", "TransformerClassifier"]
