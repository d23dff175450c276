"""Facts about the data that the model needs (`num_classes`, `input_shape`, a vocabulary's size...), stated once, by
the datamodule: a datamodule class names them in its `model_facts`, and train.py passes each to the model's argument
of the same name (when both have it), so that `num_classes` is never typed twice.

The links are made when train.py builds its parser, before it reads which datamodule the run uses: it links the
facts of every datamodule class imported by then, which are every task's (train.py imports them all), the one named
by its full path on the command line or in a --config file, and any a script imported before starting the CLI."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import yaml
from lightning import LightningDataModule, LightningModule

from lightning_template.engine.errors import ConfigError

FACTS = "model_facts"  # the class attribute: the names of the datamodule's attributes the model receives


def declared_facts() -> tuple[str, ...]:
    """The facts that the datamodule classes imported in this process declare."""
    facts, classes = set(), [LightningDataModule]
    while classes:
        cls = classes.pop()
        facts.update(getattr(cls, FACTS, ()))
        classes.extend(cls.__subclasses__())
    return tuple(sorted(facts))


def _named_data(args: list[str]) -> Iterator[str]:
    """The datamodule classes that `args` name: `--data X`, `--data.class_path X`, `data:` in a --config file."""
    for flag, following in zip(args, [*args[1:], ""], strict=True):
        key, equals, inline = flag.partition("=")
        value = inline if equals else following
        if key in ("--data", "--data.class_path"):
            yield value
        elif key in ("--config", "-c") and Path(value).is_file():
            data = _config_data(Path(value))
            yield str(data.get("class_path", "") if isinstance(data, dict) else data or "")


def _config_data(path: Path) -> object:
    """The `data` entry of a config file; None where it has none or cannot be read (the parser says why)."""
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return config.get("data") if isinstance(config, dict) else None


def import_named_datamodule(args: list[str]) -> None:
    """Import the module of a datamodule that `args` name by its full path (`--data my_task.data.MyData`), so that
    its facts are among those linked. A path that does not import is left for the parser to report."""
    for path in _named_data(args):
        module = path.rpartition(".")[0]
        if module:
            try:
                importlib.import_module(module)
            except ImportError:
                continue


def check_facts_reached_the_model(datamodule: LightningDataModule, model: LightningModule, linked: tuple) -> None:
    """A fact the datamodule declares, not linked (its class imported only while the arguments were read), with
    which the model was built otherwise: refused, rather than trained with the model's default."""
    for name in getattr(datamodule, FACTS, ()):
        stated = getattr(datamodule, name)
        if name not in linked and name in model.hparams and model.hparams[name] != stated:
            cls = type(datamodule)
            raise ConfigError(
                f"{cls.__name__} hands {name}={stated!r} to the model, which was built with {model.hparams[name]!r}:"
                f" train.py reads a datamodule's facts before it parses the arguments; name it by its full path"
                f" (--data {cls.__module__}.{cls.__qualname__}) or export it from a task package."
            )
