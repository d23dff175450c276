"""The Lightning CLI of the template, run by `python train.py fit|validate|test|predict --config configs/<job>.yaml`.

Any LightningModule and LightningDataModule can be chosen by class path (`--model my_project.MyModel`), those of
the tasks in `lightning_template/tasks/` also by class name (`--model SimpleCNN --data FashionMNISTDataModule`);
every argument of their `__init__` becomes a flag, documented by `--help`.

`configs/defaults.yaml` is read first, by every command: the logger, the best-epoch
checkpoint and early stopping are defined there once, so a job config holds only its
model, its data and what differs. What exact resume depends on is not configuration:
this CLI installs it in every run (`installed_callbacks`).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import signal
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

import lightning_template.tasks.classification  # noqa: F401  (registers the models and datamodules)
from lightning_template.engine import (
    CheckpointFacts,
    CSVPredictionWriter,
    ExactResume,
    FiniteLossGuard,
    ProcessGroupTeardown,
    ResumeCheckpoint,
)
from lightning_template.engine.console import progress_bar
from lightning_template.engine.errors import ConfigError, MissingFileError, TemplateError
from lightning_template.engine.optim import check_run_length
from lightning_template.engine.tracking import (
    EXPERIMENT_ARG,
    RUN_ARG,
    SaveConfigToRun,
    can_continue,
    check_tracker_installed,
    experiment_dir,
    logger_type,
    name_new_run,
    run_location,
    tracker_runs,
)
from lightning_template.tasks.classification import AugmentedBatchImages, ConfusionMatrixImage, TwoStageFinetuning
from lightning_template.tasks.classification.data.contract import CHECKPOINT_STATE_ARG, MODEL_LINKS

ROOT = Path(__file__).resolve().parents[2]  # the project: configs/ and the scripts
DEFAULTS = ROOT / "configs" / "defaults.yaml"
SUBCOMMANDS = ("fit", "validate", "test", "predict")


def installed_callbacks() -> list[Any]:
    """In every run: exact resume with its last.ckpt, the input spec for serving, a stop at NaN, a clean exit of DDP
    processes, learning rates and images in the logs."""
    return [
        ExactResume(),
        ProcessGroupTeardown(),
        ResumeCheckpoint(),
        CheckpointFacts(),
        FiniteLossGuard(),
        LearningRateMonitor(logging_interval="step"),
        AugmentedBatchImages(),
        ConfusionMatrixImage(),
        progress_bar(),
    ]


def _check_checkpoint_file(path: Path) -> None:
    """Fail before building anything if --ckpt_path cannot be a checkpoint."""
    if not path.is_file():
        raise MissingFileError(
            f"--ckpt_path {path}: no such file. Checkpoints are in logs/<name>/version_*/checkpoints/."
        )
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut-off file has no central directory
        raise ConfigError(
            f"--ckpt_path {path}: not a readable PyTorch checkpoint (truncated or corrupt)."
            " Use another one, e.g. the best-epoch checkpoint next to it."
        )


def is_subclass(class_path: str, base: type) -> bool:
    module, _, name = class_path.rpartition(".")
    try:
        return issubclass(getattr(importlib.import_module(module), name), base)
    except (ImportError, AttributeError, TypeError, ValueError):
        return False


def run_name(config: Any) -> str:
    """The job config's file name (`configs/simple_cnn.yaml` -> `simple_cnn`), presets aside."""
    jobs = [Path(str(p)) for p in config.get("config") or [] if Path(str(p)).parent.name != "presets"]
    if jobs:
        return jobs[0].stem
    model = config.get("model")
    return str(getattr(model, "class_path", "run")).rpartition(".")[2].lower()


def _init_parameters(class_path: str) -> set[str]:
    """The arguments a class takes, its base classes' included (where its **kwargs go)."""
    module, _, name = class_path.rpartition(".")
    try:
        mro = getattr(importlib.import_module(module), name).__mro__
        return {p for c in mro if "__init__" in vars(c) for p in inspect.signature(vars(c)["__init__"]).parameters}
    except (ImportError, AttributeError, TypeError, ValueError):
        return set()


def did_you_mean(message: str, parser: LightningArgumentParser) -> str:
    """A line suggesting the nearest option, class argument, choice or file for a parser error, or ""."""
    close = lambda word, choices: difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)  # noqa: E731
    suggestions: list[str] = []
    if found := re.search(r"unrecognized arguments: (.*)", message):
        for word in (arg.partition("=")[0] for arg in found.group(1).split() if arg.startswith("--")):
            suggestions += close(word, parser._option_string_actions)
    top, nested = re.match(r'Parser key "([\w.]+)"', message), re.search(r"NestedArg\(key='([\w.]+)'", message)
    classes = re.findall(r"class_path[ =]'([\w.]+)'", message)  # the last one is the class that refused the key
    if top and nested and classes and "is not accepted" in message:
        path, _, option = f"{top.group(1)}.{nested.group(1)}".rpartition(".")
        suggestions += [f"--{path}.{m}" for m in close(option, _init_parameters(classes[-1]))]
    if found := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message):
        suggestions += close(found.group(1), re.findall(r"'([^']*)'", found.group(2)))
    if found := re.search(r"File does not exist: '([^']*)'", message):
        missing = Path(found.group(1))
        siblings = [p.name for p in missing.parent.iterdir()] if missing.parent.is_dir() else []
        suggestions += [str(missing.parent / m) for m in close(missing.name, siblings)]
    return f"did you mean {' / '.join(suggestions)}?\n" if suggestions else ""


class TemplateParser(LightningArgumentParser):
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        """The reason first, with the nearest valid name, instead of argparse's 80-line usage above it."""
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):  # jsonargparse's raise, unchanged
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        command = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"error: {message}\n{did_you_mean(message, parser)}`{command} --help` lists the options.\n")
        self.exit(2)


class TemplateCLI(LightningCLI):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # default_env: every option can also be set from the environment, e.g. PL_FIT__TRAINER__MAX_EPOCHS=3.
        defaults = {"default_config_files": [str(DEFAULTS)], "default_env": True}
        parser_kwargs = kwargs.setdefault("parser_kwargs", {})
        if kwargs.get("run", True):
            parser_kwargs.setdefault("default_env", True)
            for subcommand in SUBCOMMANDS:
                parser_kwargs.setdefault(subcommand, defaults)
        else:
            parser_kwargs.update({**defaults, **parser_kwargs})
        kwargs.setdefault("parser_class", TemplateParser)
        kwargs.setdefault("trainer_defaults", {"callbacks": installed_callbacks()})
        kwargs.setdefault("save_config_callback", SaveConfigToRun)  # next to the checkpoints, and to the tracker
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})  # a rerun in the same folder may rewrite it
        # The model builds its optimizer (`--model.optimizer`, named param groups): no top-level --optimizer.
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Facts about the data are given once, by the datamodule (tasks/classification/data/contract.py). Links
        # whose source or target a class lacks are skipped (image data has no vocabulary).
        for name in MODEL_LINKS:
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")  # the best epoch; see configs/defaults.yaml
        parser.add_lightning_class_args(EarlyStopping, "early_stopping")
        parser.add_lightning_class_args(CSVPredictionWriter, "predictions")
        parser.add_argument(
            "--debug",
            type=bool,
            nargs="?",
            const=True,
            default=False,
            help="Show the Python traceback of an error (otherwise only its message); also TEMPLATE_DEBUG=1.",
        )
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="After `fit`, evaluate the best checkpoint on the test split.",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        self._given = [str(a) for a in (sys.argv[1:] if args is None else args if isinstance(args, list) else [])]
        super().parse_arguments(parser, args)
        # Before LightningCLI reads the checkpoint's hyperparameters (right after parsing).
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        logger = config.trainer.get("logger")
        logger_args = getattr(logger, "init_args", None)
        logger_class = logger_type(logger)
        check_tracker_installed(logger_class)
        experiment_arg = EXPERIMENT_ARG.get(logger_class)
        if experiment_arg and logger_args.get(experiment_arg) in (None, "", "lightning_logs"):
            logger_args[experiment_arg] = run_name(config)  # the job's name, whatever the tracker
        name_new_run(logger_class, logger_args)
        model_args = getattr(config.get("model"), "init_args", None)
        if model_args is not None and "schedule" in model_args:
            trainer = config.trainer
            check_run_length(model_args.schedule, trainer.get("max_epochs"), trainer.get("max_steps"))
        if config.get("ckpt_path") == "last":
            self._resolve_last_checkpoint(config, subcommand)
        checkpoint = config.get("ckpt_path")
        if not checkpoint:
            return
        if checkpoint in {"best", "last", "hpc"}:
            return
        _check_checkpoint_file(Path(checkpoint))
        data_args = getattr(config.get("data"), "init_args", None)
        if data_args is not None and CHECKPOINT_STATE_ARG in data_args:
            # What the checkpoint was trained with (a vocabulary), not one rebuilt from today's files.
            data_args[CHECKPOINT_STATE_ARG] = data_args[CHECKPOINT_STATE_ARG] or checkpoint

    def _parse_ckpt_path(self) -> None:
        """LightningCLI builds the model from the checkpoint's hyper-parameters, class included, over the config and
        the flags: refuse a checkpoint of another model, and `--model.*` flags whose values it would replace."""
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        before = config.get("model")
        before = before.clone() if before is not None else None
        super()._parse_ckpt_path()
        config = self.config[subcommand] if subcommand else self.config
        after, checkpoint = config.get("model"), config.get("ckpt_path")
        if before is None or after is None or not checkpoint:
            return
        if before.class_path != after.class_path:
            raise ConfigError(
                f"--ckpt_path {checkpoint} is a checkpoint of {after.class_path}, but this config's model is"
                f" {before.class_path}. Use the config of the run that wrote it, or start a new run from its weights"
                f" with --model.weights {checkpoint}."
            )
        old, new = _leaves(before.get("init_args")), _leaves(after.get("init_args"))
        changed = [
            f"{flag} {old[key]!r} (checkpoint: {new.get(key)!r})"
            for flag, prefix in _model_flags(self._given)
            for key in old
            if (key == prefix or key.startswith(f"{prefix}.")) and old[key] != new.get(key)
        ]
        if changed:
            raise ConfigError(
                f"--ckpt_path {checkpoint}: the model is built with the checkpoint's hyper-parameters, which differ"
                f" from {', '.join(changed)}. Drop these flags, or start a new run from its weights with"
                f" --model.weights {checkpoint}."
            )
        if Path(checkpoint).is_file() and after.init_args.get("weights"):
            # The checkpoint's weights replace them anyway: do not read (or download) them again.
            after.init_args.weights = None

    @staticmethod
    def _resolve_last_checkpoint(config: Any, subcommand: str | None) -> None:
        """`--ckpt_path last`: the newest last.ckpt of this experiment, across its runs.

        Lightning alone only looks in the new run's own (empty) folder and would silently
        start from scratch. When resuming `fit`, the logger is pointed at the resumed run
        (TensorBoard/CSV version folder, MLflow run id, W&B run id), so curves, checkpoints
        and the tracker's run continue where they were.
        """
        logger = config.trainer.get("logger")
        init_args = getattr(logger, "init_args", None)
        logger_class = logger_type(logger)
        folder = None if init_args is None else experiment_dir(logger_class, init_args, config.trainer.default_root_dir)
        if folder is None:
            return
        candidates = [
            path
            for path in sorted(folder.glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
            if can_continue(logger_class, tracker_runs(str(path)))
        ]
        if not candidates:
            if subcommand != "fit":
                raise MissingFileError(f"--ckpt_path last: no {folder}/*/checkpoints/last.ckpt found.")
            rank_zero_warn(f"--ckpt_path last: nothing to resume in {folder}; starting from scratch.")
            config.ckpt_path = None
            return
        config.ckpt_path = str(candidates[-1])
        if subcommand == "fit" and logger_class in RUN_ARG:
            run_id = tracker_runs(config.ckpt_path).get(logger_class) or candidates[-1].parent.parent.name
            init_args[RUN_ARG[logger_class]] = run_id
        rank_zero_info(f"Resuming from {config.ckpt_path}")

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        callbacks = self.trainer_defaults.get("callbacks", [])
        if subcommand == "predict":  # nothing to log: no run folder (the CSV is the result), no config.yaml in it
            config.trainer.logger = False
            self.save_config_callback = None
        if not config.trainer.get("logger"):  # --trainer.logger false: nothing to monitor learning rates into
            callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
        configured = config.trainer.get("callbacks") or []
        classes = [getattr(c, "class_path", "") for c in configured]
        if config.trainer.get("enable_progress_bar") is False or any(is_subclass(c, ProgressBar) for c in classes):
            callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]  # Lightning allows one, or none
        self.trainer_defaults["callbacks"] = callbacks
        # Stacked configs (a preset on a job) may each bring a TwoStageFinetuning: the later one replaces the
        # earlier, as a later config's value does (two would both unfreeze the backbone).
        unfreezing = [c for c, path in zip(configured, classes, strict=True) if is_subclass(path, TwoStageFinetuning)]
        for replaced in unfreezing[:-1]:
            configured.remove(replaced)
            rank_zero_info(
                f"TwoStageFinetuning {dict(unfreezing[-1].get('init_args') or {})} replaces the earlier"
                f" {dict(replaced.get('init_args') or {})} (the later config wins)."
            )

    def before_predict(self) -> None:
        # Checkpoint callbacks write nothing here; restoring their state from the checkpoint would only warn that
        # "the dirpath has changed" (the best-epoch one comes from the `checkpoint` options).
        self.trainer.callbacks = [c for c in self.trainer.callbacks if not isinstance(c, ModelCheckpoint)]

    def before_fit(self) -> None:
        # Fix the run's version folder now: a spawning launcher (ddp_spawn) would otherwise let each
        # launch pick the next free one, and `test_after_fit` would open a second run folder.
        if self.trainer.is_global_zero:
            for logger in self.trainer.loggers:
                _ = logger.version

    def after_fit(self) -> None:
        trainer = self.trainer
        # Read before testing: loading the best checkpoint restores the callbacks' states of that epoch.
        lines = []
        best = next((c for c in trainer.checkpoint_callbacks if c.monitor and c.best_model_path), None)
        if best is not None:
            score = "" if best.best_model_score is None else f" ({best.monitor}={float(best.best_model_score):.4f})"
            lines.append(f"best checkpoint: {best.best_model_path}{score}")
        last = next((c.best_model_path for c in trainer.checkpoint_callbacks if isinstance(c, ResumeCheckpoint)), "")
        if last:
            lines.append(f"last checkpoint: {last}")
        if self.config.fit.test_after_fit:
            trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best.best_model_path if best else None)
        if not trainer.is_global_zero:
            return
        logger = trainer.logger
        if location := run_location(logger):
            lines.append(location)
        if "test_acc" in trainer.callback_metrics:
            lines.append(f"test accuracy: {trainer.callback_metrics['test_acc']:.4f}")
        final = {f"final/{k}": float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("val_", "test_"))}
        if isinstance(logger, TensorBoardLogger):  # the HPARAMS tab: this run's settings next to its results
            logger.log_hyperparams(self.model.hparams, final)
            logger.finalize("success")  # fit already closed the writer; flush this last summary
        elif logger is not None and final:
            logger.log_metrics(final, step=trainer.global_step)
            logger.finalize("success")
        print("\n".join(lines), flush=True)


def _setting(key: str) -> str:
    """A model setting's key without jsonargparse's `init_args`: `optimizer.init_args.lr` -> `optimizer.lr`."""
    return ".".join(part for part in key.split(".") if part != "init_args")


def _leaves(namespace: Any) -> dict[str, Any]:
    return {_setting(key): value for key, value in (namespace.items() if namespace is not None else [])}


def _model_flags(args: list[str]) -> list[tuple[str, str]]:
    """The `--model.<key>` flags on the command line, with their setting ("optimizer.lr"); not --model.weights,
    which a checkpoint replaces by design."""
    flags = [arg.partition("=")[0] for arg in args if arg.startswith("--model.")]
    settings = [(flag, _setting(flag.removeprefix("--model."))) for flag in flags]
    return [(flag, key) for flag, key in settings if key != "weights"]


def template_error(error: BaseException) -> TemplateError | None:
    """The `TemplateError` behind `error`, if any: the error itself or one it was raised from (jsonargparse wraps
    the errors of a model's `__init__` in its own)."""
    while error is not None and not isinstance(error, TemplateError):
        error = error.__cause__
    return error


def debug_requested(argv: list[str]) -> bool:
    """`--debug` / `--debug=true` on the command line, TEMPLATE_DEBUG=1 or PL_<COMMAND>__DEBUG=true."""
    switches = [
        v for k, v in os.environ.items() if k == "TEMPLATE_DEBUG" or (k.startswith("PL_") and k.endswith("DEBUG"))
    ]
    if any(value.lower() in ("1", "true", "yes") for value in switches):
        return True
    for position, arg in enumerate(argv):
        if arg == "--debug" or arg.startswith("--debug="):
            value = arg.partition("=")[2] or (argv[position + 1] if position + 1 < len(argv) else "true")
            return value.lower() in ("true", "1", "yes") or value.startswith("-")
    return False


def exit_on_error(run: Callable[[], Any]) -> Any:
    """Run a command; a `TemplateError` (a problem of the input, with its fix) is printed as its message, without
    the traceback, and exits 1; any other exception keeps its traceback. `--debug` or TEMPLATE_DEBUG=1 shows it."""
    try:
        return run()
    except SIGTERMException:  # stopped by SIGTERM or Ctrl-C after saving last.ckpt: not a success
        sys.exit(128 + signal.SIGTERM)
    except Exception as error:
        cause = template_error(error)
        if cause is None or debug_requested(sys.argv[1:]):
            raise
        print(f"\nError: {cause}\n(--debug or TEMPLATE_DEBUG=1 shows the traceback)", file=sys.stderr, flush=True)
        sys.exit(1)


def main() -> None:
    exit_on_error(TemplateCLI)
