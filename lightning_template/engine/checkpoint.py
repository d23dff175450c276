"""A run's checkpoint: which one a command starts from, what the CLI reads from it, and what each one records.

- `resolve_checkpoint`: `--ckpt_path <file>`, `last` or `best`, resolved once into a `RunCheckpoint`, the record
  of what the CLI needs before anything is built (the model's class and hyper-parameters, the tracker run to
  continue, a datamodule's saved state, the tensors' shapes); the Trainer then loads the file itself, to restore
  the weights and the loops. The file is memory-mapped: reading the record costs no copy of the weights.
- Resuming `fit` from a checkpoint of one of the experiment's runs continues that run (its version folder or tracker
  run), with the data it was trained with.
- `CheckpointAlone`: `validate|test|predict --ckpt_path <file>` without a config.
- What the CLI builds from it: the model with its class and hyper-parameters (`build_model_from_checkpoint`), a
  datamodule with its saved state (`restore_datamodule`), both refusing settings given on top that they replace.
- `CheckpointFacts`: what every checkpoint records beyond Lightning's: the tracker run and the seed.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import warnings
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import ArgumentError
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.nn.parameter import is_lazy

from lightning_template.engine.errors import ConfigError, MissingFileError
from lightning_template.engine.lightning_internals import restarted_mid_epoch
from lightning_template.engine.sampling import global_seed
from lightning_template.engine.tracking import (
    CHECKPOINT_KEY,
    EXPERIMENT_ARG,
    RUN_ARG,
    can_continue,
    experiment_dir,
    logger_type,
    tracker_runs_of,
)
from lightning_template.script_args import option_values

SEED_KEY = "seed"
# Data settings that change how the data loads, not what it is: a run may continue with others.
HOW_DATA_LOADS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


@dataclass(frozen=True)
class RunCheckpoint:
    path: Path
    hyper_parameters: dict[str, Any]  # as the model saved them; LightningCLI adds `_class_path`
    entries: dict[str, Any]  # the checkpoint's other top-level entries: {datamodule class name: its state_dict()}...
    tracker_runs: dict[str, str]  # {logger class: run id} of the run that wrote it
    shapes: dict[str, tuple[int, ...]]  # of the model's state dict
    global_step: int
    best_model_path: str | None  # the run's best-epoch checkpoint when this one was written, if it had one

    @property
    def model_class(self) -> str | None:
        return self.hyper_parameters.get("_class_path")

    @classmethod
    def read(cls, path: str | Path) -> RunCheckpoint:
        """The record of `path`; a one-line error if it is missing or not a readable checkpoint."""
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"--ckpt_path {path} is a folder: give a checkpoint file, {_checkpoint_in(path)}.")
        if not path.is_file():
            raise MissingFileError(
                f"--ckpt_path {path}: no such file. Checkpoints are in logs/<name>/version_*/checkpoints/."
            )
        if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut-off file has no central directory
            raise ConfigError(
                f"--ckpt_path {path}: not a readable PyTorch checkpoint (truncated or corrupt)."
                " Use another one, e.g. the best-epoch checkpoint next to it."
            )
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as err:
            reason = str(err).strip().splitlines()[0][:200]
            raise ConfigError(
                f"--ckpt_path {path}: not a readable PyTorch checkpoint ({type(err).__name__}: {reason})."
            ) from err
        if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
            raise ConfigError(f"--ckpt_path {path}: not a Lightning checkpoint (no state_dict); for weights alone use"
                              " --model.weights, where the model takes them.")  # fmt: skip
        held = {"state_dict", "hyper_parameters", "callbacks", "loops", "optimizer_states", "lr_schedulers"}
        return cls(
            path=path,
            hyper_parameters=dict(checkpoint.get("hyper_parameters") or {}),
            entries={k: v for k, v in checkpoint.items() if k not in held},
            tracker_runs=dict(checkpoint.get(CHECKPOINT_KEY, {})),
            shapes={k: tuple(v.shape) for k, v in checkpoint["state_dict"].items() if isinstance(v, torch.Tensor)},
            global_step=int(checkpoint.get("global_step", 0)),
            best_model_path=_best_of(checkpoint.get("callbacks") or {}),
        )

    def best_checkpoint(self) -> Path | None:
        """The run's best-epoch checkpoint, found next to this one (its folder may have moved since), if it is there."""
        if not self.best_model_path:
            return None
        beside = self.path.parent / Path(self.best_model_path).name
        return next((p for p in (beside, Path(self.best_model_path)) if p.is_file()), None)

    def datamodule_state(self, class_name: str) -> dict[str, Any] | None:
        """What the datamodule of class `class_name` saved (its `state_dict()`), as Lightning stores it."""
        state = self.entries.get(class_name)
        return state if isinstance(state, dict) else None

    def mismatched_shapes(self, state_dict: dict[str, torch.Tensor]) -> list[str]:
        """`name: checkpoint (..) vs model (..)` for each tensor both have with another shape. A lazy module's
        tensors (`nn.LazyLinear`) have no shape before their first forward: loading the checkpoint gives them its."""
        return [
            f"{name}: checkpoint {self.shapes[name]} vs model {tuple(tensor.shape)}"
            for name, tensor in state_dict.items()
            if name in self.shapes and not is_lazy(tensor) and self.shapes[name] != tuple(tensor.shape)
        ]


def _checkpoint_in(folder: Path) -> str:
    """One checkpoint file of a run's folder (or of its checkpoints/), to name instead of the folder, if it has one."""
    found = [*sorted(folder.glob("checkpoints/*.ckpt")), *sorted(folder.glob("*.ckpt"))]
    last = [path for path in found if path.name == "last.ckpt"]
    if last or found:
        return f"e.g. {(last or found)[0]}"
    return "e.g. logs/<name>/version_N/checkpoints/last.ckpt, or `last` or `best` (found among a job's runs)"


def _best_of(callbacks: dict[str, Any]) -> str | None:
    """The best checkpoint that a run's monitoring ModelCheckpoint recorded (the project's BestCheckpoint first)."""
    states = [
        (not name.startswith("BestCheckpoint"), state["best_model_path"])
        for name, state in callbacks.items()
        if isinstance(state, dict) and state.get("monitor") and state.get("best_model_path")
    ]
    return min(states)[1] if states else None


class CheckpointFacts(Callback):
    """`checkpoint[CHECKPOINT_KEY]`: {logger class: run id}, so `--ckpt_path` continues the same tracker run (the same
    TensorBoard version folder, MLflow run id, W&B run id); `checkpoint[SEED_KEY]`: the run's seed.

    The seed orders each epoch's samples: a run resumed in the middle of an epoch with another seed would skip the
    batches done in another order, training some samples twice and others never. That is refused in one line; at an
    epoch end another seed only orders the epochs to come, and is said."""

    def __init__(self) -> None:
        self._trained_with: int | None = None  # the seed of the checkpoint that fit resumes from

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = tracker_runs_of(trainer)
        checkpoint[SEED_KEY] = global_seed()

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._trained_with = checkpoint.get(SEED_KEY)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        trained_with, self._trained_with = self._trained_with, None
        if trained_with is None or trained_with == global_seed():
            return
        if restarted_mid_epoch(trainer):
            raise ConfigError(
                f"The checkpoint was written in the middle of epoch {trainer.current_epoch} of a run seeded"
                f" {trained_with}, not {global_seed()}: the batches already trained cannot be skipped in another"
                f" order. Resume with --seed_everything {trained_with}, or from a checkpoint written at an epoch end."
            )
        rank_zero_warn(
            f"The checkpoint's run was seeded {trained_with}; it goes on with seed {global_seed()}: the epochs from"
            f" epoch {trainer.current_epoch + 1} draw their order and random numbers from it."
        )


def resolve_checkpoint(
    config: Any, subcommand: str | None, dump_fit_config: Callable[[Any], str]
) -> RunCheckpoint | None:
    """The run's checkpoint, read once: `--ckpt_path <file>`, `last` (the newest last.ckpt of this experiment) or
    `best` (the best-epoch checkpoint of its newest run that has one). Resuming `fit` from a checkpoint of one of
    this experiment's runs (`last`, or its path) continues that run: the same version folder, or tracker run."""
    path = config.get("ckpt_path")
    if not path or path == "hpc":
        return None
    if path == "last":
        found = _last_checkpoint(config, subcommand)
    elif path == "best":
        found = _best_checkpoint(config)
    else:
        found = RunCheckpoint.read(path)
    if found is None:
        config.ckpt_path = None
        return None
    config.ckpt_path = str(found.path)
    if subcommand == "fit":  # the other commands load it: Lightning says so
        _continue_its_run(config, found, dump_fit_config)
        rank_zero_info(f"Resuming from {config.ckpt_path}")
    return found


def _continue_its_run(config: Any, found: RunCheckpoint, dump_fit_config: Callable[[Any], str]) -> None:
    """A checkpoint of one of this experiment's runs (<folder>/<run>/checkpoints/<file>) continues that run, with
    the data it was trained with, where it is the run's latest state. One that the run went on from (an earlier
    best epoch) starts a new run: continuing that one would write its later checkpoints again beside the first
    ones and log its later steps twice."""
    logger = config.trainer.get("logger")
    logger_class = logger_type(logger)
    if logger_class not in RUN_ARG or not can_continue(logger_class, found.tracker_runs):
        return
    folder = experiment_dir(config)
    if folder is None or folder.resolve() not in found.path.resolve().parents[2:3]:
        return
    run, last = found.path.parents[1], found.path.parent / "last.ckpt"
    went_on = RunCheckpoint.read(last).global_step if last.is_file() and last != found.path else found.global_step
    if went_on > found.global_step:
        rank_zero_info(
            f"--ckpt_path {found.path} is step {found.global_step} of {run}, which went on to step {went_on}:"
            f" continuing from it in a new run ({run} stays as it is)."
        )
        # Said here: Lightning's warning that the best checkpoint's folder changed would say it again, as a fault.
        warnings.filterwarnings("ignore", "The dirpath has changed from", UserWarning)
        return
    _check_same_data(config, found, run, dump_fit_config)
    logger.init_args[RUN_ARG[logger_class]] = found.tracker_runs.get(logger_class) or run.name
    # Its checkpoints are in that folder: Lightning's warning about a folder not empty is meant for a new run.
    warnings.filterwarnings("ignore", r"Checkpoint directory .* exists and is not empty", UserWarning)


def _check_same_data(config: Any, found: RunCheckpoint, run: Path, dump_fit_config: Callable[[Any], str]) -> None:
    """Continuing a run with other data would rewrite its config.yaml, the record of how it was trained."""
    saved = run / "config.yaml"
    if not saved.is_file():
        return
    before = flat_config((yaml.safe_load(saved.read_text()) or {}).get("data"))
    now = flat_config(yaml.safe_load(dump_fit_config(config)).get("data"))
    changed = [
        f"--data.{key} {now.get(key)!r} (the run: {before.get(key)!r})"
        for key in sorted(before.keys() | now.keys())
        if before.get(key) != now.get(key) and key.rpartition(".")[2] not in HOW_DATA_LOADS
    ]
    if changed:
        experiment = EXPERIMENT_ARG.get(logger_type(config.trainer.get("logger")), "name")
        raise ConfigError(
            f"--ckpt_path {found.path} continues the run {run}, which was trained with other data: "
            f"{', '.join(changed)}. Continue it with its own data (its config.yaml), or from this checkpoint in a"
            f" new run of another name: --trainer.logger.init_args.{experiment} <name>."
        )


def _runs_newest_first(config: Any) -> tuple[Path | None, Iterator[RunCheckpoint]]:
    """This experiment's folder and the last.ckpt of each of its runs that this logger can continue, newest first,
    each read when it is reached (an older run's file, cut off while it was written, matters only if reached)."""
    folder = experiment_dir(config)
    if folder is None:
        return None, iter(())
    logger_class = logger_type(config.trainer.get("logger"))
    paths = sorted(folder.glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    runs = (RunCheckpoint.read(path) for path in paths)
    return folder, (run for run in runs if can_continue(logger_class, run.tracker_runs))


def _last_checkpoint(config: Any, subcommand: str | None) -> RunCheckpoint | None:
    """`--ckpt_path last`: the newest last.ckpt of this experiment, across its runs, that this logger can continue.

    Lightning alone only looks in the new run's own (empty) folder and would silently start from scratch.
    """
    folder, runs = _runs_newest_first(config)
    if (newest := next(runs, None)) is not None:
        return newest
    if folder is None:
        return None
    if subcommand != "fit":
        raise MissingFileError(f"--ckpt_path last: no {folder}/*/checkpoints/last.ckpt found.")
    rank_zero_warn(f"--ckpt_path last: nothing to resume in {folder}; starting from scratch.")
    return None


def _best_checkpoint(config: Any) -> RunCheckpoint:
    """`--ckpt_path best`: the best-epoch checkpoint of this experiment's newest run that has one (Lightning's
    `best` means the best of a `fit` in the same process)."""
    folder, runs = _runs_newest_first(config)
    if folder is None:
        raise MissingFileError("--ckpt_path best: this run has no logger, so no run folder to look in; give the"
                               " checkpoint's path.")  # fmt: skip
    best = next((path for path in (run.best_checkpoint() for run in runs) if path is not None), None)
    if best is None:
        raise MissingFileError(
            f"--ckpt_path best: no best-epoch checkpoint recorded in {folder}/*/checkpoints/last.ckpt (a run"
            " writes one where --checkpoint.monitor names a metric); give a checkpoint's path, or `last`."
        )
    return RunCheckpoint.read(best)


class CheckpointAlone:
    """`validate|test|predict --ckpt_path <file>` without a config: the model and its datamodule as the checkpoint
    holds them (its model class and hyper-parameters; its datamodule's hyper-parameters, or else its run's
    config.yaml), with the command's flags on top."""

    PATH_LIKE = ("root", "_dir", "_file", "_path")  # data settings that name a file or folder

    def __init__(self, argv: list[str], record: RunCheckpoint) -> None:
        self.record = record
        data = self._data()
        if not record.model_class:
            raise ConfigError(
                f"--ckpt_path {record.path}: the checkpoint does not name its model's class (it was not written by"
                " this CLI): give --model <class> and --data <class>, or the --config of its job."
            )
        if data is None:
            raise ConfigError(
                f"--ckpt_path {record.path}: the checkpoint does not say which data it was trained on (its datamodule"
                " saves no hyper-parameters, and its run folder has no config.yaml): give --data <class> and its"
                " options, or the --config of its job."
            )
        self.data = data
        given = [f"--model={record.model_class}", f"--data={json.dumps(data, default=str)}", *self._run_folder(argv)]
        self.args = [argv[0], *given, *argv[1:]]

    def _run_folder(self, argv: list[str]) -> list[str]:
        """Flags that keep what the command writes with the checkpoint's job, not in the current folder: the logs
        of `validate` and `test` as a new run of that job (`<save_dir>/<job>/version_N`), `predict`'s CSV in the
        run's folder. None for a flag the command gives, or a checkpoint outside a run's `checkpoints/` folder."""
        run = self.record.path.parent.parent
        if self.record.path.parent.name != "checkpoints" or not run.name.startswith("version_"):
            return []
        if argv[0] == "predict":
            given = any(a.startswith("--predictions") for a in argv)
            return [] if given else [f"--predictions.output_file={run / 'predictions.csv'}"]
        if any(a.startswith("--trainer.logger") for a in argv):
            return []
        return [
            f"--trainer.logger.init_args.save_dir={run.parent.parent}",
            f"--trainer.logger.init_args.name={run.parent.name}",
        ]

    def _data(self) -> dict[str, Any] | None:
        saved = self.record.entries.get("datamodule_hyper_parameters")
        if isinstance(saved, dict) and saved.get("_class_path"):
            return {"class_path": saved["_class_path"], "init_args": {k: v for k, v in saved.items() if k[0] != "_"}}
        config = self.record.path.parent.parent / "config.yaml"  # <run>/checkpoints/<file>: the run's config
        if self.record.path.parent.name != "checkpoints" or not config.is_file():
            return None
        data = (yaml.safe_load(config.read_text()) or {}).get("data")
        return data if isinstance(data, dict) and data.get("class_path") else None

    def check_data_found(self, config: Any) -> None:
        """A file or folder the data was read from that is not there any more, unless a flag gives another one. A
        setting the training left at its default is the datamodule's own to look up (a `data_dir` it looks up with
        fallbacks of its own, a download folder): it says itself what it does not find."""
        now = leaves(config.data.get("init_args"))
        defaults = init_defaults(self.data["class_path"])
        for key, value in (self.data.get("init_args") or {}).items():
            given = key.endswith(self.PATH_LIKE) and isinstance(value, str) and now.get(key) == value
            if given and value != defaults.get(key) and not Path(value).exists():
                raise MissingFileError(
                    f"--ckpt_path {self.record.path} was trained on data from --data.{key} {value}, which is not"
                    f" there: give --data.{key} <where that data is now>."
                )


def init_defaults(class_path: str) -> dict[str, Any]:
    """The default of each argument the class takes, its base classes' included (where its **kwargs go)."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return {}
    defaults: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if "__init__" in vars(klass):
            parameters = inspect.signature(vars(klass)["__init__"]).parameters.values()
            defaults.update({p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty})
    return defaults


def checkpoint_alone(argv: list[str]) -> CheckpointAlone | None:
    """For `validate|test|predict --ckpt_path <file>` that names no config, model or data class: what rebuilds them."""
    if not argv or argv[0] not in ("validate", "test", "predict"):
        return None
    classes = ("--config", "--model", "--data")
    if any(a in classes or a.startswith(tuple(f"{c}=" for c in classes)) for a in argv[1:]):
        return None
    if any(k.startswith(f"PL_{argv[0].upper()}__{c[2:].upper()}") for k in os.environ for c in classes):
        return None
    paths = option_values(argv, "--ckpt_path")
    if not paths or paths[-1] == "hpc":
        return None
    if paths[-1] in ("last", "best"):
        raise ConfigError(
            f"--ckpt_path {paths[-1]} is found among the runs of a job: give its --config, or the checkpoint's path."
        )
    return CheckpointAlone(argv, RunCheckpoint.read(paths[-1]))


def build_model_from_checkpoint(cli: LightningCLI, record: RunCheckpoint, given: list[str]) -> None:
    """The model is built with the checkpoint's class and hyper-parameters, over the config: refuse a checkpoint of
    another model, and model settings given on top of the job (flags, stacked configs, the environment) that it
    would replace. `given`: the command line."""
    subcommand = cli.config.get("subcommand")
    if not subcommand or not record.hyper_parameters or cli.config[subcommand].get("model") is None:
        return
    explicit = _given_settings(cli, given, "model")
    before = cli.config[subcommand].model.clone()
    exit_on_error, cli.parser.exit_on_error = cli.parser.exit_on_error, False  # its error, raised: said here
    try:
        cli.config = cli.parser.parse_object({subcommand: {"model": model_config(record)}}, cli.config)
    except ArgumentError as err:
        raise ConfigError(_not_this_model(record, before.class_path, str(err))) from None
    finally:
        cli.parser.exit_on_error = exit_on_error
    after = cli.config[subcommand].get("model")
    for fact in set(after.get("dict_kwargs") or {}) & set(getattr(cli, "data_facts", ())):
        del after.dict_kwargs[fact]  # recorded by an earlier version (record_only_links_taken): the model took none
    if before.class_path != after.class_path:
        raise ConfigError(
            f"--ckpt_path {record.path} is a checkpoint of {after.class_path}, but this config's model is"
            f" {before.class_path}. Use the config of the run that wrote it, or start a new run from its weights"
            f" with --model.weights {record.path}."
        )
    old, new = leaves(before.get("init_args")), leaves(after.get("init_args"))
    changed = [
        f"--model.{key} {old[key]!r} (checkpoint: {new.get(key)!r})" for key in explicit if old[key] != new.get(key)
    ]
    if changed:
        raise ConfigError(
            f"--ckpt_path {record.path}: the model is built with the checkpoint's hyper-parameters, which differ"
            f" from {', '.join(changed)}, set by a flag, a stacked config or the environment. Drop them, or start"
            f" a new run from its weights with --model.weights {record.path}."
        )
    if after.init_args.get("weights"):  # the checkpoint's weights replace them: not read (or downloaded) again
        after.init_args.weights = None


def _not_this_model(record: RunCheckpoint, model_class: str, reason: str) -> str:
    """Why the checkpoint's hyper-parameters build no model of `model_class` (jsonargparse's `reason`), in one line:
    a checkpoint of another project's model (written by a plain `Trainer.save_checkpoint`, or by a CLI whose class
    cannot be imported here)."""
    refused = re.findall(r"Option '(\w+)' is not accepted", reason)
    if refused:
        why = f"its hyper-parameter {refused[-1]} is not an argument of {model_class.rpartition('.')[2]}"
    elif record.model_class and re.search(r"No module named|Unable to import|not found in module", reason):
        why = f"{record.model_class} cannot be imported here"
    else:
        why = f"its hyper-parameters do not build it ({' '.join(reason.split())[:200]})"
    theirs = record.model_class or "another model (its class is not saved in it)"
    return (
        f"--ckpt_path {record.path} is a checkpoint of {theirs}, not of this config's model {model_class}: {why}. Use"
        " it with the code and config of the run that wrote it."
    )


def restore_datamodule(cli: LightningCLI, record: RunCheckpoint, given: list[str], datamodule: Any) -> None:
    """A datamodule that learns something from its files (a vocabulary) gets what the checkpoint was trained with,
    before the model is built from it: evaluating or predicting then needs no training files."""
    state = record.datamodule_state(type(datamodule).__qualname__)
    if state is None:
        return
    before = dict(vars(datamodule))
    datamodule.load_state_dict(state)
    # Settings given on top of the job that the saved state replaced (a tokenizer, a context) are refused, as the
    # model's are: the datamodule's attributes of the same names that loading the state set to another value.
    explicit = _given_settings(cli, given, "data") if cli.config.get("subcommand") else {}
    held = vars(datamodule)
    replaced = [k for k, v in explicit.items() if held.get(k, v) is not before.get(k, v) and str(held.get(k)) != str(v)]
    changed = [f"--data.{k} {explicit[k]!r} (checkpoint: {held.get(k)!r})" for k in replaced]
    if changed:
        raise ConfigError(
            f"--ckpt_path {record.path}: the data is as the checkpoint saved it ({type(datamodule).__name__}'s"
            f" state), which differs from {', '.join(changed)}, set by a flag, a stacked config or the environment."
            " Drop them, or train a new run with them."
        )


def check_model_fits(record: RunCheckpoint, model: torch.nn.Module, data_facts: tuple[str, ...]) -> None:
    """The checkpoint's tensors have the shapes of the model built for this data (`data_facts`: the datamodule's
    facts linked into the model, such as input_shape or num_classes). Tensors of the model that the checkpoint lacks
    (a checkpoint of another model whose class it does not name) are refused here, before Lightning's 40-line error
    and before a run folder is made; a model with `strict_loading = False` takes them as they are."""
    state = model.state_dict()
    missing = [name for name, tensor in state.items() if isinstance(tensor, torch.Tensor) and name not in record.shapes]
    if missing and getattr(model, "strict_loading", True) is not False:
        others = [name for name in record.shapes if name not in state]
        held = f", and holds {len(others)} others ({', '.join(others[:3])})" if others else ""
        theirs = record.model_class or "another model (its class is not saved in it)"
        raise ConfigError(
            f"--ckpt_path {record.path} lacks {len(missing)} of the {len(state)} tensors of {type(model).__name__}"
            f" ({', '.join(missing[:3])}){held}: it is a checkpoint of {theirs}. Use it with the code and config of"
            " the run that wrote it."
        )
    mismatched = record.mismatched_shapes(state)
    if mismatched:
        facts = {k: v for k, v in record.hyper_parameters.items() if k in data_facts}
        raise ConfigError(
            f"--ckpt_path {record.path} does not fit the model built for this data ({len(mismatched)} tensors):"
            f" {'; '.join(mismatched[:3])}. The checkpoint was trained on data with {facts}: use that data"
            f" (its config), or start a new run from its weights with --model.weights {record.path}."
        )


def _given_settings(cli: LightningCLI, given: list[str], section: str) -> dict[str, Any]:
    """The settings of `section` (model or data) that the command line `given` sets on top of its job config (the
    first config file outside presets/), configs/defaults.yaml and the class's defaults: by flags, stacked configs
    or the environment; {setting: value}."""
    subcommand = cli.config.subcommand
    config = cli.config[subcommand]
    if not given or config.get(section) is None:  # given a parsed config (a script running jobs): the job
        return {}
    job = [str(p) for p in job_configs(config)][:1]
    parser = cli.subcommand_parser(subcommand)  # type: ignore[attr-defined]  # ProjectCLI's
    default_env, parser.default_env = parser.default_env, False
    classes = [f"--{name}={config[name].class_path}" for name in dict.fromkeys(("model", section))]  # both required
    try:  # the same class: a job config of it keeps its values, of another class gives the defaults
        base = parser.parse_args([*(f"--config={c}" for c in job), *classes])
    finally:
        parser.default_env = default_env
    now, job_values = leaves(config[section].get("init_args")), leaves(base[section].get("init_args"))
    flagged = [setting(a[2:].partition("=")[0]) for a in given if a.startswith(f"--{section}.")]
    return {
        key: value
        for key, value in now.items()
        if key != "weights"
        and (job_values.get(key, value) != value or any(f"{section}.{key}.".startswith(f"{f}.") for f in flagged))
    }


def job_configs(config: Any) -> list[Path]:
    """The config files of a parsed config that are not presets (configs/presets/): the job's, first."""
    return [Path(str(p)) for p in config.get("config") or [] if Path(str(p)).parent.name != "presets"]


def model_config(record: RunCheckpoint) -> dict[str, Any]:
    """The model's config as the checkpoint's hyper-parameters give it ({class_path, init_args}), as LightningCLI
    reads them from a checkpoint."""
    hparams = {k: v for k, v in record.hyper_parameters.items() if k not in ("_instantiator", "_class_path")}
    if record.model_class:
        return {"class_path": record.model_class, "dict_kwargs": hparams}
    return hparams


def setting(key: str) -> str:
    """A model setting's key without jsonargparse's `init_args`: `optimizer.init_args.lr` -> `optimizer.lr`."""
    return ".".join(part for part in key.split(".") if part != "init_args")


def flat_config(section: Any, prefix: str = "") -> dict[str, Any]:
    """A config section read from YAML as {`key.sub`: value}, without jsonargparse's `init_args`."""
    if not isinstance(section, dict):
        return {setting(prefix): section} if prefix else {}
    return {
        k: v for key, value in section.items() for k, v in flat_config(value, f"{prefix}.{key}".lstrip(".")).items()
    }


def leaves(namespace: Any) -> dict[str, Any]:
    return {setting(key): value for key, value in (namespace.items() if namespace is not None else [])}
