"""A search space over train.py's own flags, written in YAML:

    model.optimizer.init_args.lr: {log_uniform: [1.0e-4, 1.0e-2]}
    model.dropout: {uniform: [0.0, 0.5]}
    model.hidden: {int: [64, 256]}
    data.batch_size: {choice: [64, 128, 256]}

Keys are any `--key` of `train.py fit` (checked against it before a trial runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml

from lightning_template.engine.errors import ConfigError

KINDS = ("uniform", "log_uniform", "int", "log_int", "choice")


class SpaceError(ConfigError):
    pass


@dataclass(frozen=True)
class Param:
    key: str
    kind: str
    values: tuple[Any, ...]

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.values))
        low, high = self.values
        log = self.kind.startswith("log_")
        if self.kind.endswith("int"):
            return trial.suggest_int(self.key, low, high, log=log)
        return trial.suggest_float(self.key, low, high, log=log)

    def contains(self, value: Any) -> bool:
        if self.kind == "choice":
            return value in self.values
        low, high = self.values
        return isinstance(value, (int, float)) and low <= value <= high

    def grid(self) -> list[Any]:
        if self.kind == "choice":
            return list(self.values)
        if self.kind == "int":
            return list(range(self.values[0], self.values[1] + 1))
        raise SpaceError(f"{self.key}: the grid sampler needs `choice` or `int`, not `{self.kind}`.")


def _param(key: str, spec: Any, source: Path) -> Param:
    where = f"{source}: {key}"
    if not (isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in KINDS):
        raise SpaceError(f"{where}: expected one of {{{', '.join(KINDS)}}} with its values, e.g. {{uniform: [0, 1]}}.")
    kind, values = next(iter(spec.items()))
    if not isinstance(values, list) or not values:
        raise SpaceError(f"{where}: `{kind}` needs a non-empty list of values.")
    if kind == "choice":
        return Param(key, kind, tuple(values))
    if len(values) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise SpaceError(f"{where}: `{kind}` needs [low, high] numbers, got {values}.")
    low, high = values
    if kind.endswith("int") and not all(isinstance(v, int) for v in values):
        raise SpaceError(f"{where}: `{kind}` needs integer bounds, got {values}.")
    if not low < high:
        raise SpaceError(f"{where}: empty or inverted range [{low}, {high}]; write [low, high] with low < high.")
    if kind.startswith("log_") and low <= 0:
        raise SpaceError(f"{where}: `{kind}` needs low > 0, got {low}.")
    return Param(key, kind, (low, high) if kind.endswith("int") else (float(low), float(high)))


def load_space(path: Path) -> list[Param]:
    if not path.is_file():
        raise SpaceError(f"--search {path}: no such file (see configs/search/ for examples).")
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}" if mark else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpaceError(f"--search {where}: not valid YAML ({problem}).") from None
    if not isinstance(spec, dict) or not spec:
        raise SpaceError(f"--search {path}: expected a mapping of train.py keys to ranges, e.g. 'model.dropout: ...'.")
    return [_param(str(key).removeprefix("--"), value, path) for key, value in spec.items()]
