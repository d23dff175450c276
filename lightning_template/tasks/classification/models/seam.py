"""The one seam every network of this project has (timm's model interface).

    inputs -> forward_features -> features -> forward_head -> logits
                                                  (pre_logits=True stops before the classifier)

The classifier is one `nn.Linear` attribute named `classifier_name`. Fine-tuning
(`callbacks/finetuning.py`'s `TwoStageFinetuning`) freezes everything but `get_classifier()`; reusing a
trained network on new classes loads everything but the classifier (`models/pretrained.py`;
`reset_classifier(n)` does the same for a network in hand); weight decay skips what
`no_weight_decay()` names; `backbone_parameters()` is what stage 2 of fine-tuning unfreezes.
"""

from __future__ import annotations

import torch
from torch import nn


class ClassifierNet(nn.Module):
    classifier_name: str = "fc"
    first_conv: str = ""  # the input layer whose kernels are adapted to another channel count

    def forward_features(self, inputs: torch.Tensor) -> torch.Tensor:
        """Inputs -> one feature vector per sample [batch, features]."""
        raise NotImplementedError

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Feature vectors -> logits (or, with `pre_logits`, what the classifier receives)."""
        raise NotImplementedError

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(inputs))

    def get_classifier(self) -> nn.Linear:
        return getattr(self, self.classifier_name)

    def reset_classifier(self, num_classes: int) -> None:
        """A freshly initialized classifier for `num_classes` classes."""
        old = self.get_classifier()
        setattr(self, self.classifier_name, nn.Linear(old.in_features, num_classes).to(old.weight.device))

    def backbone_parameters(self) -> list[nn.Parameter]:
        """What fine-tuning trains besides the classifier: every other parameter, or an adapter's alone (its
        frozen base stays frozen). `TwoStageFinetuning` freezes them in stage 1 and unfreezes them in stage 2."""
        classifier = {id(p) for p in self.get_classifier().parameters()}
        return [p for p in self.parameters() if id(p) not in classifier]

    def merged(self) -> ClassifierNet:
        """The network as deployed for inference outside Lightning: itself; a network trained through adapters
        returns a copy with them merged into the weights they adapt (the same function, no adapter left)."""
        return self

    def no_weight_decay(self) -> set[str]:
        """Names of parameters that must not decay although they are matrices (embeddings, positions)."""
        return set()
