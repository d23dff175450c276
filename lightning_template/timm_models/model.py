"""Any timm model as the network of a classifier: its head replaced for the data's classes, its input for the data's
channels and size, two-stage fine-tuned like every model here.

timm's interface is the project's network seam (`tasks/classification/models/seam.py`): `TimmNet` answers it with
timm's own `get_classifier`, `reset_classifier`, `forward_features` and `forward_head`, so `TwoStageFinetuning`
freezes everything but `get_classifier()` in every family: BatchNorm (kept in eval), LayerNorm, class tokens and
position embeddings alike. The parameters keep timm's names after `model.`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lightning_template.engine.errors import ConfigError
from lightning_template.tasks.classification.models.base import ClassificationModule
from lightning_template.tasks.classification.models.seam import ClassifierNet
from lightning_template.timm_models.weights import build, check_backbone, fixed_input_size


class TimmNet(ClassifierNet):
    def __init__(self, model: nn.Module, img_size: tuple[int, int] | None = None) -> None:
        """`model`: a timm model whose classifier (`get_classifier()`) is one nn.Linear; `img_size`: resize inputs
        of another size to it first."""
        super().__init__()
        self.model = model
        self.img_size = img_size
        classifier = model.get_classifier()
        if not isinstance(classifier, nn.Linear):
            raise ConfigError(
                f"--model.backbone {model.pretrained_cfg.get('architecture')}: its classifier is"
                f" {type(classifier).__name__}, not one nn.Linear; TimmClassifier takes the families whose"
                " get_classifier() is one (ResNet, ConvNeXt, ViT, EfficientNet, RegNet, Swin, ...)."
            )
        self.classifier_name = "model." + next(name for name, module in model.named_modules() if module is classifier)
        first_conv = model.pretrained_cfg.get("first_conv")
        self.first_conv = f"model.{first_conv}" if isinstance(first_conv, str) else ""

    def forward_features(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.img_size is not None and tuple(inputs.shape[-2:]) != self.img_size:
            inputs = F.interpolate(inputs, size=self.img_size, mode="bilinear", align_corners=False, antialias=True)
        # timm's head pools (and, in ConvNeXt and ViT, normalizes) before the classifier: all of it is features here.
        return self.model.forward_head(self.model.forward_features(inputs), pre_logits=True)

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return features if pre_logits else self.get_classifier()(features)

    def get_classifier(self) -> nn.Linear:
        return self.model.get_classifier()

    def reset_classifier(self, num_classes: int) -> None:
        self.model.reset_classifier(num_classes)

    def no_weight_decay(self) -> set[str]:
        exempt = getattr(self.model, "no_weight_decay", None)  # ViT: pos_embed, cls_token
        return {f"model.{name}" for name in exempt()} if callable(exempt) else set()


class TimmClassifier(ClassificationModule):
    def __init__(
        self,
        num_classes: int = 10,
        input_shape: tuple[int, int, int] = (3, 224, 224),
        backbone: str = "resnet18",
        weights: str | None = None,
        img_size: int | None = None,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        model_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            num_classes: Number of output classes (linked from the datamodule).
            input_shape: Channels, height, width of the input (linked from the datamodule); any channel count
                (timm's `in_chans`: trained first-layer kernels are adapted, summed over RGB for grayscale).
            backbone: Any timm model, with or without a pretrained tag: resnet18, convnext_atto, vit_tiny_patch16_224,
                convnext_atto.d2_in1k (`timm.list_models()` lists them). Its classifier is replaced for num_classes.
            weights: Start from trained weights: `timm` (or `pretrained`) for timm's own from the Hugging Face Hub
                (downloaded once into its cache; offline, give the file), or a local file: timm's .safetensors or
                .pth, a folder timm's save_for_hf wrote, a checkpoint of an earlier run. Everything but the
                classifier is loaded, strictly; a ViT's position embeddings follow the image size.
            img_size: The side the network works at: inputs of another size are resized to it inside the network
                (so does the exported network); None: the data's. Families with a fixed input size (ViT, Swin) are
                built for it (timm's img_size); the others need enough pixels for their stride (ConvNeXt: 32).
            drop_rate: Dropout before the classifier (timm's drop_rate).
            drop_path_rate: Stochastic depth (timm's drop_path_rate), in the families that have it.
            model_kwargs: More arguments of timm.create_model, e.g. {patch_size: 8} for a ViT on small images.
            **kwargs: Optimizer and schedule settings of `ClassificationModule`.
        """
        check_backbone(backbone)
        size = (img_size, img_size) if img_size else (input_shape[1], input_shape[2])
        options = dict(model_kwargs or {})
        options |= {"drop_rate": drop_rate} if drop_rate else {}
        options |= {"drop_path_rate": drop_path_rate} if drop_path_rate else {}
        options |= {"img_size": size} if fixed_input_size(backbone) else {}
        model = build(backbone, weights, num_classes, input_shape[0], **options)
        super().__init__(TimmNet(model, size if img_size else None), weights=weights, **kwargs)
        self.example_input_array = torch.zeros(1, *input_shape)  # one image: the summary's FLOPs and sizes

    def load_weights(self, weights: str) -> None:
        """Nothing left to load: timm built the network from `weights` (`weights.build`)."""
