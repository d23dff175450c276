"""Training behaviour through the real Trainer on real Fashion-MNIST, kept to a few batches."""

from __future__ import annotations

from pathlib import Path

import torch
from lightning import Trainer, seed_everything
from lightning.pytorch.callbacks import EarlyStopping

from datamodules import FashionMNISTDataModule
from models import SimpleCNN


def _fit(tmp_path: Path, seed: int, callbacks=(), max_epochs: int = 1, **model_kwargs) -> Trainer:
    seed_everything(seed)
    datamodule = FashionMNISTDataModule(data_dir=str(tmp_path / "data"), batch_size=64)
    model = SimpleCNN(num_classes=datamodule.num_classes, input_shape=datamodule.input_shape, **model_kwargs)
    trainer = Trainer(
        default_root_dir=tmp_path,
        max_epochs=max_epochs,
        limit_train_batches=15,
        limit_val_batches=5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        callbacks=list(callbacks),
    )
    trainer.fit(model, datamodule=datamodule)
    return trainer


def test_same_seed_same_metrics_and_weights(tmp_path: Path, fashion_mnist_dir) -> None:
    runs = [_fit(tmp_path / str(i), seed) for i, seed in enumerate((7, 7, 8))]
    metrics = [{k: v.item() for k, v in run.callback_metrics.items()} for run in runs]
    weights = [run.lightning_module.state_dict() for run in runs]
    assert metrics[0] == metrics[1]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert metrics[0]["val_loss"] != metrics[2]["val_loss"]  # the seed matters, so the check above is real


def test_early_stopping_stops_when_val_loss_stalls(tmp_path: Path, fashion_mnist_dir) -> None:
    # lr=0 freezes the weights: val_loss is identical every epoch, so after the first
    # epoch it never improves and patience=5 must end the run after epoch index 5.
    early_stopping = EarlyStopping(monitor="val_loss", patience=5)
    trainer = _fit(tmp_path, 0, callbacks=[early_stopping], max_epochs=30, lr=0.0)
    assert early_stopping.stopped_epoch == 5
    assert trainer.current_epoch == 6
