"""Hyperparameter search with Optuna: a resumable, prunable, parallel study of train.py runs.

The study lives in a database (SQLite by default). Every trial is an ordinary `train.py fit`
run in `logs/tune/<study>/trial_NNNN/`. Running the same command again continues the study:

- a trial stopped by Ctrl-C or SIGTERM (which saves its last.ckpt) or killed outright is
  queued again with the same parameters and resumed from its last.ckpt in its own folder
  (exact resume, so it ends as if never stopped); it is counted once;
- the budget `--trials` counts finished trials (complete or pruned) of the whole study, so
  several processes or machines on one storage URL share it without running more.

A trial killed outright (SIGKILL, power loss) stays RUNNING in the database. Before each trial,
and at the next start, this machine's dead trials are recognised (their process is gone); other
machines' by Optuna's heartbeat after `grace_period` seconds. A process with no trial left to
start waits for the trials still running elsewhere, so that it resumes any whose process dies.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import random
import socket
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState, create_trial
from optuna_integration import PyTorchLightningPruningCallback

from lightning_template.engine.errors import ConfigError, ProjectError
from lightning_template.search import runs
from lightning_template.search.space import Param
from lightning_template.search.workers import process_alive, process_token

HEARTBEAT_S, GRACE_S = 30, 120
POLL_S = 2  # how often a worker with nothing left to start looks at the others' trials
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED)
SKIPPED = ("surplus", "duplicate_of")  # trials not run (over budget, a repeat): not counted in the budget
NOT_RUN = ("error", *SKIPPED)  # FAIL trials that are not re-queued (earlier versions stored skipped trials so)


class SearchError(ConfigError):
    pass


class TrialError(Exception):
    """A trial's training failed (NaN loss, out of memory, ...): recorded, and the search goes on."""


def open_storage(url: str) -> RDBStorage:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(10):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the heartbeat
                return RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)
        except Exception as err:
            # Processes started together on a new database race to create its tables: the losers retry.
            racing = any(word in str(err) for word in ("UNIQUE constraint", "already exists", "locked"))
            if not racing or attempt == 9:
                raise SearchError(
                    f"--storage {url}: cannot be opened ({type(err).__name__}: {str(err).splitlines()[0]}). Use"
                    " sqlite:///path/to/study.db, or an RDB URL such as postgresql://user:password@host/db whose"
                    " driver is installed."
                ) from None
            time.sleep(0.2 + random.random())
    raise AssertionError("unreachable")


def make_sampler(name: str, params: list[Param], seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler({p.key: p.grid() for p in params}, seed=seed)
    raise SearchError(f"--sampler {name}: choose tpe, random or grid.")


def make_pruner(name: str, warmup_epochs: int) -> optuna.pruners.BasePruner:
    if name == "median":  # stop a trial whose metric is worse than the median of earlier trials at that epoch
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=warmup_epochs)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise SearchError(f"--pruner {name}: choose median or none.")


def check_settings(study: optuna.Study, storage_url: str, now: dict[str, Any], params: list[Param]) -> None:
    """A study's trials all run with one set of train.py settings `now` (the searched keys aside): recorded until
    its first trial that trains, then a run with other flags or config contents is refused, naming what changed.
    A trial that failed before training started (a setting train.py refused) ran nothing: the same command with
    the setting fixed goes on with the same study."""
    before = study.user_attrs.get("settings")
    trained = [t for t in study.get_trials(deepcopy=False) if t.state != TrialState.FAIL or "run" in t.user_attrs]
    if before is None or not trained:  # new (or from before settings were recorded)
        study.set_user_attr("settings", now)
        return
    searched = {runs.setting_key(p.key) for p in params}  # set by each trial, whatever the flags say
    before, now = ({k: v for k, v in d.items() if k not in searched} for d in (before, now))
    if before != now:
        raise SearchError(
            f"study '{study.study_name}' in {storage_url} ran its trials with other train.py settings"
            f" ({runs.differences(before, now)}): give --study a new name for a new study, or run it with"
            " the flags it was run with."
        )


def check_choices(study: optuna.Study, params: list[Param], source: Path) -> None:
    """Optuna keeps a `choice` list fixed within a study (its trials fail on another): refused up front."""
    choices = {p.key: list(p.values) for p in params if p.kind == "choice"}
    for trial in study.get_trials(deepcopy=False):
        for key, distribution in trial.distributions.items():
            before = getattr(distribution, "choices", None)
            if key in choices and before is not None and list(before) != choices[key]:
                raise SearchError(
                    f"--search {source}: {key} has the choices {choices[key]}, but study '{study.study_name}' searched"
                    f" it over {list(before)}, and a study's choices cannot change: give --study a new name, or"
                    " restore them."
                )


def recover(study: optuna.Study, storage: RDBStorage, params: list[Param]) -> None:
    """Fail this machine's trials whose process died, then queue every interrupted trial once more."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # other machines' trials whose heartbeat stopped
    host, me = socket.gethostname(), process_token(os.getpid())
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        attrs = trial.user_attrs
        if attrs.get("host") == host and attrs.get("process", me) != me and not process_alive(attrs["process"]):
            storage.set_trial_user_attr(trial._trial_id, "interrupted", "process died")
            storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
    trials = study.get_trials(deepcopy=False)
    space = {p.key: p for p in params}
    for trial in trials:  # a waiting resumption without its grid point fails in GridSampler: give it its own
        if trial.state == TrialState.WAITING and "resumes" in trial.user_attrs:
            for key, value in _grid_point(trials[trial.user_attrs["resumes"]]).items():
                if key not in trial.system_attrs:
                    storage.set_trial_system_attr(trial._trial_id, key, value)
    requeued = {t.user_attrs.get("resumes") for t in trials}
    for trial in trials:
        if (
            trial.state == TrialState.FAIL
            and trial.params  # it ran (a trial killed before sampling left nothing to redo)
            and not any(key in trial.user_attrs for key in NOT_RUN)
            and trial.number not in requeued
            # Values the space no longer holds (a range narrowed after they failed) are not run again.
            and trial.params.keys() == space.keys()
            and all(space[key].contains(value) for key, value in trial.params.items())
        ):
            attrs = {"resumes": trial.number, "folder": trial.user_attrs.get("folder", f"trial_{trial.number:04d}")}
            if "run" in trial.user_attrs:
                attrs["run"] = trial.user_attrs["run"]  # where its last.ckpt and tracker run are
            # As study.enqueue_trial, and on the same grid point: GridSampler fails on a trial without one.
            system_attrs = {"fixed_params": trial.params, **_grid_point(trial)}
            study.add_trial(create_trial(state=TrialState.WAITING, system_attrs=system_attrs, user_attrs=attrs))


def _grid_point(trial: FrozenTrial) -> dict[str, Any]:
    return {key: trial.system_attrs[key] for key in ("grid_id", "search_space") if key in trial.system_attrs}


@dataclass
class Search:
    """What every trial shares: the job and its flags, the space, the budget and where runs go."""

    study: optuna.Study
    config: runs.RunConfig  # every trial's run, before its parameters are set
    job: runs.RunConfig  # the same without the flags of a trial's budget: what the best config is written from
    job_flags: list[str]  # --config=...: the job
    extra_flags: list[str]  # any other train.py flags given to every trial (e.g. a shorter budget)
    params: list[Param]
    trials: int
    group: str  # runs go to <save_dir>/<group>/<folder>/ (TensorBoard, CSV) or are named so (MLflow, W&B)
    monitor: str
    storage: RDBStorage

    def counted(self) -> list[FrozenTrial]:
        """The trials the budget counts: finished or running, the skipped ones (never run) aside."""
        trials = self.study.get_trials(deepcopy=False, states=(*COUNTED, TrialState.RUNNING))
        return [t for t in trials if not any(key in t.user_attrs for key in SKIPPED)]

    def budget_left(self) -> int:
        return self.trials - len(self.counted())

    def objective(self, trial: optuna.Trial) -> float:
        """A trial's run; a trial that must not run is stored as what it is: a repeat of a finished trial with that
        trial's value (Optuna's own recipe), any other skipped trial as pruned, with the reason."""
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("process", process_token(os.getpid()))
        if len([t for t in self.counted() if t.number < trial.number]) >= self.trials:
            trial.set_user_attr("surplus", True)
            raise optuna.TrialPruned("not run: another process took the budget's last trial first")
        values = {p.key: p.suggest(trial) for p in self.params}
        for other in self.counted():
            if other.number != trial.number and other.params == values:
                trial.set_user_attr("duplicate_of", other.number)
                if other.state == TrialState.COMPLETE:
                    return other.value
                raise optuna.TrialPruned(f"not run: the parameters of trial {other.number}, which is not finished")
        folder = trial.user_attrs.get("folder", f"trial_{trial.number:04d}")
        trial.set_user_attr("folder", folder)
        callbacks = [
            PyTorchLightningPruningCallback(trial, monitor=self.monitor),
            runs.RunStarted(lambda record: trial.set_user_attr("run", record)),
        ]
        try:  # values train.py refuses fail here too, marked as the trial's error: never queued again
            config = self.config.with_values(values).named(self.group, folder)
            config = config.resumed(trial.user_attrs.get("run"))  # an interrupted trial continues
            result = runs.fit(config, callbacks=callbacks)
        except (optuna.TrialPruned, runs.Interrupted):  # pruned; or stopped, and queued again next time
            raise
        except Exception as err:
            message = f"{type(err).__name__}: {err}"
            trial.set_user_attr("error", message[:500])
            if "run" not in trial.user_attrs:  # failed while building the run: a setting, not bad luck
                raise SearchError(f"trial {trial.number} failed before training started:\n{message}") from None
            raise TrialError(f"trial {trial.number}: {message}") from err
        trial.set_user_attr("metrics", result.metrics)
        if not math.isfinite(result.best_score):
            trial.set_user_attr("error", f"no finite {self.monitor} (did validation run?)")
            raise TrialError(f"trial {trial.number}: no finite {self.monitor}")
        return result.best_score

    def run(self, on_trial_end: Callable[[], None] | None = None) -> None:
        quiet = _QuietStop()
        optimize_log = logging.getLogger("optuna.study._optimize")
        optimize_log.addFilter(quiet)
        try:
            self._run(on_trial_end)
        finally:
            optimize_log.removeFilter(quiet)

    def _run(self, on_trial_end: Callable[[], None] | None) -> None:
        duplicates_in_a_row = failures_in_a_row = 0
        sampler = self.study.sampler
        while duplicates_in_a_row < 20:
            recover(self.study, self.storage, self.params)  # e.g. a trial another process left behind
            if self.budget_left() <= 0:
                # The last trials run in other processes: wait for them, to resume any whose process dies.
                if not self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                    break
                time.sleep(POLL_S)
                continue
            waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            grid = isinstance(sampler, optuna.samplers.GridSampler)
            if grid and not waiting and sampler.is_exhausted(self.study):
                print("The grid is exhausted.", flush=True)
                break
            before = len(self.study.trials)
            self.study.optimize(self.objective, n_trials=1, catch=(TrialError,), gc_after_trial=True)
            trial = self.study.trials[before] if len(self.study.trials) > before else None
            if trial is not None and "surplus" in trial.user_attrs:
                continue  # another process took the last trial: wait for it as for any running trial
            duplicates_in_a_row = duplicates_in_a_row + 1 if trial and "duplicate_of" in trial.user_attrs else 0
            failures_in_a_row = failures_in_a_row + 1 if trial and "error" in trial.user_attrs else 0
            if failures_in_a_row == 3:
                raise SearchError(f"3 trials in a row failed, the last with: {trial.user_attrs['error']}")
            if on_trial_end is not None:
                on_trial_end()
        if duplicates_in_a_row >= 20:
            print("The sampler keeps proposing parameters already run: the space is exhausted.", flush=True)


class _QuietStop(logging.Filter):
    """Optuna logs a trial stopped by Ctrl-C or SIGTERM and a trial refused for its settings as failures, with the
    traceback: the search says each in one line instead (a trial that fails in training keeps
    its traceback, unless the error is one of a user's input, with its fix)."""

    stopping = False
    mute_next_value = False  # the "Trial N failed with value None." record after a muted one

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, runs.Interrupted):
            self.stopping = True
        if self.stopping:
            return False
        if error is not None and _said_in_one_line(error):
            self.mute_next_value = True
            return False
        if self.mute_next_value and "failed with value" in record.getMessage():
            self.mute_next_value = False
            return False
        return True


def _said_in_one_line(error: BaseException) -> bool:
    """Errors the search reports itself: its own refusals, a trial's error of the user's input."""
    if isinstance(error, SearchError):
        return True
    return isinstance(error, TrialError) and isinstance(error.__cause__, ProjectError)


def trial_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """One row per trial that ran: number, state, value, parameters, epochs, time and folder."""
    rows = []
    resumed_by = {t.user_attrs["resumes"]: t.number for t in study.trials if "resumes" in t.user_attrs}
    for t in study.trials:
        if "surplus" in t.user_attrs or "duplicate_of" in t.user_attrs:
            continue
        state = t.state.name.lower()
        if t.number in resumed_by:
            state = f"interrupted, resumed as #{resumed_by[t.number]}"
        elif "error" in t.user_attrs:
            state = "failed: " + " ".join(t.user_attrs["error"].split())[:80]
        duration = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete else None
        rows.append(
            {
                "trial": t.number,
                "state": state,
                "value": t.value,
                **t.params,
                "epochs": max(t.intermediate_values) + 1 if t.intermediate_values else "",
                "seconds": round(duration, 1) if duration is not None else "",
                "folder": t.user_attrs.get("folder", ""),
            }
        )
    return rows


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value).replace("|", "/")


def write_report(study: optuna.Study, search: Search, out: Path, final: bool = True) -> Path | None:
    """results.csv and results.md in `out`; if `final`, best.yaml and plots/*.png too (returns best.yaml)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = trial_rows(study)
    columns = ["trial", "state", "value", *(p.key for p in search.params), "epochs", "seconds", "folder"]
    _atomic_write(out / "results.csv", lambda f: _write_csv(f, columns, rows))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    _atomic_write(out / "results.md", lambda f: f.write("\n".join(lines) + "\n"))
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not (final and complete):
        return None
    best = study.best_trial
    kept = runs.without_budget(search.extra_flags)
    path = out / f"{study.study_name}_best.yaml"  # its runs are named after the file: logs/<study>_best/
    header = (
        f"# Best trial of study '{study.study_name}': #{best.number}, {search.monitor} = {best.value:.4f}"
        f" (run: {best.user_attrs.get('run', {}).get('run_dir', best.user_attrs.get('folder'))}).\n"
        f"# The job ({', '.join(f.removeprefix('--config=') for f in search.job_flags)}) with the best parameters;"
        f" the search's budget flags are left out: {' '.join(sorted(set(search.extra_flags) - set(kept))) or 'none'}\n"
        f"# python train.py fit --config {path}\n"
    )
    body = search.job.with_values(best.params).job_yaml()
    _atomic_write(path, lambda f: f.write(header + body))
    _plots(study, out / "plots")
    return path


def _write_csv(f: Any, columns: list[str], rows: list[dict[str, Any]]) -> None:
    writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", newline="") as f:
        write(f)
    tmp.replace(path)


def _plots(study: optuna.Study, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as vis

    folder.mkdir(parents=True, exist_ok=True)
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    plots = {"optimization_history": vis.plot_optimization_history, "parallel_coordinate": vis.plot_parallel_coordinate}
    if len(complete) >= 2:  # importance needs a spread of results
        plots["param_importances"] = lambda s: vis.plot_param_importances(
            s, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
        )
    for name, plot in plots.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the matplotlib backend is marked experimental
                axes = plot(study)
        except (ValueError, RuntimeError) as err:  # e.g. too few distinct values to rank importances
            print(f"plot {name} skipped: {err}", flush=True)
            continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        figure.set_size_inches(9, 5.5)
        figure.tight_layout()
        figure.savefig(folder / f"{name}.png", dpi=100)
        plt.close(figure)
