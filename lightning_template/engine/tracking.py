"""One seam between the project and the experiment trackers (TensorBoard, CSV, MLflow, W&B).

- `run_dir`: the run's own folder (where its checkpoints/ and config.yaml go), for any logger.
- `CheckpointFacts` (checkpoint.py): each checkpoint remembers which tracker run wrote it, so `--ckpt_path`
  continues that run (same TensorBoard version folder, MLflow run id, W&B run id).
- `SaveConfigToRun`: config.yaml into the run's folder, and into the tracker as an artifact.
- `keep_csv_metrics`: a continued CSV run keeps the rows its metrics.csv holds.
"""

from __future__ import annotations

import csv
import importlib
import secrets
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

from lightning import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from lightning_template.engine.errors import MissingPackageError

# Per logger class: the argument that groups runs (the job's name goes there) and the one naming a run.
EXPERIMENT_ARG = {
    "TensorBoardLogger": "name",
    "CSVLogger": "name",
    "MLFlowLogger": "experiment_name",
    "WandbLogger": "project",
}
RUN_ARG = {"TensorBoardLogger": "version", "CSVLogger": "version", "MLFlowLogger": "run_id", "WandbLogger": "id"}
CHECKPOINT_KEY = "tracker_runs"


def logger_type(logger_config: Any) -> str:
    """`TensorBoardLogger` for a parsed `--trainer.logger` ({class_path, init_args}); "" for none."""
    return str(getattr(logger_config, "class_path", "")).rpartition(".")[2]


def _run_name(logger: Logger) -> str:
    """What names a run to its logger: the version folder (`version_3`, as TensorBoard's and CSV's `version` argument
    takes it back) or the tracker's run id."""
    return logger.version if isinstance(logger.version, str) else f"version_{logger.version}"


def run_dir(trainer: Trainer) -> Path:
    """The run's folder, where Lightning puts its checkpoints/ (by ModelCheckpoint's rule, for any logger)."""
    if not trainer.loggers:
        return Path(trainer.default_root_dir)
    logger = trainer.loggers[0]
    return Path(logger.save_dir or trainer.default_root_dir) / str(logger.name) / _run_name(logger)


def tracker_runs_of(trainer: Trainer) -> dict[str, str]:
    """{logger class: what names the run to it}."""
    return {type(logger).__name__: _run_name(logger) for logger in trainer.loggers}


TRACKER_PACKAGES = {"MLFlowLogger": ("mlflow", "mlflow"), "WandbLogger": ("wandb", "wandb")}  # module, extra


def check_tracker_installed(logger_class: str) -> None:
    """Before anything is built: the tracker's package, or the command that installs it."""
    if logger_class not in TRACKER_PACKAGES:
        return
    module, extra = TRACKER_PACKAGES[logger_class]
    try:
        importlib.import_module(module)
    except ImportError:
        raise MissingPackageError(
            f"--trainer.logger {logger_class} needs the `{module}` package: uv sync --inexact --extra {extra}"
            " (or choose another logger preset in configs/presets/)."
        ) from None


FOLDER_LOGGERS = {"TensorBoardLogger", "CSVLogger"}  # a run is a version folder, whichever of them wrote it
SAVE_DIR_LOGGERS = {*FOLDER_LOGGERS, "WandbLogger"}  # those that write in their `save_dir` (MLflow: its store's)


def can_continue(logger_class: str, runs: dict[str, str]) -> bool:
    """Whether a run written by the loggers `runs` can be continued with `logger_class`."""
    if logger_class in FOLDER_LOGGERS:
        return not runs or bool(FOLDER_LOGGERS & runs.keys())  # no record: written before runs were recorded
    return logger_class in runs


def experiment_dir(config: Any) -> Path | None:
    """Where the runs of this config's experiment are (`<dir>/<run>/checkpoints/`), without starting a run; None
    without a logger."""
    logger, default_root_dir = config.trainer.get("logger"), config.trainer.default_root_dir
    logger_class, init_args = logger_type(logger), getattr(logger, "init_args", None)
    if init_args is None:
        return None
    name = init_args.get(EXPERIMENT_ARG.get(logger_class, "name"))
    if logger_class in FOLDER_LOGGERS:
        return Path(init_args.save_dir) / (name or "lightning_logs")
    if logger_class == "WandbLogger":
        return Path(init_args.get("save_dir") or default_root_dir or ".") / (name or "lightning_logs")
    root = Path(default_root_dir or ".")  # MLflow keeps checkpoints outside its store
    if logger_class == "MLFlowLogger":
        import mlflow

        experiment = mlflow.MlflowClient(init_args.get("tracking_uri")).get_experiment_by_name(name)
        return None if experiment is None else root / experiment.experiment_id
    return None


def folders_written(config: Any) -> list[tuple[Path, str]]:
    """The folders a run writes its logs and checkpoints in that an option names: (folder, the option)."""
    logger, default_root_dir = config.trainer.get("logger"), config.trainer.get("default_root_dir")
    save_dir = getattr(logger, "init_args", {}).get("save_dir")
    named = [(save_dir, "--trainer.logger.init_args.save_dir")] if logger_type(logger) in SAVE_DIR_LOGGERS else []
    named.append((default_root_dir, "--trainer.default_root_dir"))
    return [(Path(folder), option) for folder, option in named if folder]


class SaveConfigToRun(SaveConfigCallback):
    """config.yaml in the run's folder for every logger, and as a tracker artifact where there is one. A run that
    fails before its first step (a refused setting) removes the folder it made, saying so."""

    new_folder: Path | None = None

    def note_new_folder(self, trainer: Trainer) -> None:
        """Called by the CLI before `fit`: the run's folder is new if it does not exist yet. (Lightning makes it
        before any callback's `setup`, when it starts the loggers' experiments.)"""
        folder = run_dir(trainer)
        self.new_folder = folder if trainer.is_global_zero and not folder.exists() else None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        logger = trainer.logger
        if logger is not None and not isinstance(logger, (TensorBoardLogger, CSVLogger)):
            # trainer.log_dir would be one folder shared by every MLflow/W&B run: write to the run's own.
            self.save_to_log_dir = False
            if trainer.is_global_zero:
                folder = run_dir(trainer)
                folder.mkdir(parents=True, exist_ok=True)
                self.config_path = folder / self.config_filename
                self.parser.save(self.config, str(self.config_path), skip_none=False, overwrite=True)
        else:
            self.config_path = Path(trainer.log_dir or ".") / self.config_filename
        super().setup(trainer, pl_module, stage)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        folder, self.new_folder = self.new_folder, None
        if folder is None or not trainer.is_global_zero or trainer.global_step > 0 or not folder.is_dir():
            return
        if any(path.suffix == ".ckpt" for path in folder.rglob("*")):
            return
        shutil.rmtree(folder, ignore_errors=True)
        rank_zero_info(f"Removed {folder}: the run stopped before its first step and left nothing but its logs.")

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        path = getattr(self, "config_path", None)
        if path is None or not path.is_file():
            return
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                logger.experiment.log_artifact(logger.run_id, str(path))
            elif isinstance(logger, WandbLogger):
                logger.experiment.save(str(path), base_path=str(path.parent), policy="now")


def keep_csv_metrics(logger: Logger, resumed_at: int) -> None:
    """Lightning's CSV writer deletes the metrics.csv of the folder it starts in: a resumed run, which continues its
    run's folder, gives the writer back the rows and columns the stopped run wrote, and appends to them. Rows of
    steps from `resumed_at` (the checkpoint's step) on, which a run stopped later than its checkpoint (a crash, an
    earlier checkpoint) wrote, are left out: the resumed run logs those steps again (a run resumed at its end, its
    `final/` metrics)."""
    path = Path(logger.log_dir) / "metrics.csv" if isinstance(logger, CSVLogger) else None
    if path is None or not path.is_file():
        return
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        rows = [row for row in reader if int(float(row["step"] or 0)) < resumed_at]
        columns = list(reader.fieldnames or [])
    with warnings.catch_warnings():  # "Previous log files in this directory will be deleted": they are not
        warnings.filterwarnings("ignore", "Experiment logs directory")
        writer = logger.experiment
    with open(path, "w", newline="") as file:
        kept = csv.DictWriter(file, fieldnames=columns)
        kept.writeheader()
        kept.writerows(rows)
    writer.metrics_keys = columns


def name_new_run(logger_class: str, init_args: Any) -> None:
    """MLflow draws a run's name from Python's `random`, which the run's seed has fixed: every run of a job would
    get the same name. A new run without a name gets its start time, and 4 hex digits for runs started together."""
    if logger_class == "MLFlowLogger" and not init_args.get("run_name"):
        init_args.run_name = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def run_location(logger: Logger | None) -> str | None:
    """Where the run went, and the command (or address) that shows it, in one line."""
    if isinstance(logger, TensorBoardLogger):
        return f"TensorBoard logs: tensorboard --logdir {logger.log_dir}"
    if isinstance(logger, MLFlowLogger):
        client = logger.experiment
        run = client.get_run(logger.run_id)
        uri = client.tracking_uri
        experiment = client.get_experiment(run.info.experiment_id).name
        where = f"MLflow run {run.info.run_name} ({run.info.run_id}) in experiment {experiment}"
        if uri.startswith(("http://", "https://")):
            return f"{where}: {uri.rstrip('/')}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
        # The UI is in the full `mlflow` package; the `mlflow` extra has only the client (mlflow-skinny).
        return f"{where}: mlflow ui --backend-store-uri {uri}  (needs uv sync --inexact --extra mlflow-ui)"
    if isinstance(logger, WandbLogger):
        run = logger.experiment
        if run.offline:
            return f"W&B offline run {run.id}: wandb sync {Path(run.dir).parent}"
        return f"W&B run {run.id}: {run.url}"
    if logger is not None and logger.log_dir:
        return f"logs ({type(logger).__name__}): {logger.log_dir}"
    return None
