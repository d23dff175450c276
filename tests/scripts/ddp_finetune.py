"""Two CPU processes (gloo) fine-tune a ResNet through the unfreeze point; each rank saves its weights.

Run by tests/test_finetuning.py: python ddp_finetune.py OUT_DIR [--without-backbone-sync]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from lightning import Trainer, seed_everything

from callbacks import TwoStageFinetuning
from datamodules import FashionMNISTDataModule
from models import ResNetClassifier


def main() -> None:
    out_dir = Path(sys.argv[1])
    if "--without-backbone-sync" in sys.argv:  # reproduces DDP's drift, to show the check can fail
        TwoStageFinetuning.on_before_optimizer_step = lambda *args: None
    seed_everything(0)
    model = ResNetClassifier(num_classes=10, input_shape=(1, 28, 28), lr=0.01, schedule="constant")
    initial_backbone = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, limit_train_batches=3, limit_val_batches=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[TwoStageFinetuning(unfreeze_at_epoch=1)],
    )  # fmt: skip
    trainer.fit(model, datamodule=FashionMNISTDataModule(batch_size=16))
    torch.save(
        {
            "initial_backbone": initial_backbone,
            "state": model.state_dict(),
            "groups": [g["name"] for g in trainer.optimizers[0].param_groups],
        },
        out_dir / f"rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main()
