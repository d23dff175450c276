"""Any Hugging Face encoder as a text classifier of this project: `--model lightning_template.hf_models.HFClassifier
--model.backbone path/to/folder --data lightning_template.hf_models.HFTextDataModule --data.tokenizer path/to/folder`
(`configs/hf_fortunes.yaml`). Configs name its classes as `lightning_template.hf_models.<Name>`."""

from lightning_template.hf_models.data import HFTextDataModule
from lightning_template.hf_models.model import HFClassifier, HFNet

__all__ = ["HFClassifier", "HFNet", "HFTextDataModule"]
