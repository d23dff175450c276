"""SimpleCNN: the classic small convnet (two 3x3 convs, max-pool, two linear layers)."""

from __future__ import annotations

import torch
from torch import nn

from lightning_template.models.base import ClassificationModule
from lightning_template.models.seam import ClassifierNet


class SimpleCNNNet(ClassifierNet):
    """conv3x3(32) -> ReLU -> conv3x3(64) -> ReLU -> maxpool2 -> dropout -> FC(hidden) -> ReLU -> dropout -> FC."""

    first_conv = "features.0"

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, int, int],
        channels: tuple[int, int] = (32, 64),
        hidden: int = 128,
        dropout: float = 0.25,
    ) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(input_shape[0], channels[0], 3),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels[0], channels[1], 3),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Dropout(dropout),
            nn.Flatten(),
        )
        # Run one dummy image through the conv stack instead of hand-computing the
        # flatten size, so 1x28x28, 3x32x32 or any other input size just works.
        with torch.no_grad():
            flat_features = self.features(torch.zeros(1, *input_shape)).shape[1]
        self.pre_logits = nn.Sequential(
            nn.Linear(flat_features, hidden), nn.ReLU(inplace=True), nn.Dropout(2 * dropout)
        )
        self.fc = nn.Linear(hidden, num_classes)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        return self.features(images)

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        features = self.pre_logits(features)
        return features if pre_logits else self.fc(features)


class SimpleCNN(ClassificationModule):
    def __init__(
        self,
        num_classes: int = 10,
        input_shape: tuple[int, int, int] = (1, 28, 28),
        channels: tuple[int, int] = (32, 64),
        hidden: int = 128,
        dropout: float = 0.25,
        **kwargs,
    ) -> None:
        """
        Args:
            num_classes: Number of output classes (linked from the datamodule).
            input_shape: Channels, height, width of one input image (linked from the datamodule).
            channels: Output channels of the two convolutions.
            hidden: Width of the hidden linear layer.
            dropout: Dropout after the conv stack; twice this after the hidden layer.
            **kwargs: Optimizer, schedule and weights settings of `ClassificationModule`.
        """
        super().__init__(SimpleCNNNet(num_classes, tuple(input_shape), tuple(channels), hidden, dropout), **kwargs)
