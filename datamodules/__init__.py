from datamodules.in_memory import InMemoryImageDataModule
from datamodules.mnist import FashionMNISTDataModule, MNISTDataModule

__all__ = ["FashionMNISTDataModule", "InMemoryImageDataModule", "MNISTDataModule"]
