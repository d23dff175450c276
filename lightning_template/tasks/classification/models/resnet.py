"""ResNet fine-tuning: a torchvision ResNet whose classifier is replaced for your classes.

The network keeps torchvision's layer names (`conv1`, `bn1`, `layer1`..`layer4`, `fc`), so
torchvision's weight files load as they are. `--model.weights` takes a torchvision weights
name (`DEFAULT`, `IMAGENET1K_V1`; downloaded, needs a network) or a local file: torchvision's
`.pth` (e.g. `resnet18-f37072fd.pth`) or a checkpoint of an earlier run (see
`lightning_template.tasks.classification.models.pretrained`).
`lightning_template.tasks.classification.TwoStageFinetuning` then trains the new `fc` on the frozen rest,
and unfreezes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
import torchvision
from torch import nn

from lightning_template.tasks.classification.models.base import ClassificationModule
from lightning_template.tasks.classification.models.pretrained import WeightsError, load_pretrained
from lightning_template.tasks.classification.models.seam import ClassifierNet

ResNetName = Literal["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]


class ResNetNet(ClassifierNet):
    first_conv = "conv1"

    def __init__(self, arch: ResNetName, input_shape: tuple[int, int, int], num_classes: int, dropout: float) -> None:
        super().__init__()
        resnet = torchvision.models.get_model(arch)
        if input_shape[0] != 3:
            old = resnet.conv1
            resnet.conv1 = nn.Conv2d(
                input_shape[0], old.out_channels, old.kernel_size, old.stride, old.padding, bias=False
            )
        for name, module in resnet.named_children():
            if name not in {"avgpool", "fc"}:
                self.add_module(name, module)
        self.head_drop = nn.Dropout(dropout)
        self.fc = nn.Linear(resnet.fc.in_features, num_classes)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return x.mean(dim=(2, 3))  # global average pooling, any input size

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        features = self.head_drop(features)
        return features if pre_logits else self.fc(features)


def torchvision_state_dict(arch: ResNetName, name: str) -> dict[str, torch.Tensor]:
    """torchvision's weights `name` for `arch` (downloaded once into torch's cache)."""
    try:
        return torchvision.models.get_model_weights(arch)[name].get_state_dict(progress=False)
    except KeyError as err:
        raise WeightsError(
            f"--model.weights {name!r}: not a weights name of {arch} nor an existing file."
            " Use e.g. DEFAULT, IMAGENET1K_V1 or the path of a .pth/.ckpt file."
        ) from err
    except Exception as err:  # URLError, timeouts, ...: the download needs a network
        raise WeightsError(
            f"--model.weights {name}: downloading torchvision's {arch} weights failed ({err}).\n"
            f"Offline? Download the .pth elsewhere and pass its path: --model.weights path/to/{arch}.pth"
        ) from err


class ResNetClassifier(ClassificationModule):
    def __init__(
        self,
        num_classes: int = 10,
        input_shape: tuple[int, int, int] = (3, 224, 224),
        arch: ResNetName = "resnet18",
        head_dropout: float = 0.0,
        weights: str | None = None,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            num_classes: Number of output classes (linked from the datamodule).
            input_shape: Channels, height, width of the input (linked from the datamodule); any channel count,
                pretrained conv1 kernels are adapted (summed over RGB for grayscale).
            arch: Which torchvision ResNet.
            head_dropout: Dropout before the new classifier.
            weights: Start from trained weights: a torchvision weights name of `arch` (DEFAULT, IMAGENET1K_V1;
                downloaded, needs a network), torchvision's .pth file, a state dict or a checkpoint of any run of
                this project (everything but the classifier is loaded; conv1 is adapted to the channel count).
            **kwargs: Optimizer and schedule settings of `ClassificationModule`.
        """
        # `weights` is declared here, not left to **kwargs: its help (--model.help) must name what ResNet accepts.
        net = ResNetNet(arch, tuple(input_shape), num_classes, head_dropout)
        super().__init__(net, weights=weights, **kwargs)
        self.example_input_array = torch.zeros(1, *input_shape)  # one image: the summary's FLOPs and sizes

    def load_weights(self, weights: str) -> None:
        if Path(weights).suffix in {".pth", ".pt", ".ckpt"} or Path(weights).exists():
            super().load_weights(weights)
        else:
            load_pretrained(self.net, torchvision_state_dict(self.hparams.arch, weights), weights)
