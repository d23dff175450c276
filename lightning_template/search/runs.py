"""One train.py run, in this process, as a function: a `RunConfig` in, a `RunResult` out.

The user's flags are parsed once, into a `RunConfig`; each trial, seed or fold is that config with
some values set (its parameters, its seed or fold, its run folder, a checkpoint to resume from),
and runs as an ordinary `train.py fit` run with its own log folder and `config.yaml`, so any of
them can be rerun or resumed with train.py alone.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ArgumentError, Namespace
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_template.engine.cli import ProjectCLI, installed_callbacks
from lightning_template.engine.errors import ConfigError
from lightning_template.engine.tracking import RUN_ARG, logger_type, run_dir, tracker_runs_of

# Keys that leave the run the same: what the console shows, and the name drawn for a new MLflow run (another
# at each parse; the runs here are named by their folder anyway).
SAME_RUN_KEYS = {"trainer.enable_progress_bar", "trainer.enable_model_summary", "trainer.logger.init_args.run_name"}


class FlagError(ConfigError):
    """train.py would refuse these flags or values (unknown key, wrong type). `options`: train.py's, where it did not
    know a flag (for the script's "did you mean")."""

    def __init__(self, message: str, options: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.options = tuple(options)


class Interrupted(Exception):  # not an error: a stop the user asked for
    """The run was stopped by Ctrl-C or SIGTERM after saving its last.ckpt."""


class _ParseOnly(ProjectCLI):
    """Parses and validates like train.py, then stops before building anything."""

    def _set_seed(self) -> None:
        """Parsing leaves this process's random state alone (and `seed_everything: true` unresolved)."""

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:
            raise FlagError(_message(err), options=list(parser._option_string_actions)) from None

    def before_instantiate_classes(self) -> None:
        raise _Parsed(self)


class _Parsed(Exception):
    def __init__(self, cli: ProjectCLI) -> None:
        self.cli = cli


@dataclass(frozen=True)
class RunConfig:
    """What `train.py fit` runs, parsed and checked once: each variation is a copy (`with_values`, `named`,
    `resumed`), checked against the same parser, so no run re-parses flags or starts a process to do so."""

    parser: LightningArgumentParser  # built before any run: `job_yaml` tells defaults apart with it
    namespace: Namespace
    ckpt_path: str | None = None  # where a stopped run continues from: the same run, not another setting

    @classmethod
    def parse(cls, flags: Sequence[str]) -> RunConfig:
        """`train.py fit <flags>`; FlagError if train.py would refuse them."""
        # The environment as `train.py fit` reads it (PL_FIT__TRAINER__MAX_EPOCHS=3): the run gets this config whole.
        kwargs = {"exit_on_error": False, "env_prefix": "PL_FIT_"}
        try:
            _ParseOnly(args=list(flags), run=False, parser_kwargs=kwargs)
        except _Parsed as parsed:
            return cls(parsed.cli.parser, parsed.cli.config)
        except FlagError:
            raise
        except Exception as err:  # jsonargparse's ArgumentError, or a check of train.py's own
            raise FlagError(_message(err)) from None
        raise AssertionError("unreachable")

    def with_values(self, values: Mapping[str, Any]) -> RunConfig:
        """This config with `{key: value}` set, keys as flags write them (`model.dropout`); FlagError if
        train.py would refuse one."""
        namespace = self.namespace.clone()
        for key, value in values.items():
            namespace[config_key(namespace, key)] = value
        try:
            self.parser.validate(namespace)
        except Exception as err:
            raise FlagError(_message(err)) from None
        return replace(self, namespace=namespace)

    @property
    def logger(self) -> str:
        """The logger's class name (`TensorBoardLogger`), "" without one."""
        return logger_type(self.namespace.trainer.get("logger"))

    def named(self, group: str, run: str) -> RunConfig:
        """Into `<save_dir>/<group>/<run>/` (TensorBoard, CSV), or named so (MLflow, W&B)."""
        init_args = getattr(self.namespace.trainer.get("logger"), "init_args", None)
        if init_args is None:
            return self
        if "version" in init_args and "name" in init_args:  # TensorBoardLogger, CSVLogger
            names = {"name": group, "version": run}
        elif "experiment_name" in init_args:  # MLFlowLogger
            names = {"experiment_name": group, "run_name": run}
        elif "project" in init_args:  # WandbLogger
            names = {"name": f"{group}/{run}"}
        else:
            return self
        return self.with_values({f"trainer.logger.init_args.{k}": v for k, v in names.items()})

    def resumed(self, record: dict[str, Any] | None) -> RunConfig:
        """Continuing the run `record` (from RunStarted) from its last.ckpt in the same tracker run, if it saved one."""
        if not record or not (checkpoint := Path(record["run_dir"]) / "checkpoints" / "last.ckpt").is_file():
            return self
        config = replace(self, ckpt_path=str(checkpoint))
        if self.logger in record["tracker_runs"] and self.logger in RUN_ARG:
            return config.with_values(
                {f"trainer.logger.init_args.{RUN_ARG[self.logger]}": record["tracker_runs"][self.logger]}
            )
        return config

    def settings(self) -> dict[str, Any]:
        """What the run is: its resolved config (the config files' contents, not their names) as `key: value`,
        without SAME_RUN_KEYS. Stored with runs and studies so that a rerun with other flags is refused instead
        of counting other runs as its own."""
        tree = yaml.safe_load(self.parser.dump(self.namespace))
        return {k: v for k, v in _flatten(tree) if k not in SAME_RUN_KEYS}

    def job_yaml(self) -> str:
        """What this config changes from configs/defaults.yaml, as one job config (the run's name left to its file)."""
        namespace = self.namespace.clone()
        logger_args = getattr(namespace.trainer.get("logger"), "init_args", None)
        if logger_args is not None and "name" in logger_args:
            logger_args.name = None
        return self.parser.dump(namespace, skip_default=True)

    def check_single_process(self, tool: str) -> None:
        """Runs here share this process: a launcher that re-runs the script per rank (DDP) would repeat the loop."""
        trainer = self.namespace.trainer
        if "ddp" in str(trainer.get("strategy")) or trainer.get("num_nodes", 1) > 1:
            raise FlagError(
                f"{tool} runs each training in its own process and cannot launch DDP: drop the ddp strategy/preset"
                " (for one run per GPU at once, give --workers N)."
            )


def _message(err: Exception) -> str:
    return "\n".join(line for line in str(err).splitlines() if "Given value" not in line)


def config_key(namespace: Namespace, key: str) -> str:
    """Where a flag's key is in a parsed config: `model.dropout` is `model.init_args.dropout`."""
    path: list[str] = []
    for part in key.removeprefix("--").split("."):
        node = namespace.get(".".join(path)) if path else namespace
        if isinstance(node, Namespace) and "class_path" in node and part not in ("class_path", "init_args"):
            path.append("init_args")
        path.append(part)
    return ".".join(path)


def setting_key(key: str) -> str:
    """A config key as a flag writes it: `model.init_args.x` is `model.x` (the class's own arguments)."""
    parts = key.removeprefix("--").split(".")
    return ".".join(parts[:1] + parts[2:] if parts[1:2] == ["init_args"] else parts)


def _flatten(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield setting_key(f"{prefix}{key}"), value


def differences(before: dict[str, Any], now: dict[str, Any]) -> str:
    """`key before → now` for the settings that differ (the first 8), for an error message."""
    changed = [k for k in sorted(before.keys() | now.keys()) if before.get(k, "unset") != now.get(k, "unset")]
    listed = [f"{k} {before.get(k, 'unset')} → {now.get(k, 'unset')}" for k in changed[:8]]
    return ", ".join(listed) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")


class RunStarted(Callback):
    """Tells `on_start` where the run writes ({"run_dir", "tracker_runs"}) as soon as it starts, so an
    interrupted run can be found and continued (checkpoints and tracker run), whatever the logger."""

    def __init__(self, on_start: Callable[[dict[str, Any]], None]) -> None:
        self.on_start = on_start

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:
            self.on_start({"run_dir": str(run_dir(trainer)), "tracker_runs": tracker_runs_of(trainer)})


@dataclass
class RunResult:
    """What a finished run leaves: its folder, the best score of its checkpoint's monitor, its last metrics."""

    log_dir: str
    monitor: str
    best_score: float
    best_checkpoint: str
    metrics: dict[str, float] = field(default_factory=dict)


def fit(config: RunConfig, callbacks: Sequence[Callback] = ()) -> RunResult:
    """`train.py fit` of `config` in this process; `Interrupted` if stopped by Ctrl-C or SIGTERM."""
    fit_config = config.namespace.clone()
    fit_config.ckpt_path = config.ckpt_path
    try:  # the CLI takes the parsed config as it is: only train.py's own checks and adjustments run again
        cli = ProjectCLI(
            args=Namespace(subcommand="fit", fit=fit_config),
            trainer_defaults={"callbacks": installed_callbacks() + list(callbacks)},
        )
    except SIGTERMException as stop:
        raise Interrupted("stopped by Ctrl-C or SIGTERM; its last.ckpt is saved") from stop
    finally:
        if "wandb" in sys.modules:  # close the W&B run, or the next run in this process would join it
            sys.modules["wandb"].finish()
    trainer = cli.trainer
    best = next((c for c in trainer.checkpoint_callbacks if c.monitor), None)
    monitor = getattr(best, "monitor", None) or ""
    score = getattr(best, "best_model_score", None)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    return RunResult(
        log_dir=str(trainer.log_dir or ""),
        monitor=monitor,
        best_score=float(score) if score is not None else metrics.get(monitor, math.nan),
        best_checkpoint=str(getattr(best, "best_model_path", "") or ""),
        metrics=metrics,
    )


# Flags that only set a run's length or console output: a search's budget, not part of the job.
BUDGET_KEYS = {
    "trainer.max_epochs", "trainer.max_steps", "trainer.max_time", "trainer.limit_train_batches",
    "trainer.limit_val_batches", "trainer.limit_test_batches", "trainer.limit_predict_batches",
    "trainer.enable_progress_bar", "trainer.enable_model_summary", "test_after_fit", "early_stopping.patience",
}  # fmt: skip


def without_budget(flags: list[str]) -> list[str]:
    """`flags` without the budget flags (`--key=value` or `--key value`)."""
    kept, skip_value = [], False
    for i, token in enumerate(flags):
        if skip_value:
            skip_value = False
            continue
        key = token.removeprefix("--").split("=")[0]
        if token.startswith("--") and key in BUDGET_KEYS:
            skip_value = "=" not in token and i + 1 < len(flags) and not flags[i + 1].startswith("--")
            continue
        kept.append(token)
    return kept
