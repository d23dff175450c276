"""One train.py run, in this process, as a function: flags in, its folder and metrics out.

Search trials, seeds and folds are all ordinary `train.py fit` runs with their own log folder
and `config.yaml`, so any of them can be rerun or resumed with train.py alone.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_template.callbacks.tracking import RUN_ARG, logger_type, run_dir, tracker_runs_of
from lightning_template.cli import ROOT, TemplateCLI, installed_callbacks
from lightning_template.errors import ConfigError

# Runs here are driven with explicit flags by design, whatever this process's own argv is.
warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")


class FlagError(ConfigError):
    """train.py would refuse these flags (unknown key, wrong type)."""


class Interrupted(Exception):  # not an error: a stop the user asked for
    """The run was stopped by Ctrl-C or SIGTERM after saving its last.ckpt."""


class RunStarted(Callback):
    """Tells `on_start` where the run writes ({"run_dir", "tracker_runs"}) as soon as it starts, so an
    interrupted run can be found and continued (checkpoints and tracker run), whatever the logger."""

    def __init__(self, on_start: Callable[[dict[str, Any]], None]) -> None:
        self.on_start = on_start

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:
            self.on_start({"run_dir": str(run_dir(trainer)), "tracker_runs": tracker_runs_of(trainer)})


def resume_flags(record: dict[str, Any] | None, flags: list[str]) -> list[str]:
    """Flags that continue the run `record` (from RunStarted) from its last.ckpt, in the same tracker run."""
    if not record:
        return []
    checkpoint = Path(record["run_dir"]) / "checkpoints" / "last.ckpt"
    if not checkpoint.is_file():
        return []
    logger = parse(flags).config.trainer.get("logger")
    name = logger_type(logger)
    resumed = [f"--ckpt_path={checkpoint}"]
    if name in record["tracker_runs"] and name in RUN_ARG:
        resumed.append(f"--trainer.logger.init_args.{RUN_ARG[name]}={record['tracker_runs'][name]}")
    return resumed


def check_single_process(flags: list[str], tool: str) -> None:
    """Runs here share this process: a launcher that re-runs the script per rank (DDP) would repeat the loop."""
    trainer = parse(flags).config.trainer
    if "ddp" in str(trainer.get("strategy")) or trainer.get("num_nodes", 1) > 1:
        raise FlagError(
            f"{tool} runs each training in its own process and cannot launch DDP: drop the ddp strategy/preset"
            " (run several tune.py processes on one --storage instead, one per GPU, with CUDA_VISIBLE_DEVICES)."
        )


@dataclass
class RunResult:
    log_dir: str
    monitor: str
    best_score: float
    best_checkpoint: str
    metrics: dict[str, float] = field(default_factory=dict)


def flag(key: str, value: Any) -> str:
    """`--key=value` as train.py reads it (booleans and None as YAML words)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    else:
        text = str(value)
    return f"--{key}={text}"


class _ParseOnly(TemplateCLI):
    """Parses and validates like train.py, then stops before building anything."""

    def _set_seed(self) -> None:
        """Parsing leaves this process's random state alone (and `seed_everything: true` unresolved)."""

    def before_instantiate_classes(self) -> None:
        raise _Parsed(self)


class _Parsed(Exception):
    def __init__(self, cli: TemplateCLI) -> None:
        self.cli = cli


def parse(flags: list[str]) -> TemplateCLI:
    """The parsed (not instantiated) CLI for `train.py fit <flags>`; FlagError if train.py would refuse them."""
    try:
        _ParseOnly(args=flags, run=False, parser_kwargs={"exit_on_error": False})
    except _Parsed as parsed:
        return parsed.cli
    except Exception as err:  # jsonargparse's ArgumentError, or a check of train.py's own
        lines = [line for line in str(err).splitlines() if "Given value" not in line]
        raise FlagError("\n".join(lines)) from None
    raise AssertionError("unreachable")


# Keys that only change what the console shows: the same run either way.
CONSOLE_KEYS = {"trainer.enable_progress_bar", "trainer.enable_model_summary"}


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


def settings(flags: list[str]) -> dict[str, Any]:
    """What a run of `train.py fit <flags>` is: its resolved config (the config files' contents, not their
    names) as `key: value`, without console-only keys. Stored with runs and studies so that a rerun with
    other flags is refused instead of counting other runs as its own."""
    cli = parse(flags)
    tree = yaml.safe_load(cli.parser.dump(cli.config))
    return {k: v for k, v in _flatten(tree) if k not in CONSOLE_KEYS}


def differences(before: dict[str, Any], now: dict[str, Any]) -> str:
    """`key before → now` for the settings that differ (the first 8), for an error message."""
    changed = [k for k in sorted(before.keys() | now.keys()) if before.get(k, "unset") != now.get(k, "unset")]
    listed = [f"{k} {before.get(k, 'unset')} → {now.get(k, 'unset')}" for k in changed[:8]]
    return ", ".join(listed) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")


def job_config_yaml(flags: list[str]) -> str:
    """What `flags` change from configs/defaults.yaml, as one job config (the run's name left to its file).

    In a fresh process: once a run was built in this one, jsonargparse no longer tells defaults apart.
    """
    code = "import sys; from lightning_template.search import runs; print(runs._job_config_yaml(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code, *flags], env=env, capture_output=True, text=True)
    if done.returncode:
        raise FlagError(done.stderr.strip().splitlines()[-1])
    return done.stdout


def _job_config_yaml(flags: list[str]) -> str:
    cli = parse(flags)
    logger_args = getattr(cli.config.trainer.get("logger"), "init_args", None)
    if logger_args is not None and "name" in logger_args:
        logger_args.name = None
    return cli.parser.dump(cli.config, skip_default=True)


def logger_flags(flags: list[str], group: str, run: str) -> list[str]:
    """Flags that put a run into `<save_dir>/<group>/<run>/` (TensorBoard, CSV) or name it so (MLflow, W&B)."""
    logger = parse(flags).config.trainer.get("logger")
    init_args = getattr(logger, "init_args", None)
    if init_args is None:
        return []
    prefix = "--trainer.logger.init_args."
    if "version" in init_args and "name" in init_args:  # TensorBoardLogger, CSVLogger
        return [f"{prefix}name={group}", f"{prefix}version={run}"]
    if "experiment_name" in init_args:  # MLFlowLogger
        return [f"{prefix}experiment_name={group}", f"{prefix}run_name={run}"]
    if "project" in init_args:  # WandbLogger
        return [f"{prefix}name={group}/{run}"]
    return []


def fit(flags: list[str], callbacks: list[Callback] | None = None) -> RunResult:
    """`train.py fit <flags>` in this process; `Interrupted` if stopped by Ctrl-C or SIGTERM."""
    try:
        cli = TemplateCLI(
            args=["fit", *flags],
            trainer_defaults={"callbacks": installed_callbacks() + list(callbacks or [])},
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
