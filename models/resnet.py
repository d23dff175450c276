"""ResNet fine-tuning: a torchvision ResNet backbone with a new linear head.

The network is `backbone` (everything up to the pooled features) followed by
`head` (one linear layer). `callbacks.TwoStageFinetuning` relies on exactly this
seam: it freezes `backbone`, trains `head`, then unfreezes `backbone` with a
smaller learning rate.

Weights come from a torchvision weights name (downloaded, needs a network) or from
a local file: a torchvision-style state dict (`resnet18-f37072fd.pth`) or a
checkpoint of an earlier run of this template (its backbone is reused).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

import torch
import torchvision
from torch import nn

from models.base import ClassificationModule

ResNetName = Literal["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]


class WeightsError(ValueError):
    """A weights file or name that cannot be used for this backbone."""


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Backbone tensors from a torchvision state dict or from one of our checkpoints."""
    if not path.is_file():
        raise WeightsError(f"--model.weights {path}: file not found. Give a state dict (.pth) or a checkpoint (.ckpt).")
    try:
        # weights_only: a file from elsewhere must not be able to run code when loaded.
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise WeightsError(f"--model.weights {path}: not a readable torch file ({err}).") from err
    if isinstance(data, dict) and "state_dict" in data:  # a Lightning checkpoint of this template
        prefix = "net.backbone."
        return {k.removeprefix(prefix): v for k, v in data["state_dict"].items() if k.startswith(prefix)}
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise WeightsError(f"--model.weights {path}: expected a state dict (name -> tensor) or a checkpoint.")
    return {k.removeprefix("module."): v for k, v in data.items() if not k.startswith("fc.")}


def _adapt_input_channels(state: dict[str, torch.Tensor], in_channels: int) -> dict[str, torch.Tensor]:
    """RGB conv1 weights used on grayscale input: summing over the colour channels keeps the
    response to a gray image (R = G = B) identical."""
    weight = state.get("conv1.weight")
    if weight is not None and weight.shape[1] == 3 and in_channels == 1:
        state = {**state, "conv1.weight": weight.sum(dim=1, keepdim=True)}
    return state


def load_backbone_weights(backbone: nn.Module, path: Path, in_channels: int) -> None:
    state = _adapt_input_channels(_read_state_dict(path), in_channels)
    expected = backbone.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or unexpected or mismatched:
        details = [f"missing keys: {missing[:10]}"] if missing else []
        details += [f"unexpected keys: {unexpected[:10]}"] if unexpected else []
        details += [f"shape mismatches: {mismatched[:10]}"] if mismatched else []
        raise WeightsError(
            f"--model.weights {path} does not fit this backbone ({len(missing)} missing, {len(unexpected)} unexpected,"
            f" {len(mismatched)} mismatched).\n  " + "\n  ".join(details) + "\n"
            "Check that --model.arch and the input channels match the network that produced the file."
        )
    backbone.load_state_dict(state)


def build_backbone(arch: ResNetName, in_channels: int, weights: str | None) -> tuple[nn.Module, int]:
    """A torchvision ResNet without its classifier; returns (backbone, feature width)."""
    is_file = weights is not None and (Path(weights).suffix in {".pth", ".pt", ".ckpt"} or Path(weights).exists())
    torchvision_weights = None if weights is None or is_file else weights
    try:
        resnet = torchvision.models.get_model(arch, weights=torchvision_weights)
    except (ValueError, KeyError) as err:
        raise WeightsError(f"--model.weights {weights!r}: {err}. Use e.g. DEFAULT, IMAGENET1K_V1 or a file.") from err
    except Exception as err:  # URLError, timeouts, ...: the download needs a network
        raise WeightsError(
            f"--model.weights {weights}: downloading torchvision's {arch} weights failed ({err}).\n"
            f"Offline? Download the .pth elsewhere and pass its path: --model.weights path/to/{arch}.pth"
        ) from err
    if in_channels != 3:
        conv1 = resnet.conv1
        new_conv1 = nn.Conv2d(
            in_channels, conv1.out_channels, conv1.kernel_size, conv1.stride, conv1.padding, bias=False
        )
        if torchvision_weights is not None and in_channels == 1:
            new_conv1.weight.data.copy_(conv1.weight.data.sum(dim=1, keepdim=True))
        resnet.conv1 = new_conv1
    features = resnet.fc.in_features
    resnet.fc = nn.Identity()
    if is_file:
        load_backbone_weights(resnet, Path(weights), in_channels)
    return resnet, features


class ResNetClassifier(ClassificationModule):
    def __init__(
        self,
        num_classes: int = 10,
        input_shape: tuple[int, int, int] = (3, 224, 224),
        arch: ResNetName = "resnet18",
        weights: str | None = None,
        head_dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            num_classes: Number of output classes (linked from the datamodule).
            input_shape: Channels, height, width of the input (linked from the datamodule); 1 channel
                is supported, pretrained conv1 weights are summed over RGB.
            arch: Which torchvision ResNet.
            weights: None (random init), a torchvision weights name such as DEFAULT or IMAGENET1K_V1
                (downloaded), or a local file: a state dict or a checkpoint of an earlier run.
            head_dropout: Dropout before the new linear head.
            **kwargs: Optimizer and schedule settings of `ClassificationModule`.
        """
        super().__init__(num_classes=num_classes, **kwargs)
        backbone, features = build_backbone(arch, input_shape[0], weights)
        head = nn.Sequential(nn.Dropout(head_dropout), nn.Linear(features, num_classes))
        self.net = nn.Sequential(OrderedDict(backbone=backbone, head=head))

    @property
    def backbone(self) -> nn.Module:
        return self.net.backbone

    @property
    def head(self) -> nn.Module:
        return self.net.head

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images)

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(features)

    def parameter_groups(self) -> list[dict[str, Any]]:
        """`head`, and `backbone` unless it is frozen (then `TwoStageFinetuning` adds it later)."""
        groups = [{"params": list(self.head.parameters()), "name": "head"}]
        backbone = [p for p in self.backbone.parameters() if p.requires_grad]
        if backbone:
            groups.append({"params": backbone, "name": "backbone"})
        return groups
