"""The Lightning CLI of the project, run by `python train.py fit|validate|test|predict --config configs/<job>.yaml`.

Any LightningModule and LightningDataModule can be chosen by class path (`--model my_project.MyModel`), those of
the tasks in `lightning_template/tasks/` also by class name (`--model SimpleCNN --data FashionMNISTDataModule`);
every argument of their `__init__` becomes a flag, documented by `--help`.

`configs/defaults.yaml` is read first, by every command: the logger, the best-epoch
checkpoint and early stopping are defined there once, so a job config holds only its
model, its data and what differs. What every run needs whatever its model — exact resume, the NaN guard,
the check of monitored metrics — is not configuration: this CLI installs it in every run (`installed_callbacks`).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import signal
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import yaml
from jsonargparse import Namespace
from lightning import LightningDataModule, Trainer
from lightning.pytorch.callbacks import (
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
)
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_template.engine.checkpoint import (
    CheckpointFacts,
    RunCheckpoint,
    build_model_from_checkpoint,
    check_model_fits,
    checkpoint_alone,
    flat_config,
    job_configs,
    resolve_checkpoint,
    restore_datamodule,
)
from lightning_template.engine.console import library_noise_quieted, progress_bar, quiet_warnings_of
from lightning_template.engine.epoch_metrics import EpochMetrics
from lightning_template.engine.errors import ConfigError, MissingFileError, ProjectError
from lightning_template.engine.facts import check_facts_reached_the_model, declared_facts, import_named_datamodule
from lightning_template.engine.finite_loss import FiniteLossGuard
from lightning_template.engine.lightning_internals import (
    CLIHooks,
    add_datamodule_hook,
    datamodules_named_by_class,
    record_only_links_taken,
    skip_idle_hooks,
    slurm_resume_path,
)
from lightning_template.engine.monitor import (
    COUNTERS,
    BestCheckpoint,
    EarlyStop,
    MonitoredMetrics,
    early_stopping_decided,
    monitoring_off,
)
from lightning_template.engine.predictions import CSVPredictionWriter
from lightning_template.engine.process_group import ProcessGroupTeardown, ThawedParameterSync, leave
from lightning_template.engine.resume import ResumeCheckpoint, exact_resume
from lightning_template.engine.storage import check_folder
from lightning_template.engine.tracking import (
    EXPERIMENT_ARG,
    SaveConfigToRun,
    check_tracker_installed,
    folders_written,
    keep_csv_metrics,
    logger_type,
    name_new_run,
    run_location,
)
from lightning_template.engine.unsaved_state import UnsavedState
from lightning_template.script_args import nearest_options, option_values

ROOT = Path(__file__).resolve().parents[2]  # the project: configs/ and the scripts
DEFAULTS = ROOT / "configs" / "defaults.yaml"
SUBCOMMANDS = ("fit", "validate", "test", "predict")
TASKS = "lightning_template.tasks"  # its subpackages' classes can be named without their module


def installed_callbacks() -> list[Any]:
    """In every run, whatever the model and data: exact resume with its last.ckpt (and the epoch's training metrics
    in a checkpoint written inside an epoch), the tracker run in each checkpoint, a stop at NaN, a check that
    monitored metrics are logged, the module's state no checkpoint holds named at a resume, DDP's processes kept the
    same (parameters unfrozen after DDP wrapped the model) and their clean exit, learning rates in the logs, and the
    console's progress."""
    return [
        CheckpointFacts(),  # first: a resume with another seed is refused before ExactResume says it continues
        *exact_resume(),  # ResumableBatches, ExactResume, GracefulStop: a batch seeded, its restart put right, a stop
        ProcessGroupTeardown(),
        ThawedParameterSync(),
        ResumeCheckpoint(),
        EpochMetrics(),
        UnsavedState(),
        FiniteLossGuard(),
        MonitoredMetrics(),
        LearningRateMonitor(logging_interval="step"),
        progress_bar(),
    ]


def import_tasks() -> dict[str, type]:
    """Import the classes every task package exports (its `__all__`), so that they can be named by class name
    alone (`--model SimpleCNN`); {name: class}."""
    package = importlib.import_module(TASKS)
    exported = {}
    for task in sorted(p.name for p in Path(package.__file__).parent.iterdir() if (p / "__init__.py").is_file()):
        module = importlib.import_module(f"{TASKS}.{task}")
        exported |= {name: getattr(module, name) for name in getattr(module, "__all__", ())}
    return exported


def class_of(class_path: str) -> Any:
    """What `module.Name` names, or None where it cannot be imported."""
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def is_subclass(class_path: str, base: type) -> bool:
    found = class_of(class_path)
    return isinstance(found, type) and issubclass(found, base)


def run_name(config: Any) -> str:
    """The job config's file name (`configs/simple_cnn.yaml` -> `simple_cnn`), presets aside."""
    if jobs := job_configs(config):
        return jobs[0].stem
    model = config.get("model")
    return str(getattr(model, "class_path", "run")).rpartition(".")[2].lower()


def _init_parameters(cls: Any) -> set[str]:
    """The arguments a class takes, its base classes' included (where its **kwargs go)."""
    try:
        mro = cls.__mro__
        return {p for c in mro if "__init__" in vars(c) for p in inspect.signature(vars(c)["__init__"]).parameters}
    except (AttributeError, TypeError, ValueError):
        return set()


def unreadable_config(argv: list[str]) -> str:
    """The first `--config` file of `argv` that is not valid YAML, as `path: reason`, or ""."""
    for path in option_values(argv, "--config"):
        try:
            yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as err:
            return f"{path}: {' '.join(str(err).split())}"
    return ""


def _is_utf8(word: str) -> bool:
    try:
        word.encode("utf-8")
    except UnicodeEncodeError:  # bytes Python could not decode, kept as surrogates
        return False
    return True


def check_text(argv: list[str]) -> None:
    """Refuse in one line a word of the command line that is not UTF-8 (a folder's name in bytes of another encoding),
    naming its option."""
    position = next((i for i, word in enumerate(argv) if not _is_utf8(word)), None)
    if position is None:
        return
    word = argv[position]
    flag = word.startswith("-") and "=" in word
    option = word.partition("=")[0] if flag else argv[position - 1] if position else "the command line"
    value = os.fsencode(word.partition("=")[2] if flag else word).decode("utf-8", "backslashreplace")
    raise ConfigError(
        f"{option} {value}: not UTF-8 (the run records every setting as UTF-8 text, in its config.yaml and logs):"
        " rename the folder or file in UTF-8, or give another."
    )


def one_line(message: str, argv: list[str]) -> str:
    """jsonargparse's message, or one line that says what it means where it is known to be unclear: a config file
    that is not YAML (its message lacks the file's name), a misspelled class (a list of Union subtypes), an option
    of another class of the same kind (image folders' `image_size` given to in-memory data)."""
    if "Problems parsing config" in message and (which := unreadable_config(argv)):
        return f"a config file is not valid YAML: {which}"
    key = re.match(r'Parser key "(\w+)"', message)
    if key and key.group(1) in ("model", "data") and (name := re.search(r"dot import path string: (\S+)", message)):
        return f"--{key.group(1)} {name.group(1)}: no such class (a task's class name, or an import path)"
    nested, classes = re.search(r"NestedArg\(key='(\w+)'", message), re.findall(r"class_path[ =]'([\w.]+)'", message)
    if key and nested and classes and "is not accepted" in message:
        option = nested.group(1)
        owners = [n for n, c in import_tasks().items() if isinstance(c, type) and option in _init_parameters(c)]
        if owners:
            return (
                f"--{key.group(1)}.{option} is an argument of {' / '.join(owners)}, not of"
                f" {classes[-1].rpartition('.')[2]} (this config's class)"
            )
    return message


def did_you_mean(message: str, parser: LightningArgumentParser) -> str:
    """A line suggesting the nearest option, class argument, choice or file for a parser error, or ""."""
    close = lambda word, choices: difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)  # noqa: E731
    suggestions: list[str] = []
    suggestions += nearest_options(message, parser)
    top, nested = re.match(r'Parser key "([\w.]+)"', message), re.search(r"NestedArg\(key='([\w.]+)'", message)
    classes = re.findall(r"class_path[ =]'([\w.]+)'", message)  # the last one is the class that refused the key
    if top and nested and classes and "is not accepted" in message:
        path, _, option = f"{top.group(1)}.{nested.group(1)}".rpartition(".")
        suggestions += [f"--{path}.{m}" for m in close(option, _init_parameters(class_of(classes[-1])))]
    if name := re.match(r"--(model|data) (\S+): no such class", message):
        suggestions += close(name.group(2), [n for n, c in import_tasks().items() if isinstance(c, type)])
    if found := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message):
        suggestions += close(found.group(1), re.findall(r"'([^']*)'", found.group(2)))
    if found := re.search(r"File does not exist: '([^']*)'", message):
        missing = Path(found.group(1))
        siblings = [p.name for p in missing.parent.iterdir()] if missing.parent.is_dir() else []
        suggestions += [str(missing.parent / m) for m in close(missing.name, siblings)]
    return f"did you mean {' / '.join(suggestions)}?\n" if suggestions else ""


def _refused_key(message: str, parser: LightningArgumentParser) -> tuple[str, str, list[str]] | None:
    """For a parser error refusing a key: (the key as the message names it, `model.dropot` or `trainer.max_epoch`;
    the class it is no argument of, or "" for the CLI's own options; the names valid in its place)."""
    if found := re.search(r"does not accept option '([\w.]+)'", message):  # a Trainer's or the CLI's own option
        return found.group(1), "", [option[2:] for option in parser._option_string_actions if option.startswith("--")]
    within, unknown = re.findall(r'Parser key "(\w+)"', message), re.findall(r"Option '(\w+)' is not accepted", message)
    classes = re.findall(r"class_path[ =]'([\w.]+)'", message)  # the last one is the class that refused the key
    if not within or not unknown or not classes or "NestedArg" in message:  # NestedArg: a flag's, not a file's
        return None
    return ".".join([*within, unknown[-1]]), classes[-1], sorted(_init_parameters(class_of(classes[-1])))


def misspelled_config_key(message: str, argv: list[str], parser: LightningArgumentParser) -> tuple[str, list[str]]:
    """For a key of a config file that no option or class argument takes: the error line naming the file and the key
    (`configs/job.yaml: model.dropot is not an option of SimpleCNN`), and the nearest valid key; ("", []) for
    another error."""
    refused = _refused_key(message, parser)
    if refused is None:
        return "", []
    key, owner, names = refused
    for path in [*reversed(option_values(argv, "--config")), str(DEFAULTS)]:  # the last file given wins
        try:
            if key not in flat_config(yaml.safe_load(Path(path).read_text())):
                continue
        except (OSError, yaml.YAMLError):
            continue
        if not owner:  # the CLI's options: full names
            return f"{path}: {key} is not an option", difflib.get_close_matches(key, names, n=1)
        within, _, leaf = key.rpartition(".")
        near = [f"{within}.{name}" for name in difflib.get_close_matches(leaf, names, n=1)]
        return f"{path}: {key} is not an option of {owner.rpartition('.')[2]}", near
    return "", []


_parsed_args: list[str] = []  # what ProjectCLI is parsing now


def named_subcommand(args: Any) -> str | None:
    """The subcommand that `args` names: a command line's first word that is not an option (or a `--config` file),
    or a parsed config's `subcommand`."""
    if not isinstance(args, list):
        named = args.get("subcommand") if hasattr(args, "get") else None
        return named if named in SUBCOMMANDS else None
    words = iter(str(a) for a in args)
    for word in words:
        if word in ("-c", "--config"):
            next(words, None)
        elif not word.startswith("-"):
            return word if word in SUBCOMMANDS else None
    return None


# What `--ckpt_path` takes here (Lightning's own help names its model registry and `hpc`, and not what `best` means).
CKPT_PATH_HELP = {
    "fit": "A checkpoint to continue from: its file (one of a run's checkpoints continues that run), `last` (the"
    " newest run of the job, exactly where it stopped) or `best` (the best-epoch checkpoint of the job's newest run"
    " that has one); a requeued SLURM job finds its own.",
    "evaluate": "The checkpoint to evaluate: its file (alone, without --config: the model and data it was trained"
    " with), `last` or `best` (of the job's newest run that has one).",
}


class ProjectParser(LightningArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # An option spelled in part is refused with the nearest full name, not read as whichever one it begins.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def add_method_arguments(self, class_type: type, method_name: str, *args: Any, **kwargs: Any) -> list[str]:
        """A subcommand's arguments, as Lightning's CLI adds them, with this project's help for `--ckpt_path`."""
        if method_name not in SUBCOMMANDS:
            return super().add_method_arguments(class_type, method_name, *args, **kwargs)
        self.subcommand_name = method_name  # the parser of this subcommand (`ProjectCLI.subcommand_parser`)
        kwargs["skip"] = {*(kwargs.get("skip") or ()), "ckpt_path"}
        added = super().add_method_arguments(class_type, method_name, *args, **kwargs)
        help_text = CKPT_PATH_HELP["fit" if method_name == "fit" else "evaluate"]
        self.add_argument("--ckpt_path", type=str | None, default=None, help=help_text)
        return [*added, "ckpt_path"]

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        """The reason first, with the nearest valid name, instead of argparse's 80-line usage above it."""
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):  # jsonargparse's raise, unchanged
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        command = parser.prog.replace(" [options]", "")
        argv = _parsed_args or sys.argv[1:]
        in_a_file, near = misspelled_config_key(message, argv, parser)
        message = in_a_file or one_line(message, argv)
        suggestion = f"did you mean {' / '.join(near)}?\n" if near else did_you_mean(message, parser)
        sys.stderr.write(f"error: {message}\n{suggestion}`{command} --help` lists the options.\n")
        self.exit(2)


class ProjectCLI(CLIHooks):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import_tasks()  # imported, the tasks' classes can be named alone: `--model SimpleCNN`
        given = sys.argv[1:] if kwargs.get("args") is None else kwargs["args"]
        if isinstance(given, list):
            import_named_datamodule([str(arg) for arg in given])
        self.data_facts = declared_facts()  # linked from the datamodule into the model (engine/facts.py)
        # default_env: every option can also be set from the environment, e.g. PL_FIT__TRAINER__MAX_EPOCHS=3.
        defaults = {"default_config_files": [str(DEFAULTS)], "default_env": True}
        parser_kwargs = kwargs.setdefault("parser_kwargs", {})
        self._subcommands = SUBCOMMANDS
        if kwargs.get("run", True):
            # A parser per subcommand reads every class's signature again: build only the one asked for (all of
            # them where none is named yet: `train.py --help`, a misspelled one).
            chosen = named_subcommand(given)
            self._subcommands = tuple(s for s in SUBCOMMANDS if chosen in (None, s) or s in parser_kwargs)
            parser_kwargs.setdefault("default_env", True)
            for subcommand in self._subcommands:
                parser_kwargs.setdefault(subcommand, defaults)
        else:
            parser_kwargs.update({**defaults, **parser_kwargs})
        kwargs.setdefault("parser_class", ProjectParser)
        kwargs.setdefault("trainer_defaults", {"callbacks": installed_callbacks()})
        kwargs.setdefault("save_config_callback", SaveConfigToRun)  # next to the checkpoints, and to the tracker
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})  # a rerun in the same folder may rewrite it
        # The model builds its optimizer (`--model.optimizer`, named param groups): no top-level --optimizer.
        kwargs.setdefault("auto_configure_optimizers", False)
        self.run_checkpoint: RunCheckpoint | None = None
        self.parsers: list[LightningArgumentParser] = []  # each one `init_parser` made
        with library_noise_quieted():  # and the warning filters a command adds (before_instantiate_classes)
            super().__init__(*args, **kwargs)

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """LightningCLI's parser (the main one, and one per subcommand), kept for `subcommand_parser`."""
        parser = super().init_parser(**kwargs)
        self.parsers.append(parser)
        return parser

    def subcommand_parser(self, subcommand: str) -> LightningArgumentParser:
        """The parser of one subcommand (`fit`, `validate`, ...): the one its arguments were added to."""
        return next(parser for parser in self.parsers if getattr(parser, "subcommand_name", None) == subcommand)

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]
        every = super().subcommands()
        return {name: every[name] for name in self._subcommands}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Links whose source or target a class lacks are skipped (image data has no vocabulary).
        for name in self.data_facts:
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")
        parser.add_lightning_class_args(BestCheckpoint, "checkpoint")  # the best epoch; see configs/defaults.yaml
        parser.add_lightning_class_args(EarlyStop, "early_stopping")
        parser.add_lightning_class_args(CSVPredictionWriter, "predictions")
        parser.add_argument(
            "--debug",
            type=bool,
            nargs="?",
            const=True,
            default=False,
            help="Show the Python traceback of an error (otherwise only its message); also PROJECT_DEBUG=1.",
        )
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="After `fit`, evaluate the best checkpoint on the test split (without --checkpoint.monitor: the last"
            " weights).",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        self._given = [str(a) for a in (sys.argv[1:] if args is None else args if isinstance(args, list) else [])]
        check_text(self._given)
        global _parsed_args
        _parsed_args = self._given  # for the parsers' error messages, which see no arguments
        alone = checkpoint_alone(self._given) if args is None or isinstance(args, list) else None
        with warnings.catch_warnings():  # the rebuilt command line is the user's, with the checkpoint's classes
            warnings.filterwarnings("ignore", "LightningCLI's args parameter is intended", module="lightning.pytorch")
            super().parse_arguments(parser, args if alone is None else alone.args)
        if alone is not None:
            alone.check_data_found(self.config[self._given[0]])
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        logger = config.trainer.get("logger")
        logger_args = getattr(logger, "init_args", None)
        logger_class = logger_type(logger)
        check_tracker_installed(logger_class)
        if subcommand != "predict":  # which writes its CSV alone
            for folder, option in folders_written(config):
                check_folder(folder, option)
        experiment_arg = EXPERIMENT_ARG.get(logger_class)
        if experiment_arg and logger_args.get(experiment_arg) in (None, "", "lightning_logs"):
            logger_args[experiment_arg] = run_name(config)  # the job's name, whatever the tracker
        name_new_run(logger_class, logger_args)
        if config.trainer.get("enable_checkpointing") is False:  # Lightning would refuse last.ckpt's callback
            raise ConfigError(
                "--trainer.enable_checkpointing false: every run writes last.ckpt (its exact resume). Leave it on;"
                " --checkpoint.monitor null leaves out the best-epoch checkpoint."
            )
        self.run_checkpoint = resolve_checkpoint(
            config, subcommand, lambda c: self.subcommand_parser("fit").dump(c, skip_none=False)
        )

    def apply_checkpoint(self) -> None:
        if self.run_checkpoint is not None:
            build_model_from_checkpoint(self, self.run_checkpoint, self._given)

    def before_instantiate_classes(self) -> None:
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        callbacks = self.trainer_defaults.get("callbacks", [])
        if subcommand != "fit":  # the checkpoint's callback states, which only `fit` restores, are not missed
            warnings.filterwarnings("ignore", "Be aware that when using `ckpt_path`", module="lightning.pytorch")
        if subcommand == "predict":
            self._prepare_predict(config)
        self.trainer_defaults["callbacks"] = default_callbacks_kept(config, callbacks)
        _keep_the_last_of_each_single_callback(config.trainer.get("callbacks") or [])
        checkpoint = config.get("checkpoint")
        if checkpoint is not None and checkpoint.get("monitor") and not checkpoint.get("filename"):
            checkpoint.filename = BestCheckpoint.filename_for(checkpoint.monitor)
            checkpoint.auto_insert_metric_name = False  # the name has its metrics' names
        add_datamodule_hook(self, self._restore_datamodule)
        record_only_links_taken(self)  # a fact the model does not take is not among its hyper-parameters

    def _prepare_predict(self, config: Namespace) -> None:
        """Nothing to log: no run folder (the CSV is the result), no config.yaml in it."""
        # A stream has no sample indices: CSVPredictionWriter numbers its rows by their place in the stream.
        warnings.filterwarnings("ignore", "Couldn't infer the batch indices", module="lightning.pytorch")
        config.trainer.logger = False
        self.save_config_callback = None
        # An earlier run's CSV goes before anything is built: a command refused while building leaves none.
        Path(config.predictions.output_file).unlink(missing_ok=True)

    def instantiate_classes(self) -> None:
        with datamodules_named_by_class():
            super().instantiate_classes()

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        # `--checkpoint.monitor null`, `--early_stopping.monitor null`: no best-epoch checkpoint, no early stopping.
        trainer.callbacks = [callback for callback in trainer.callbacks if not monitoring_off(callback)]
        skip_idle_hooks(trainer)
        return trainer

    def _restore_datamodule(self, datamodule: LightningDataModule) -> None:
        if self.run_checkpoint is not None:
            restore_datamodule(self, self.run_checkpoint, self._given, datamodule)

    def after_instantiate_classes(self) -> None:
        if self.datamodule is not None:
            quiet_warnings_of(self.datamodule)  # for this run: library_noise_quieted restores the filters after it
        if self.datamodule is not None and self.model is not None:
            check_facts_reached_the_model(self.datamodule, self.model, self.data_facts)
        if self.run_checkpoint is not None and self.model is not None:
            check_model_fits(self.run_checkpoint, self.model, self.data_facts)

    def _evaluate_only(self) -> None:
        # Checkpoint callbacks write nothing outside `fit`; restoring their state from the checkpoint would only warn
        # that "the dirpath has changed" (the best-epoch one comes from the `checkpoint` options).
        self.trainer.callbacks = [c for c in self.trainer.callbacks if not isinstance(c, ModelCheckpoint)]

    before_validate = before_test = _evaluate_only

    def before_predict(self) -> None:
        self._evaluate_only()
        for callback in self.trainer.callbacks:
            if isinstance(callback, CSVPredictionWriter):
                callback.remove_earlier_output(self.trainer)

    def _resumed_step(self) -> int | None:
        """The step the run continues from: its checkpoint's, or a requeued SLURM job's, which Lightning finds."""
        if self.run_checkpoint is not None:
            return self.run_checkpoint.global_step
        path = slurm_resume_path(self.trainer) if self.config["fit"].get("ckpt_path") in (None, "hpc") else None
        return RunCheckpoint.read(path).global_step if path else None

    def before_fit(self) -> None:
        # Fix the run's version folder now: a spawning launcher (ddp_spawn) would otherwise let each
        # launch pick the next free one, and `test_after_fit` would open a second run folder.
        if self.trainer.is_global_zero:
            resumed_at = self._resumed_step()
            for logger in self.trainer.loggers:
                _ = logger.version
                if resumed_at is not None:  # the resumed run's folder, whose metrics.csv goes on
                    keep_csv_metrics(logger, resumed_at)
        for callback in self.trainer.callbacks:
            if isinstance(callback, SaveConfigToRun):  # a run refused before its first step removes what it made
                callback.note_new_folder(self.trainer)
        # First: the check of monitored metrics looks at each validation before early stopping and checkpoints use
        # it; the parameters DDP averages are read before any callback's on_fit_start unfreezes some.
        first = (MonitoredMetrics, ThawedParameterSync)
        self.trainer.callbacks.sort(key=lambda callback: not isinstance(callback, first))

    def after_fit(self) -> None:
        trainer = self.trainer
        # Read before testing: loading the best checkpoint restores the callbacks' states of that epoch.
        best, lines = checkpoint_lines(trainer)
        if line := early_stopping_line(trainer):
            lines.insert(0, line)
        if self.config.fit.test_after_fit:
            try:
                trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best.best_model_path if best else None)
            except MissingFileError as missing:  # e.g. image folders without a test/ split: said, not a failure
                lines.append(f"test after fit skipped: {missing}")
        if not trainer.is_global_zero:
            return
        if location := run_location(trainer.logger):
            lines.append(location)
        tested = {k: float(v) for k, v in sorted(trainer.callback_metrics.items()) if k.startswith("test_")}
        lines += [f"test accuracy: {v:.4f}" if k == "test_acc" else f"{k}: {v:.4f}" for k, v in tested.items()]
        self._log_final_metrics()
        print("\n".join(lines), flush=True)

    def _log_final_metrics(self) -> None:
        """The run's last validation and test metrics, as `final/...`: on TensorBoard's HPARAMS tab with this run's
        settings, in any other logger as metrics at the last step."""
        trainer, logger = self.trainer, self.trainer.logger
        final = {f"final/{k}": float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("val_", "test_"))}
        if isinstance(logger, TensorBoardLogger):  # the HPARAMS tab: this run's settings next to its results
            logger.log_hyperparams(self.model.hparams, final)
            logger.finalize("success")  # fit already closed the writer; flush this last summary
        elif logger is not None and final:
            logger.log_metrics(final, step=trainer.global_step)
            logger.finalize("success")


def checkpoint_lines(trainer: Trainer) -> tuple[ModelCheckpoint | None, list[str]]:
    """The best checkpoint's callback (of the first that monitors a metric), and the lines naming the best and last
    checkpoints written."""
    lines = []
    best = next((c for c in trainer.checkpoint_callbacks if c.monitor and c.best_model_path), None)
    if best is not None:
        counted = best.best_model_score is None or best.monitor in COUNTERS  # the file's name says it
        score = "" if counted else f" ({best.monitor}={float(best.best_model_score):.4f})"
        lines.append(f"best checkpoint: {best.best_model_path}{score}")
    last = next((c.best_model_path for c in trainer.checkpoint_callbacks if isinstance(c, ResumeCheckpoint)), "")
    if last and Path(last).is_file():  # a save that was refused or failed names a file never written
        lines.append(f"last checkpoint: {last}")
    return best, lines


def early_stopping_line(trainer: Trainer) -> str | None:
    """Lightning's reason, as it was when early stopping decided to stop the run."""
    stopped = early_stopping_decided(trainer)
    if stopped is None or not trainer.should_stop:
        return None
    why = str(stopped.stopping_reason_message).removesuffix(" Signaling Trainer to stop.").rstrip(".")
    planned = f" of {trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""  # -1: none
    return f"early stopping: {why}; stopped after epoch {trainer.current_epoch}{planned}"


def default_callbacks_kept(config: Namespace, callbacks: list[Any]) -> list[Any]:
    """The engine's default callbacks less those the run's settings leave nothing to do or that it replaces."""
    if not config.trainer.get("logger"):  # --trainer.logger false: nothing to monitor learning rates into
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    classes = [getattr(c, "class_path", "") for c in config.trainer.get("callbacks") or []]
    if config.trainer.get("enable_progress_bar") is False or any(is_subclass(c, ProgressBar) for c in classes):
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]  # Lightning allows one, or none
    return callbacks


def _keep_the_last_of_each_single_callback(configured: list[Any]) -> None:
    """Stacked configs (a preset on a job) may each bring a callback of a class that allows one per run (it says
    so with `single_per_run = True`, e.g. TwoStageFinetuning): the later replaces the earlier, as a later config's
    value does."""
    by_class: dict[str, list[Any]] = {}
    for callback in configured:
        path = getattr(callback, "class_path", "")
        if getattr(class_of(path), "single_per_run", False):
            by_class.setdefault(path, []).append(callback)
    for path, callbacks in by_class.items():
        for replaced in callbacks[:-1]:
            configured.remove(replaced)
            rank_zero_info(
                f"{path.rpartition('.')[2]} {dict(callbacks[-1].get('init_args') or {})} replaces the earlier"
                f" {dict(replaced.get('init_args') or {})} (the later config wins)."
            )


def project_error(error: BaseException) -> ProjectError | None:
    """The `ProjectError` behind `error`, if any: the error itself or one it was raised from (jsonargparse wraps
    the errors of a model's `__init__` in its own)."""
    while error is not None and not isinstance(error, ProjectError):
        error = error.__cause__
    return error


def debug_requested(argv: list[str]) -> bool:
    """`--debug` / `--debug=true` on the command line, PROJECT_DEBUG=1 or PL_<COMMAND>__DEBUG=true."""
    switches = [
        v for k, v in os.environ.items() if k == "PROJECT_DEBUG" or (k.startswith("PL_") and k.endswith("DEBUG"))
    ]
    if any(value.lower() in ("1", "true", "yes") for value in switches):
        return True
    for position, arg in enumerate(argv):
        if arg == "--debug" or arg.startswith("--debug="):
            value = arg.partition("=")[2] or (argv[position + 1] if position + 1 < len(argv) else "true")
            return value.lower() in ("true", "1", "yes") or value.startswith("-")
    return False


def exit_on_error(run: Callable[[], Any]) -> Any:
    """Run a command; a `ProjectError` (a problem of the input, with its fix) is printed as its message, without
    the traceback, and exits 1 (under DDP, a process other than rank 0 names its rank); any other exception keeps its
    traceback. `--debug` or PROJECT_DEBUG=1 shows it."""
    try:
        return run()
    except SIGTERMException:  # stopped by SIGTERM or Ctrl-C after saving last.ckpt: not a success
        leave(128 + signal.SIGTERM)
    except Exception as error:
        cause = project_error(error)
        if cause is None or debug_requested(sys.argv[1:]):
            raise
        rank = f"[rank: {rank_zero_only.rank}] " if getattr(rank_zero_only, "rank", 0) else ""  # DDP: each says it
        print(f"\n{rank}Error: {cause}\n(--debug or PROJECT_DEBUG=1 shows the traceback)", file=sys.stderr, flush=True)
        leave(1)


def main() -> None:
    exit_on_error(ProjectCLI)
