"""Hyperparameter search (tune.py), seeds and k-fold (multirun.py): each trial and run a real train.py run."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from lightning_template.search import runs
from lightning_template.search.space import SpaceError, load_space

import multirun
import tune
from tests.conftest import ROOT, run_cli, warning_filters_added_by_importing

JOB = str(ROOT / "configs" / "simple_cnn.yaml")
JOB_VALUES = yaml.safe_load(Path(JOB).read_text())
JOB_LR = JOB_VALUES["model"]["init_args"]["optimizer"]["init_args"]["lr"]
TINY = [
    "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=2", "--trainer.max_epochs=2",
    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--test_after_fit=false",
]  # fmt: skip
ONE_EPOCH = [*TINY, "--trainer.max_epochs=1"]
# Flags that make other runs of ONE_EPOCH's, and how a refusal names them.
OTHER_FLAGS = [
    ("--trainer.max_epochs=3", "trainer.max_epochs 1 → 3"),
    ("--model.optimizer.init_args.lr=0.5", f"model.optimizer.init_args.lr {JOB_LR} → 0.5"),
]


def write_space(path: Path, space: dict) -> Path:
    path.write_text(yaml.safe_dump(space))
    return path


def load(folder: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{folder / 'study.db'}")


@pytest.mark.slow
def test_search_prunes_a_bad_trial_and_writes_table_plots_and_best_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # Two learning rates that learn and two that cannot: after 2 trials, a non-learner is pruned after 1 epoch.
    space = write_space(tmp_path / "space.yaml", {"model.optimizer.init_args.lr": {"choice": [3e-3, 1e-7, 2e-3, 2e-7]}})
    tune.main(["--config", JOB, "--search", str(space), "--trials", "4", "--study", "s", "--sampler", "grid",
               "--seed", "1", "--prune_after_epochs", "0", *TINY])  # fmt: skip
    out = tmp_path / "logs" / "tune" / "s"
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["trial"] for r in rows] == ["0", "1", "2", "3"]
    pruned = [r for r in rows if r["state"] == "pruned"]
    assert pruned, rows
    assert all(float(r["model.optimizer.init_args.lr"]) < 1e-6 and r["epochs"] == "1" for r in pruned)
    complete = [r for r in rows if r["state"] == "complete"]
    assert all(r["epochs"] == "2" for r in complete)
    for row in rows:  # every trial is an ordinary run: its own folder and config.yaml
        config = yaml.safe_load((out / row["folder"] / "config.yaml").read_text())
        assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == float(
            row["model.optimizer.init_args.lr"]
        )
    assert "| trial | state | value |" in (out / "results.md").read_text()
    assert {p.name for p in (out / "plots").glob("*.png")} == {
        "optimization_history.png", "parallel_coordinate.png", "param_importances.png",
    }  # fmt: skip
    best = max(complete, key=lambda r: float(r["value"]))
    best_config = yaml.safe_load((out / "s_best.yaml").read_text())
    assert best_config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == float(
        best["model.optimizer.init_args.lr"]
    )
    job_epochs = JOB_VALUES["trainer"]["max_epochs"]  # the job's length, not the trials' short one
    assert best_config.get("trainer", {}).get("max_epochs", job_epochs) == job_epochs
    runs.RunConfig.parse([f"--config={out / 's_best.yaml'}"])  # ready to run with train.py


def start_search(cwd: Path, study: str, trials: int, space: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}  # two at once on 2 cores
    command = [sys.executable, str(ROOT / "tune.py"), "--config", JOB, "--search", str(space), "--trials",
               str(trials), "--study", study, "--sampler", "random", "--pruner", "none", *extra]  # fmt: skip
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


SPACE = {"model.optimizer.init_args.lr": {"log_uniform": [1e-3, 1e-2]}, "model.dropout": {"uniform": [0.0, 0.5]}}
LONGER = ["--trainer.limit_train_batches=20", "--trainer.limit_val_batches=2", "--trainer.max_epochs=3",
          "--trainer.enable_progress_bar=false", "--test_after_fit=false"]  # fmt: skip


def stop_when(process: subprocess.Popen, path: Path, signum: int) -> str:
    """Send `signum` as soon as `path` exists (a trial's first epoch-end checkpoint): in the middle of that trial."""
    deadline = time.monotonic() + 240
    while not path.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signum)
    output = process.communicate()[0]
    assert path.exists(), output[-3000:]
    return output


@pytest.mark.slow
def test_search_stopped_by_sigterm_or_killed_resumes_the_trial_and_finishes_the_exact_count(tmp_path):
    space = write_space(tmp_path / "space.yaml", SPACE)
    out = tmp_path / "logs" / "tune" / "k"
    first = start_search(tmp_path, "k", 2, space, *LONGER)
    stop_when(first, out / "trial_0000" / "checkpoints" / "last.ckpt", signal.SIGTERM)
    assert first.returncode == 143  # stopped at a step boundary, last.ckpt saved
    (stopped,) = load(out, "k").trials
    assert stopped.state == TrialState.FAIL and "error" not in stopped.user_attrs

    second = start_search(tmp_path, "k", 2, space, *LONGER)
    stop_when(second, out / "trial_0002" / "checkpoints" / "last.ckpt", signal.SIGKILL)  # no clean-up at all
    study = load(out, "k")
    assert study.trials[1].user_attrs["resumes"] == 0 and study.trials[1].state == TrialState.COMPLETE
    assert study.trials[2].state == TrialState.RUNNING  # killed in the middle of the trial

    result = run_cli("--config", JOB, "--search", str(space), "--trials", "2", "--study", "k", "--sampler",
                     "random", "--pruner", "none", *LONGER, cwd=tmp_path, script="tune.py")  # fmt: skip
    study = load(out, "k")
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.FAIL,
                                               TrialState.COMPLETE]  # fmt: skip
    assert study.trials[2].user_attrs["interrupted"] == "process died"
    for interrupted, resumed in ((0, 1), (2, 3)):  # same parameters, same folder, counted once
        assert study.trials[resumed].user_attrs["resumes"] == interrupted
        assert study.trials[resumed].params == study.trials[interrupted].params
        assert study.trials[resumed].user_attrs["folder"] == f"trial_{interrupted:04d}"
    checkpoint = Path("logs/tune/k/trial_0002/checkpoints/last.ckpt")
    assert f"Restoring states from the checkpoint path at {checkpoint}" in result.stdout + result.stderr
    table = (out / "results.md").read_text()
    assert "interrupted, resumed as #1" in table and "interrupted, resumed as #3" in table


@pytest.mark.slow
def test_two_processes_on_one_storage_share_the_budget_without_duplicates(tmp_path):
    space = write_space(tmp_path / "space.yaml", SPACE)
    workers = [start_search(tmp_path, "p", 4, space, *TINY) for _ in range(2)]
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    study = load(tmp_path / "logs" / "tune" / "p", "p")
    finished = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(finished) == 4
    assert len({tuple(sorted(t.params.items())) for t in finished}) == 4
    assert len({t.user_attrs["folder"] for t in finished}) == 4
    assert len({t.user_attrs["process"] for t in finished}) == 2  # both processes ran trials


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({"model.dropout": {"uniform": [0.5, 0.1]}}, "empty or inverted range [0.5, 0.1]"),
        ({"model.dropout": {"uniform": [0.2, 0.2]}}, "empty or inverted range"),
        ({"model.optimizer.init_args.lr": {"log_uniform": [0, 1]}}, "needs low > 0"),
        ({"data.batch_size": {"choice": []}}, "non-empty list"),
        ({"model.dropout": {"normal": [0, 1]}}, "expected one of {uniform, log_uniform, int, log_int, choice}"),
    ],
)
def test_bad_search_space_is_refused_naming_the_key(tmp_path, space, message):
    with pytest.raises(SpaceError, match=r"space\.yaml: ") as error:
        load_space(write_space(tmp_path / "space.yaml", space))
    assert message in str(error.value) and next(iter(space)) in str(error.value)


@pytest.mark.parametrize(
    ("space", "extra", "message"),
    [
        ({"model.no_such_option": {"uniform": [0, 1]}}, [], "refuses the key or value of model.no_such_option"),
        ({"model.dropout": {"uniform": [0, 1]}}, ["--storage", "postgresql://nobody@127.0.0.1:1/x"], "--storage"),
        # A misspelled option of tune.py's own goes to train.py, which refuses it; the nearest is tune.py's.
        ({"model.dropout": {"uniform": [0, 1]}}, ["--trails", "3"], "--trails 3\ndid you mean --trials?"),
        # One of train.py's: the nearest is train.py's.
        (
            {"model.dropout": {"uniform": [0, 1]}},
            ["--trainer.max_epoch", "1"],
            "--trainer.max_epoch 1\ndid you mean --trainer.max_epochs?",
        ),
    ],
)
def test_search_refuses_unknown_key_or_bad_storage_before_training(
    tmp_path, monkeypatch, capsys, space, extra, message
):
    monkeypatch.chdir(tmp_path)
    path = write_space(tmp_path / "space.yaml", space)
    with pytest.raises(SystemExit) as stop:
        tune.main(["--config", JOB, "--search", str(path), "--trials", "2", *extra])
    assert message in str(stop.value.code)
    assert not list(tmp_path.glob("logs/tune/*/trial_*"))  # nothing trained


@pytest.mark.slow
def test_a_trial_that_cannot_start_stops_the_search_with_its_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = write_space(tmp_path / "space.yaml", {"model.dropout": {"uniform": [0, 0.5]}})
    with pytest.raises(SystemExit) as stop:
        tune.main(["--config", JOB, "--search", str(path), "--trials=3", "--study=f", *TINY, "--data.num_folds=1"])
    assert stop.value.code == 1
    assert "failed before training started" in capsys.readouterr().err
    assert len(load(tmp_path / "logs" / "tune" / "f", "f").trials) == 1  # not one failing trial after another
    # It trained nothing with that setting: the same command without it goes on with the study.
    tune.main(["--config", JOB, "--search", str(path), "--trials=1", "--study=f", *TINY])
    states = [trial.state for trial in load(tmp_path / "logs" / "tune" / "f", "f").trials]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE]


@pytest.mark.slow
def test_three_fold_run_summarises_mean_and_std_and_skips_finished_folds(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    multirun.main(["--config", JOB, "--folds", "3", "--name", "cv", *TINY])
    out = tmp_path / "logs" / "multirun" / "cv"
    summary = (out / "summary.md").read_text().splitlines()
    assert summary[0].startswith("| run | best val_acc |")
    assert [line.split(" | ")[0] for line in summary[2:]] == ["| fold_0", "| fold_1", "| fold_2", "| mean", "| std"]
    scores = [json.loads((out / f"fold_{i}" / "result.json").read_text())["best_score"] for i in range(3)]
    mean_cell = summary[5].split(" | ")[1]
    assert abs(float(mean_cell) - sum(scores) / 3) < 1e-4
    for i in range(3):  # each fold is an ordinary run of fold i
        config = yaml.safe_load((out / f"fold_{i}" / "config.yaml").read_text())
        assert config["data"]["init_args"]["num_folds"] == 3 and config["data"]["init_args"]["fold"] == i
    capsys.readouterr()
    multirun.main(["--config", JOB, "--folds", "3", "--name", "cv", *TINY])
    assert capsys.readouterr().out.count("done before") == 3


@pytest.mark.slow
@pytest.mark.matrix  # nightly (make matrix)
def test_grid_search_stopped_by_sigterm_says_so_in_one_line_and_the_same_command_finishes_the_grid(tmp_path):
    space = write_space(tmp_path / "space.yaml", {"model.optimizer.init_args.lr": {"choice": [3e-3, 2e-3]}})
    out = tmp_path / "logs" / "tune" / "g"
    grid = ["--sampler", "grid", *LONGER]
    first = start_search(tmp_path, "g", 2, space, *grid)
    output = stop_when(first, out / "trial_0000" / "checkpoints" / "last.ckpt", signal.SIGTERM)
    assert first.returncode == 143
    assert "Traceback" not in output and "failed with" not in output, output[-3000:]
    assert (
        output.splitlines()[-1]
        == "Search stopped (logs/tune/g/results.md so far): run the same command to continue it."
    )
    assert not (out / "plots").exists()  # no plots or best config on a stop: it exits at once

    run_cli("--config", JOB, "--search", str(space), "--trials", "2", "--study", "g", "--pruner", "none", *grid,
            cwd=tmp_path, script="tune.py")  # fmt: skip
    study = load(out, "g")
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert study.trials[1].user_attrs["resumes"] == 0 and study.trials[1].params == study.trials[0].params
    assert {t.params["model.optimizer.init_args.lr"] for t in study.trials[1:]} == {3e-3, 2e-3}  # the whole grid


def test_search_space_with_a_yaml_syntax_error_names_the_file_and_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "space.yaml"
    path.write_text("model.dropout: {uniform: [0.0, 0.5]}\nmodel.hidden: {int: [64, 256}\n")
    with pytest.raises(SystemExit) as stop:
        tune.main(["--config", JOB, "--search", str(path)])
    assert re.fullmatch(rf"tune\.py: --search {re.escape(str(path))}, line 2: not valid YAML \(.+\)\.", stop.value.code)


@pytest.mark.slow
def test_every_choice_is_checked_up_front_and_a_trial_that_failed_by_its_value_is_not_run_again(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = ["--config", JOB, "--trials", "1", "--study", "c", "--sampler", "random", "--seed", "0", *ONE_EPOCH]
    typo = write_space(tmp_path / "typo.yaml", {"model.schedule": {"choice": ["cosine", "cosinus"]}})
    with pytest.raises(SystemExit) as stop:
        tune.main([*command, "--search", str(typo)])
    assert "refuses the key or value of model.schedule ('cosinus')" in stop.value.code
    assert not (tmp_path / "logs" / "tune" / "c").exists()  # before any trial
    # Trials that failed by their values, stored failed without an error (as the search once left them):
    # a choice list the study no longer has is refused up front; a range value outside the fixed file is not rerun.
    (tmp_path / "logs" / "tune" / "c").mkdir(parents=True)
    study = optuna.create_study(study_name="c", storage="sqlite:///logs/tune/c/study.db", direction="maximize")
    for key, value, distribution in (
        ("model.schedule", "cosinus", CategoricalDistribution(["cosine", "cosinus"])),
        ("model.dropout", 1.5, FloatDistribution(0.0, 2.0)),
    ):
        study.add_trial(create_trial(state=TrialState.FAIL, params={key: value}, distributions={key: distribution}))
    fixed = write_space(tmp_path / "fixed.yaml", {"model.schedule": {"choice": ["cosine", "constant"]}})
    with pytest.raises(SystemExit) as stop:
        tune.main([*command, "--search", str(fixed)])
    assert "model.schedule has the choices ['cosine', 'constant'], but study 'c' searched it over" in stop.value.code
    fixed = write_space(tmp_path / "fixed.yaml", {"model.dropout": {"uniform": [0.0, 0.5]}})
    tune.main([*command, "--search", str(fixed)])
    trials = load(tmp_path / "logs" / "tune" / "c", "c").trials
    assert len(trials) == 3 and trials[2].state == TrialState.COMPLETE and "resumes" not in trials[2].user_attrs
    assert trials[2].params["model.dropout"] <= 0.5


@pytest.mark.slow
def test_a_study_rerun_with_other_flags_is_refused_naming_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    space = write_space(tmp_path / "space.yaml", {"model.dropout": {"uniform": [0.0, 0.5]}})
    command = ["--config", JOB, "--search", str(space), "--study", "e", "--sampler", "random", *ONE_EPOCH]
    tune.main([*command, "--trials", "1"])
    for other, change in OTHER_FLAGS:
        with pytest.raises(SystemExit) as stop:
            tune.main([*command, "--trials", "2", other])
        message = stop.value.code
        assert (
            f"study 'e' in sqlite:///logs/tune/e/study.db ran its trials with other train.py settings ({change})"
            in message
        )
    tune.main([*command, "--trials", "1", "--model.dropout=0.1"])  # a searched key is the search's own: the same study
    assert len(load(tmp_path / "logs" / "tune" / "e", "e").trials) == 1


@pytest.mark.slow
def test_multirun_rerun_with_other_flags_is_refused_naming_them(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    command = ["--config", JOB, "--seeds", "42", *ONE_EPOCH]
    multirun.main(command)
    result = tmp_path / "logs" / "multirun" / "simple_cnn-seeds" / "seed_42" / "result.json"
    before = result.read_text()
    for other, change in OTHER_FLAGS:
        with pytest.raises(SystemExit) as stop:
            multirun.main([*command, other])
        assert f"seed_42 was run with other train.py settings ({change}): give --name a new name" in stop.value.code
    assert result.read_text() == before  # nothing ran again
    capsys.readouterr()
    multirun.main([*command, "--trainer.enable_progress_bar=true"])  # the console alone: the same runs
    assert "seed_42: done before" in capsys.readouterr().out


def test_make_tune_runs_the_documented_command():
    page = (ROOT / "docs/experiments.md").read_text()
    documented = re.search(r"python tune\.py (.*?)# or: make tune", page, re.S)
    make = [
        "make",
        "--no-print-directory",
        "-n",
        "-s",
        "tune",
        "CONFIG=configs/simple_cnn.yaml",
    ]  # the documented job, whatever the default
    made = subprocess.run(make, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    command = made[made.index("tune.py ") :].split("\n\n")[0]
    assert shlex.split(command.replace("\\\n", " "))[1:] == shlex.split(documented[1].replace("\\\n", " "))


def test_a_run_config_is_parsed_once_and_each_run_is_a_checked_copy_with_its_values(monkeypatch):
    monkeypatch.setenv("PL_FIT__TRAINER__LIMIT_TRAIN_BATCHES", "3")  # the environment as train.py fit reads it
    job = runs.RunConfig.parse([f"--config={JOB}", "--trainer.max_epochs=2"])
    run = job.with_values({"model.dropout": 0.3, "data.num_folds": 3, "data.fold": 1}).named("cv", "fold_1")
    assert (run.namespace.model.init_args.dropout, run.namespace.data.init_args.fold) == (0.3, 1)
    assert run.namespace.trainer.logger.init_args.version == "fold_1" and run.namespace.trainer.limit_train_batches == 3
    assert job.namespace.model.init_args.dropout == 0.0  # the parsed config itself is left as it was
    assert run.settings()["model.dropout"] == 0.3 and run.settings()["trainer.max_epochs"] == 2
    written = yaml.safe_load(run.job_yaml())  # what differs from configs/defaults.yaml, as a job config
    assert written["trainer"]["max_epochs"] == 2 and written["model"]["init_args"]["dropout"] == 0.3
    assert "seed_everything" not in written and "name" not in written["trainer"]["logger"]["init_args"]
    assert run.resumed({"run_dir": "no/such/run", "tracker_runs": {}}) == run  # nothing saved: a fresh start
    with pytest.raises(runs.FlagError, match="no_such_option"):
        job.with_values({"model.no_such_option": 1})


def test_a_run_config_parsed_in_a_script_started_with_its_own_flags_warns_of_nothing(monkeypatch) -> None:
    """Lightning warns when a CLI is given arguments in a process started with others, as a search's is: the
    runs are driven with their own on purpose. Not shown, and the warning filters are left as they were."""
    monkeypatch.setattr(sys, "argv", ["tune.py", "--trials=2"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        runs.RunConfig.parse([f"--config={JOB}", "--trainer.max_epochs=1"])
        assert warnings.filters == before
    assert not [w for w in caught if "args parameter is intended" in str(w.message)]


@pytest.mark.slow  # a fresh process: the module is imported in it for the first time
def test_importing_the_search_runs_adds_no_warning_filter() -> None:
    """The CLI's warning is silenced while a run's config is parsed (the test above), not by the import."""
    assert warning_filters_added_by_importing("lightning_template.search.runs") == []


# extra:trackers
@pytest.mark.slow
def test_a_run_with_mlflow_has_the_same_settings_at_each_parse():
    flags = [f"--config={JOB}", f"--config={ROOT / 'configs' / 'presets' / 'mlflow.yaml'}"]
    assert runs.RunConfig.parse(flags).settings() == runs.RunConfig.parse(flags).settings()  # a rerun is not refused


# /extra:trackers


@pytest.fixture
def plain_job(tmp_path: Path) -> str:
    """A job config of a user's own plain task (tests/plain_task.py): a regression that logs val_loss only."""
    job = tmp_path / "regression.yaml"
    job.write_text(
        "model: tests.plain_task.Regressor\n"
        "data:\n  class_path: tests.plain_task.RegressionData\n  init_args: {train_size: 320}\n"
        "trainer: {max_epochs: 2, limit_val_batches: 2}\n"
    )
    return str(job)


@pytest.mark.slow
def test_seeds_and_a_search_of_a_plain_task_minimize_its_val_loss(tmp_path, monkeypatch, plain_job) -> None:
    """multirun and tune work unchanged for a task that is not a classifier: the default monitor, val_loss, lower
    is better."""
    monkeypatch.chdir(tmp_path)
    multirun.main(["--config", plain_job, "--seeds", "1", "2", "--name", "plain"])
    summary = (tmp_path / "logs/multirun/plain/summary.md").read_text().splitlines()
    assert summary[0].startswith("| run | best val_loss |")
    space = write_space(tmp_path / "space.yaml", {"model.lr": {"choice": [0.0, 0.05]}})
    tune.main(["--config", plain_job, "--search", str(space), "--trials", "2", "--study", "p", "--sampler", "grid"])
    study = load(tmp_path / "logs" / "tune" / "p", "p")
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    assert study.best_trial.params["model.lr"] == 0.05  # learning beats not learning, when lower is better


@pytest.mark.slow
def test_missing_data_is_one_line_in_multirun_and_tune(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    job = ["--config", str(ROOT / "configs/resnet_finetune.yaml"), "--data.root=/missing", "--model.weights=null"]
    with pytest.raises(SystemExit) as stop:
        multirun.main([*job, "--seeds", "1", *TINY])
    assert str(stop.value.code).startswith("multirun.py: /missing/train not found")
    space = write_space(tmp_path / "space.yaml", {"model.head_dropout": {"uniform": [0, 0.5]}})
    with pytest.raises(SystemExit) as stop:
        tune.main([*job, "--search", str(space), "--trials", "1", "--study", "m", *TINY])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "/missing/train not found" in err and "Traceback" not in err


@pytest.mark.slow
def test_a_repeat_of_a_finished_parameter_set_is_stored_as_what_it_is_not_as_a_failure(tmp_path, monkeypatch, capsys):
    """Two choices and a budget of 3: the sampler can only repeat them. A repeat is not trained again: it gets the
    finished trial's value (Optuna's recipe), marked as its repeat, and never counts as a failure or in the budget."""
    monkeypatch.chdir(tmp_path)
    space = write_space(tmp_path / "space.yaml", {"model.dropout": {"choice": [0.0, 0.2]}})
    tune.main(["--config", JOB, "--search", str(space), "--trials", "3", "--study", "r", "--sampler", "random",
               "--seed", "0", *ONE_EPOCH])  # fmt: skip
    assert "the space is exhausted" in capsys.readouterr().out
    trials = load(tmp_path / "logs" / "tune" / "r", "r").trials
    ran = [t for t in trials if "duplicate_of" not in t.user_attrs]
    repeats = [t for t in trials if "duplicate_of" in t.user_attrs]
    assert len(ran) == 2 and {t.params["model.dropout"] for t in ran} == {0.0, 0.2} and repeats
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert all(t.value == trials[t.user_attrs["duplicate_of"]].value for t in repeats)
    assert not (tmp_path / "logs" / "tune" / "r" / f"trial_{repeats[0].number:04d}").exists()  # never trained
    rows = list(csv.DictReader((tmp_path / "logs" / "tune" / "r" / "results.csv").open()))
    assert [int(r["trial"]) for r in rows] == [t.number for t in ran]


def test_a_repeated_seed_is_refused_in_one_line_before_anything_runs(tmp_path, monkeypatch):
    """`--seeds 1 1` is one run, not two: never trained once and summarised as "mean ± std over 2 runs"."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        multirun.main(["--config", JOB, "--seeds", "1", "2", "1", *ONE_EPOCH])
    assert stop.value.code == (
        "multirun.py: --seeds 1 2 1: seed 1 is given more than once; each seed is one run: give distinct seeds."
    )
    assert not (tmp_path / "logs").exists()  # nothing trained


@pytest.mark.parametrize(("flag", "nearest"), [("--seds", "--seeds"), ("--trainer.max_epoch", "--trainer.max_epochs")])
def test_a_misspelled_flag_of_multirun_or_train_py_gets_the_nearest_of_either(tmp_path, monkeypatch, flag, nearest):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        multirun.main(["--config", JOB, "--seeds", "1", *ONE_EPOCH, flag, "1"])
    assert stop.value.code == f"multirun.py: unrecognized arguments: {flag} 1\ndid you mean {nearest}?"
    assert not (tmp_path / "logs").exists()  # nothing trained
