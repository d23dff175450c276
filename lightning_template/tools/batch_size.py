"""Lightning's BatchSizeFinder, fitted to this project's runs (configs/presets/batch_size_finder.yaml)."""

from __future__ import annotations

from typing import Any, Literal

from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import BatchSizeFinder

from lightning_template.engine.lightning_internals import forget_train_loader


class FitBatchSizeFinder(BatchSizeFinder):
    """Finds the largest `--data.batch_size` that fits, once, at the start of `fit`.

    Unlike Lightning's callback it starts from the configured batch size (not 2), leaves
    validate/test/predict alone (they would search again), and records the size it found in
    the checkpoint: a resumed run trains on with it, as exact resume needs the same batches.
    """

    def __init__(
        self,
        mode: Literal["power", "binsearch"] = "power",
        steps_per_trial: int = 3,
        max_trials: int = 6,
        max_val: int = 8192,
        margin: float = 0.05,
    ) -> None:
        """
        Args:
            mode: `power` doubles the batch size until a step runs out of memory; `binsearch` then
                narrows down between the last size that fitted and the first that did not.
            steps_per_trial: Training steps run at each size.
            max_trials: Sizes tried at most (power: up to 2**(max_trials - 1) times the configured size).
            max_val: Never go above this batch size.
            margin: Back off by this fraction from the largest size that fitted (binsearch).
        """
        super().__init__(
            mode=mode, steps_per_trial=steps_per_trial, max_trials=max_trials, margin=margin, max_val=max_val
        )
        self.found: int | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"found": self.found}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.found = state_dict["found"]

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        datamodule = trainer.datamodule
        if self.found is None:
            self._init_val = datamodule.batch_size
            super().on_fit_start(trainer, pl_module)  # the trials, then back to the initial weights
            self.found = datamodule.batch_size
        else:  # restored from the checkpoint of an interrupted run
            datamodule.batch_size = self.found
        # The training loader and the step-based learning-rate schedule were built before this hook, for
        # the configured size: rebuild both (a resumed run then loads its optimizer state into them).
        forget_train_loader(trainer)
        trainer.fit_loop.setup_data()
        trainer.strategy.setup_optimizers(trainer)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        pass

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        pass

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        pass
