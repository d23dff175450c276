"""A decoder-only language model on real text (Debian's fortunes), over BPE subwords or characters, trained by Muon
and AdamW: `configs/language_model.yaml`. Configs name its classes as
`lightning_template.tasks.language_model.<Name>`."""

from lightning_template.tasks.language_model.data import FortunesDataModule
from lightning_template.tasks.language_model.model import LanguageModel
from lightning_template.tasks.language_model.muon import MuonAdamW

__all__ = ["FortunesDataModule", "LanguageModel", "MuonAdamW"]
