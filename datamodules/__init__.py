from datamodules.cifar import CIFAR10DataModule
from datamodules.image_folder import ImageFolderDataModule
from datamodules.in_memory import InMemoryImageDataModule
from datamodules.mnist import FashionMNISTDataModule, MNISTDataModule
from datamodules.streaming import StreamingImageDataModule, StreamingTextDataModule
from datamodules.text import TextClassificationDataModule

__all__ = [
    "CIFAR10DataModule",
    "FashionMNISTDataModule",
    "ImageFolderDataModule",
    "InMemoryImageDataModule",
    "MNISTDataModule",
    "StreamingImageDataModule",
    "StreamingTextDataModule",
    "TextClassificationDataModule",
]
