"""Data beyond RAM: datamodules that stream LitData chunks (local or object storage), and convert.py."""

from lightning_template.streaming.datamodules import StreamingImageDataModule, StreamingTextDataModule

__all__ = ["StreamingImageDataModule", "StreamingTextDataModule"]
