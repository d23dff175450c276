"""Any timm backbone as a classifier of this project: `--model lightning_template.timm_models.TimmClassifier
--model.backbone convnext_atto` (`configs/timm_finetune.yaml`). Configs name its classes as
`lightning_template.timm_models.<Name>`."""

from lightning_template.timm_models.model import TimmClassifier, TimmNet

__all__ = ["TimmClassifier", "TimmNet"]
