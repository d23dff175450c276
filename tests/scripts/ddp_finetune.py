"""Two CPU processes (gloo) fine-tune SimpleCNN through the unfreeze point; each rank saves its weights.

Run by tests/test_finetuning.py: python ddp_finetune.py OUT_DIR WEIGHTS [--without-backbone-sync] [--fp16-inf]
--fp16-inf: fp16 autocast with loss scaling, and an inf planted in rank 1's backbone gradient at one step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from lightning import Callback, Trainer, seed_everything
from lightning.pytorch.plugins import MixedPrecision

from lightning_template.engine import ProcessGroupTeardown, ThawedParameterSync
from lightning_template.tasks.classification import FashionMNISTDataModule, SimpleCNN, TwoStageFinetuning

INF_AT_STEP = 4  # after unfreezing (epoch 1 starts at step 3)


class InfInRankOneBackbone(Callback):
    """An overflow on one rank only, as fp16 produces now and then."""

    def __init__(self) -> None:
        self.scales: list[float] = []

    def on_after_backward(self, trainer: Trainer, pl_module) -> None:
        if trainer.global_rank == 1 and trainer.global_step == INF_AT_STEP:
            pl_module.net.features[0].weight.grad[0, 0, 0, 0] = float("inf")

    def on_train_batch_end(self, trainer: Trainer, *args) -> None:
        self.scales.append(trainer.precision_plugin.scaler.get_scale())


def main() -> None:
    torch.set_num_threads(1)
    out_dir, weights = Path(sys.argv[1]), sys.argv[2]
    sync = [ThawedParameterSync()]
    if "--without-backbone-sync" in sys.argv:  # DDP's drift, to show the check can fail
        ThawedParameterSync.on_after_backward = lambda *args: None
    fp16 = "--fp16-inf" in sys.argv
    seed_everything(0)
    model = SimpleCNN(weights=weights, optimizer=torch.optim.SGD, schedule="constant")
    initial = {k: v.clone() for k, v in model.net.state_dict().items()}
    extra = [InfInRankOneBackbone()] if fp16 else []
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, limit_train_batches=3, limit_val_batches=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        plugins=[MixedPrecision("16-mixed", "cpu")] if fp16 else None,
        # The overflow planted before the sync averages it, as a backward pass would make it.
        callbacks=[*extra, *sync, TwoStageFinetuning(unfreeze_at_epoch=1), ProcessGroupTeardown()],
    )  # fmt: skip
    trainer.fit(model, datamodule=FashionMNISTDataModule(batch_size=16))
    torch.save(
        {
            "initial": initial,
            "state": model.net.state_dict(),
            "groups": [g["name"] for g in trainer.optimizers[0].param_groups],
            "scales": extra[0].scales if extra else [],
        },
        out_dir / f"rank{trainer.global_rank}.pt",
    )


if __name__ == "__main__":
    main()
