from models.base import ClassificationModule
from models.resnet import ResNetClassifier
from models.simple_cnn import SimpleCNN

__all__ = ["ClassificationModule", "ResNetClassifier", "SimpleCNN"]
