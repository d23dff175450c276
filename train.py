"""Command-line entry point: `python train.py fit|validate|test|predict --config configs/<job>.yaml`.

Every LightningModule in `models/` and LightningDataModule in `datamodules/` can be
chosen by class name (`--model SimpleCNN --data FashionMNISTDataModule`); every
argument of their `__init__` becomes a flag, documented by `--help`.
"""

from __future__ import annotations

import signal
import sys
import zipfile
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

import datamodules  # noqa: F401  (registers the datamodules for --data)
import models  # noqa: F401  (registers the models for --model)
from callbacks import AugmentedBatchImages, ConfusionMatrixImage, ExactResume, FiniteLossGuard


def _check_checkpoint_file(path: Path) -> None:
    """Fail before building anything if --ckpt_path cannot be a checkpoint."""
    if not path.is_file():
        raise FileNotFoundError(
            f"--ckpt_path {path}: no such file. Checkpoints are in logs/<name>/version_*/checkpoints/."
        )
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut-off file has no central directory
        raise ValueError(
            f"--ckpt_path {path}: not a readable PyTorch checkpoint (truncated or corrupt)."
            " Use another one, e.g. the best-epoch checkpoint next to it."
        )


class TemplateCLI(LightningCLI):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Every run gets exact resume (and a graceful Ctrl-C), a stop at NaN loss, and the
        # augmented-batch and confusion-matrix images in TensorBoard, on top of its config's callbacks.
        default_callbacks = [ExactResume(), FiniteLossGuard(), AugmentedBatchImages(), ConfusionMatrixImage()]
        kwargs.setdefault("trainer_defaults", {"callbacks": default_callbacks})
        kwargs.setdefault("seed_everything_default", 42)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})  # a rerun in the same folder may rewrite it
        # The model builds its optimizer (named param groups for fine-tuning): no --optimizer flag.
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Facts about the data are given once, by the datamodule, never typed twice.
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.input_shape", "model.init_args.input_shape", apply_on="instantiate")
        # Links whose source or target a class lacks are skipped (image data has no vocabulary).
        for name in ("vocab_size", "pad_id", "max_length"):
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="After `fit`, evaluate the best checkpoint on the test split.",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        # Before LightningCLI reads the checkpoint's hyperparameters (right after parsing).
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        if config.get("ckpt_path") == "last":
            self._resolve_last_checkpoint(config, subcommand)
        checkpoint = config.get("ckpt_path")
        if not checkpoint:
            return
        if checkpoint not in {"best", "last", "hpc"}:
            _check_checkpoint_file(Path(checkpoint))
        data_args = getattr(config.get("data"), "init_args", None)
        if data_args is not None and "vocab_from_checkpoint" in data_args:
            # The vocabulary the checkpoint was trained with, not one rebuilt from today's files.
            data_args.vocab_from_checkpoint = data_args.vocab_from_checkpoint or checkpoint

    @staticmethod
    def _resolve_last_checkpoint(config: Any, subcommand: str | None) -> None:
        """`--ckpt_path last`: the newest last.ckpt of this experiment, across its versions.

        Lightning alone only looks in the new run's own (empty) version folder and
        would silently start from scratch. When resuming `fit`, the logger is pointed
        at the resumed version so curves and checkpoints continue in the same folder.
        """
        logger = config.trainer.get("logger")
        init_args = getattr(logger, "init_args", None)
        if init_args is None or "save_dir" not in init_args:
            return
        experiment_dir = Path(init_args.save_dir) / (init_args.get("name") or "lightning_logs")
        candidates = sorted(experiment_dir.glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
        if not candidates:
            if subcommand != "fit":
                raise FileNotFoundError(f"--ckpt_path last: no {experiment_dir}/*/checkpoints/last.ckpt found.")
            rank_zero_warn(f"--ckpt_path last: nothing to resume in {experiment_dir}; starting from scratch.")
            config.ckpt_path = None
            return
        config.ckpt_path = str(candidates[-1])
        if subcommand == "fit":
            init_args.version = candidates[-1].parent.parent.name
        rank_zero_info(f"Resuming from {config.ckpt_path}")

    def after_fit(self) -> None:
        trainer = self.trainer
        if self.config.fit.test_after_fit:
            best = next((c.best_model_path for c in trainer.checkpoint_callbacks if c.monitor), None)
            trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None)
        if not trainer.is_global_zero:
            return
        lines = []
        for callback in trainer.checkpoint_callbacks:
            if callback.monitor and callback.best_model_path:
                score = f" ({callback.monitor}={callback.best_model_score:.4f})"
                lines.append(f"best checkpoint: {callback.best_model_path}{score}")
            elif callback.best_model_path:
                lines.append(f"last checkpoint: {callback.best_model_path}")
        if trainer.logger is not None and trainer.logger.log_dir:
            lines.append(f"TensorBoard logs: tensorboard --logdir {trainer.logger.log_dir}")
        if "test_acc" in trainer.callback_metrics:
            lines.append(f"test accuracy: {trainer.callback_metrics['test_acc']:.4f}")
        if trainer.logger is not None:  # the HPARAMS tab: this run's settings next to its results
            final = {
                f"final/{k}": float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("val_", "test_"))
            }
            trainer.logger.log_hyperparams(self.model.hparams, final)
            trainer.logger.finalize("success")  # fit already closed the writer; flush this last summary
        print("\n".join(lines), flush=True)


def main() -> None:
    try:
        TemplateCLI()
    except SIGTERMException:  # stopped by SIGTERM or Ctrl-C after saving last.ckpt: not a success
        sys.exit(128 + signal.SIGTERM)


if __name__ == "__main__":
    main()
