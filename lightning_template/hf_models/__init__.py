"""Any Hugging Face encoder as a text classifier of this project:
`--model lightning_template.hf_models.HFClassifier --model.backbone path/to/folder
--data lightning_template.hf_models.HFTextDataModule --data.tokenizer path/to/folder`
(`configs/hf_fortunes.yaml`), and a small encoder pretrained here to give it (`configs/hf_pretrain.yaml`). Configs
name its classes as `lightning_template.hf_models.<Name>`."""

from lightning_template.hf_models.data import HFTextDataModule
from lightning_template.hf_models.model import HFClassifier, HFNet
from lightning_template.hf_models.pretraining import MaskedLMPretraining, MaskedTextDataModule

__all__ = ["HFClassifier", "HFNet", "HFTextDataModule", "MaskedLMPretraining", "MaskedTextDataModule"]
