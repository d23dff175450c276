from models.base import ClassificationModule
from models.simple_cnn import SimpleCNN

__all__ = ["ClassificationModule", "SimpleCNN"]
