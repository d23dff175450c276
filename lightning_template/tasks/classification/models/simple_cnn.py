"""SimpleCNN: the classic small convnet (two 3x3 convs, max-pool, two linear layers).

Three layouts: `pool: once` (conv, conv, one max-pool: the classic Keras MNIST net), `pool: each` (a padded conv,
optional BatchNorm, ReLU and a max-pool per stage) and `pool: early` (the same stage with the max-pool right after
the convolution). Pooling after each convolution gives the second convolution a quarter of the pixels: about 3x
fewer FLOPs per image, and less memory traffic, which on a CPU matters as much. Pooling early also runs BatchNorm
and ReLU on a quarter of the pixels: those two and the pooling, which move memory without arithmetic to hide it,
are most of the rest of the step on a CPU.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from lightning_template.engine.errors import ConfigError
from lightning_template.tasks.classification.models.base import ClassificationModule
from lightning_template.tasks.classification.models.seam import ClassifierNet

Pooling = Literal["once", "each", "early"]


def conv_stack(in_channels: int, channels: tuple[int, int], pool: Pooling, batch_norm: bool) -> list[nn.Module]:
    """`once`: conv3x3 -> ReLU -> conv3x3 -> ReLU -> maxpool2.
    `each`: (conv3x3 pad 1 -> [BatchNorm] -> ReLU -> maxpool2) x 2.
    `early`: (conv3x3 pad 1 -> maxpool2 -> [BatchNorm] -> ReLU) x 2."""
    if pool == "once":
        return [nn.Conv2d(in_channels, channels[0], 3), nn.ReLU(inplace=True),
                nn.Conv2d(channels[0], channels[1], 3), nn.ReLU(inplace=True), nn.MaxPool2d(2)]  # fmt: skip
    layers: list[nn.Module] = []
    for c_in, c_out in zip((in_channels, channels[0]), channels, strict=True):
        # A conv followed by BatchNorm needs no bias: the norm's shift replaces it.
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=not batch_norm)]
        layers += [nn.MaxPool2d(2)] if pool == "early" else []
        layers += [nn.BatchNorm2d(c_out)] if batch_norm else []
        layers += [nn.ReLU(inplace=True)] + ([nn.MaxPool2d(2)] if pool == "each" else [])
    return layers


class SimpleCNNNet(ClassifierNet):
    """conv stack (see `conv_stack`) -> dropout -> FC(hidden) -> ReLU -> dropout -> FC."""

    first_conv = "features.0"

    def __init__(
        self,
        num_classes: int,
        input_shape: tuple[int, int, int],
        channels: tuple[int, int] = (32, 64),
        hidden: int = 128,
        dropout: float = 0.25,
        pool: Pooling = "once",
        batch_norm: bool = False,
    ) -> None:
        super().__init__()
        if batch_norm and pool == "once":
            raise ConfigError(
                "SimpleCNN: --model.batch_norm needs --model.pool each or early (the classic layout has none)."
            )
        self.features = nn.Sequential(
            *conv_stack(input_shape[0], channels, pool, batch_norm), nn.Dropout(dropout), nn.Flatten()
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
        pool: Pooling = "once",
        batch_norm: bool = False,
        **kwargs,
    ) -> None:
        """
        Args:
            num_classes: Number of output classes (linked from the datamodule).
            input_shape: Channels, height, width of one input image (linked from the datamodule).
            channels: Output channels of the two convolutions.
            hidden: Width of the hidden linear layer.
            dropout: Dropout after the conv stack; twice this after the hidden layer.
            pool: `once`: two convolutions, then one 2x2 max-pool (the classic layout); `each`: a padded
                convolution and a 2x2 max-pool per stage (about 3x fewer FLOPs per image); `early`: the same, with
                each max-pool right after its convolution (BatchNorm and ReLU on a quarter of the pixels).
            batch_norm: BatchNorm after each convolution (with `pool: each` or `early`).
            **kwargs: Optimizer, schedule and weights settings of `ClassificationModule`.
        """
        net = SimpleCNNNet(num_classes, tuple(input_shape), tuple(channels), hidden, dropout, pool, batch_norm)
        super().__init__(net, **kwargs)
        self.example_input_array = torch.zeros(1, *input_shape)  # one image: the summary's FLOPs and sizes
