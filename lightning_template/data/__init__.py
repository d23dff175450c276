from lightning_template.data.cifar import CIFAR10DataModule
from lightning_template.data.image_folder import ImageFolderDataModule
from lightning_template.data.in_memory import InMemoryImageDataModule
from lightning_template.data.mnist import FashionMNISTDataModule, MNISTDataModule
from lightning_template.data.text import TextClassificationDataModule

__all__ = [
    "CIFAR10DataModule",
    "FashionMNISTDataModule",
    "ImageFolderDataModule",
    "InMemoryImageDataModule",
    "MNISTDataModule",
    "TextClassificationDataModule",
]
