"""A user's own task gets every guarantee of the engine through train.py, unchanged.

`tests/plain_task.py` is plain Lightning (a regression MLP, a datamodule returning `DataLoader(..., shuffle=True)`,
only `train_loss` and `val_loss` logged): nothing of the project is imported or subclassed.
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import signal
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader

from lightning_template.engine.cli import ProjectCLI
from lightning_template.engine.errors import ConfigError, MissingFileError
from lightning_template.engine.facts import check_facts_reached_the_model
from lightning_template.engine.predictions import CSVPredictionWriter

from tests.conftest import last_checkpoint, sigterm_at, train_process
from tests.helpers import same_state
from tests.plain_task import RegressionData, Regressor

PLAIN = ["--model=tests.plain_task.Regressor", "--data=tests.plain_task.RegressionData"]
SHORT = [
    "--trainer.max_epochs=2", "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=5",
    "--trainer.enable_model_summary=false",
]  # fmt: skip
STOPPED = 128 + signal.SIGTERM
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # two processes on two cores
PLATEAU_ON_VAL_LOSS = [
    "--model=tests.foreign_code.LitAutoEncoder", "--data=tests.foreign_code.ImagesData", "--checkpoint.monitor=null",
    "--early_stopping.monitor=null",
]  # fmt: skip


def stopped_and_resumed_equals_uninterrupted(
    tmp_path: Path, args: list[str], stop: list[str], env: dict[str, str] | None = None
) -> str:
    """Fit never stopped; fit stopped by SIGTERM; the same command with --ckpt_path last: the last two end with the
    first one's weights and step. Returns the console output of the stopped run and its resume."""
    train_process(["fit", *args], tmp_path / "full", env=env)
    stopped = train_process(["fit", *args, *stop], tmp_path / "cut", expect=STOPPED, env=env)
    resumed = train_process(["fit", *args, "--ckpt_path=last"], tmp_path / "cut", env=env)
    full, cut = last_checkpoint(tmp_path / "full"), last_checkpoint(tmp_path / "cut")
    assert cut["global_step"] == full["global_step"] > 0
    assert same_state(full["state_dict"], cut["state_dict"]), "weights differ after the resume"
    return stopped.stdout + stopped.stderr + resumed.stdout + resumed.stderr


def resumed_in_this_process(tmp_path: Path, monkeypatch, args: list[str], stop: list[str]) -> int:
    """As `stopped_and_resumed_equals_uninterrupted`, each run in this process as train.py runs it (the stop is a
    real SIGTERM to this process); returns the number of optimizer steps."""
    for folder, extra in (("full", []), ("cut", stop), ("cut", ["--ckpt_path=last"])):
        (tmp_path / folder).mkdir(exist_ok=True)
        monkeypatch.chdir(tmp_path / folder)
        with contextlib.suppress(SIGTERMException):  # stopped at a step boundary: train.py exits 143 here
            ProjectCLI(args=["fit", *args, *extra])
    full, cut = last_checkpoint(tmp_path / "full"), last_checkpoint(tmp_path / "cut")
    assert cut["global_step"] == full["global_step"] > 0
    assert same_state(full["state_dict"], cut["state_dict"]), "weights differ after the resume"
    return full["global_step"]


def test_a_plain_task_stopped_by_sigterm_resumes_exactly(tmp_path: Path, monkeypatch) -> None:
    """At a glance: fit never stopped; fit stopped by a real SIGTERM in the middle of its second epoch; the same
    command with --ckpt_path last. In separate processes of train.py: the test below."""
    args = [*PLAIN, *SHORT, "--data.train_size=160", "--trainer.enable_progress_bar=false"]
    assert resumed_in_this_process(tmp_path, monkeypatch, args, sigterm_at(epoch=1, batch=2)) == 10


def test_a_finished_run_continued_from_its_last_checkpoint_trains_nothing_and_says_nothing(tmp_path, monkeypatch):
    """Its last.ckpt was written after the last epoch's validation and end: no validation was skipped. Its CSV log
    keeps one row of final metrics: those logged at or after the checkpoint's step are logged again."""
    monkeypatch.chdir(tmp_path)
    csv_logger = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir=logs"]
    args = ["fit", *PLAIN, *SHORT, "--trainer.max_epochs=1", "--data.train_size=320", *csv_logger]
    ProjectCLI(args=args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = ProjectCLI(args=[*args, "--ckpt_path=last"])
    assert again.trainer.global_step == 10
    assert not [str(w.message) for w in caught if str(w.message).startswith("ExactResume")]
    with open(next(tmp_path.glob("logs/*/version_0/metrics.csv")), newline="") as f:
        assert sum(bool(row["final/val_loss"]) for row in csv.DictReader(f)) == 1


@pytest.mark.slow  # two training processes, one killed
def test_a_run_logged_to_csv_keeps_the_stopped_runs_rows_when_resumed(tmp_path: Path, monkeypatch) -> None:
    """Lightning's CSV writer deletes the metrics.csv of the folder it starts in, which a resumed run continues: the
    stopped run's rows stay, and the file ends with every value of the run never stopped. Resumed from a checkpoint
    older than what the run logged (killed, as by the OOM killer, after its last.ckpt), the rows of the steps after
    it are logged again, once."""
    csv_logger = [
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir=logs",
        "--trainer.logger.flush_logs_every_n_steps=1", "--trainer.log_every_n_steps=1",
    ]  # fmt: skip
    args = [*PLAIN, *SHORT, "--data.train_size=160", "--trainer.enable_progress_bar=false", *csv_logger]
    resumed_in_this_process(tmp_path, monkeypatch, args, sigterm_at(epoch=1, batch=2))
    killed = [*sigterm_at(epoch=1, batch=3)[:-1], f"--trainer.callbacks.signum={int(signal.SIGKILL)}"]
    train_process(["fit", *args, *killed], tmp_path / "killed", expect=-signal.SIGKILL)
    train_process(["fit", *args, "--ckpt_path=last"], tmp_path / "killed")

    def logged(run: str) -> list[tuple[str, str, str]]:
        with open(next((tmp_path / run).glob("logs/*/version_0/metrics.csv")), newline="") as f:
            return sorted((row["step"], key, value) for row in csv.DictReader(f) for key, value in row.items() if value)

    assert logged("cut") == logged("full") == logged("killed") and ("4", "train_loss") in {r[:2] for r in logged("cut")}


@pytest.mark.slow
@pytest.mark.parametrize("batch", [0, 2], ids=["before-its-end", "at-its-end"])
def test_a_run_that_ends_at_max_steps_inside_an_epoch_ends_as_never_stopped_when_resumed(batch, tmp_path, monkeypatch):
    """Stopped after its last validation (or at its last step, where the resumed run trains nothing), the resumed run
    validates no more: it starts with the metrics the stopped run had (Lightning saves none), so the best checkpoint
    watching val_loss at the epoch's end and the final metrics are those of the run never stopped, not missing."""
    csv_logger = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir=logs"]
    args = [*PLAIN, *SHORT, "--data.train_size=160", "--trainer.max_epochs=-1", "--trainer.max_steps=8", *csv_logger]
    assert resumed_in_this_process(tmp_path, monkeypatch, args, sigterm_at(epoch=1, batch=batch)) == 8

    def ended(run: str) -> tuple[list[str], dict[str, str]]:
        best = sorted(p.name for p in (tmp_path / run).glob("logs/*/version_0/checkpoints/epoch=*.ckpt"))
        with open(next((tmp_path / run).glob("logs/*/version_0/metrics.csv")), newline="") as f:
            final = {k: v for row in csv.DictReader(f) for k, v in row.items() if k.startswith("final/") and v}
        return best, final

    assert ended("cut") == ended("full") and "final/val_loss" in ended("full")[1]


@pytest.mark.slow
def test_a_training_step_that_takes_the_dataloader_iter_resumes_exactly(tmp_path: Path, monkeypatch) -> None:
    """Its batches never reach the batch hooks, where the engine seeds each batch: seeded at each batch's end."""
    model = ["--model=tests.plain_task.DataLoaderIterRegressor", "--model.dropout=0.3"]
    args = [*model, "--data=tests.plain_task.RegressionData", *SHORT, "--data.train_size=160"]
    assert resumed_in_this_process(tmp_path, monkeypatch, args, sigterm_at(epoch=0, batch=2)) == 10


@pytest.mark.slow
def test_a_plain_task_stopped_mid_epoch_resumes_exactly_with_its_own_metrics(tmp_path: Path, monkeypatch, capsys):
    """The uninterrupted run and the resume in this process, the stop by a real SIGTERM in a process of its own."""
    args = ["fit", *PLAIN, *SHORT, "--data.train_size=400"]
    (tmp_path / "full").mkdir()
    monkeypatch.chdir(tmp_path / "full")
    ProjectCLI(args=args)
    stopped = train_process([*args, *sigterm_at(epoch=1, batch=5)], tmp_path / "cut", expect=STOPPED)
    monkeypatch.chdir(tmp_path / "cut")
    ProjectCLI(args=[*args, "--ckpt_path=last"])
    full, cut = last_checkpoint(tmp_path / "full"), last_checkpoint(tmp_path / "cut")
    assert cut["global_step"] == full["global_step"] == 26
    assert same_state(full["state_dict"], cut["state_dict"]), "weights differ after the resume"
    output = stopped.stdout + stopped.stderr + "".join(capsys.readouterr())
    assert "epoch 2/2  train_loss" in output and "val_loss" in output  # the console's epoch line, its own metrics
    for unwanted in ("Warning", "warn", "EvalOutput", "num_classes", "Traceback"):
        assert unwanted not in output, unwanted
    best = next((tmp_path / "full").glob("logs/*/version_0/checkpoints/epoch=*-val_loss=*.ckpt"))
    assert best.name.startswith(("epoch=1-", "epoch=2-"))  # epochs counted from 1, as on the console


@pytest.mark.slow
@pytest.mark.parametrize(
    "setup",
    [
        pytest.param(["--data.num_workers=2"], id="loader-workers"),
        pytest.param(["--trainer.accumulate_grad_batches=2"], id="accumulation"),
        pytest.param(["--data.shuffle=false", "--data.batch_size=24", "--data.drop_last=true"], id="sequential"),
        pytest.param(["--trainer.val_check_interval=10"], id="mid-epoch-validation"),
    ],
)
def test_a_plain_task_resumes_exactly_in_each_setup(setup: list[str], tmp_path: Path, monkeypatch) -> None:
    args = [*PLAIN, *SHORT, "--trainer.enable_progress_bar=false", *setup]
    resumed_in_this_process(tmp_path, monkeypatch, args, sigterm_at(epoch=1, batch=4))


@pytest.mark.slow
@pytest.mark.processes
def test_a_plain_task_under_ddp_resumes_exactly(tmp_path: Path) -> None:
    """Two gloo processes, each its shard of the same order; SIGTERM to rank 0 stops both at the same step."""
    env = {k: v for k, v in os.environ.items() if k not in {"MASTER_PORT", "MASTER_ADDR"}} | ONE_THREAD
    ddp = ["--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.devices=2"]
    stopped_and_resumed_equals_uninterrupted(tmp_path, [*PLAIN, *SHORT, *ddp], sigterm_at(1, 3, rank=0), env=env)


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize(
    ("args", "said"),
    [
        pytest.param([*PLAIN, "--model.sync_val_loss=false"], "--early_stopping.monitor val_loss", id="early-stopping"),
        pytest.param(PLATEAU_ON_VAL_LOSS, "the plateau scheduler's monitor val_loss", id="plateau-scheduler"),
        pytest.param(["--model=tests.plain_task.MetricRegressor", PLAIN[1]], None, id="the-same-in-every-process"),
    ],
)
def test_a_monitored_value_that_differs_between_ddp_processes_is_refused_in_one_line(
    args: list[str], said: str | None, tmp_path: Path
) -> None:
    """Logged without sync_dist=True, each process's val_loss is that of its own shard: early stopping and the best
    checkpoint would decide by it in each process (which can then wait for each other in different collectives), and a
    plateau scheduler would give each process its own learning rate. A value the same in every process (a synced
    metric's `compute()`) trains, as does a monitor in the config of a scheduler that reads none."""
    env = {k: v for k, v in os.environ.items() if k not in {"MASTER_PORT", "MASTER_ADDR"}} | ONE_THREAD
    ddp = ["--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.devices=2"]
    done = train_process(["fit", *args, *SHORT, *ddp], tmp_path, expect=1 if said else 0, env=env, timeout=300)
    if said is None:
        assert "Error" not in done.stderr
        return
    assert f"\nError: {said}: under DDP the processes logged different values of 'val_loss'" in done.stderr
    assert f"\n[rank: 1] Error: {said}:" in done.stderr  # each process refuses at the same place: none waits
    assert "self.log('val_loss', ..., sync_dist=True)" in done.stderr and "Traceback" not in done.stderr


def test_a_monitored_metric_the_model_never_logs_is_named_with_what_it_logged(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"--checkpoint.monitor val_acc: the model never logged 'val_acc'; it logged"
                                         r" val_loss\. Monitor one of these"):  # fmt: skip
        ProjectCLI(args=["fit", *PLAIN, *SHORT, "--checkpoint.monitor=val_acc", "--checkpoint.mode=max"])
    with pytest.raises(ValueError, match=r"--early_stopping.monitor val_mae: the model never logged"):
        ProjectCLI(args=["fit", *PLAIN, *SHORT, "--early_stopping.monitor=val_mae"])
    with pytest.raises(ValueError, match=r"--checkpoint.monitor val_acc: the model never logged 'val_acc'; it logged"
                                         r" train_loss, val_loss\."):  # fmt: skip
        no_sanity_check = ["--trainer.num_sanity_val_steps=0", "--checkpoint.mode=max"]
        ProjectCLI(args=["fit", *PLAIN, *SHORT, "--checkpoint.monitor=val_acc", *no_sanity_check])


def test_the_best_checkpoint_can_watch_the_step_to_keep_the_latest(tmp_path: Path, monkeypatch) -> None:
    """`step` is ModelCheckpoint's own counter, not a logged metric: watched with mode max, the files kept are the
    latest."""
    monkeypatch.chdir(tmp_path)
    latest = ["--checkpoint.monitor=step", "--checkpoint.mode=max", "--checkpoint.save_top_k=2"]
    cli = ProjectCLI(args=["fit", *PLAIN, *SHORT, *latest, "--early_stopping.monitor=null", "--trainer.logger=false"])
    best = Path(cli.trainer.checkpoint_callback.best_model_path)
    assert best.name == f"epoch=2-step={cli.trainer.global_step}.ckpt"
    assert sorted(p.name for p in best.parent.glob("epoch=*")) == [
        f"epoch={e}-step={e * cli.trainer.global_step // 2}.ckpt" for e in (1, 2)
    ]


def test_a_metric_logged_once_an_epoch_or_watched_without_strict_is_not_refused(tmp_path: Path, monkeypatch) -> None:
    """An epoch-level training metric is known at the epoch's end, where the callbacks that watch it read it; an
    EarlyStopping with strict=False goes on without its metric, as Lightning's does."""
    monkeypatch.chdir(tmp_path)
    epoch_logged = ["--model=tests.plain_task.EpochLoggedRegressor", "--data=tests.plain_task.RegressionData"]
    watch = ["--checkpoint.monitor=train_mse", "--early_stopping.monitor=train_mse"]
    watch += ["--checkpoint.auto_insert_metric_name=true"]  # the file's name has them already
    cli = ProjectCLI(args=["fit", *epoch_logged, *SHORT, *watch, "--early_stopping.check_on_train_epoch_end=true"])
    assert re.fullmatch(r"epoch=2-train_mse=[\d.]+\.ckpt", Path(cli.trainer.checkpoint_callback.best_model_path).name)
    ProjectCLI(args=["fit", *PLAIN, *SHORT, "--early_stopping.monitor=val_mae", "--early_stopping.strict=false"])


@pytest.mark.slow
def test_a_loader_that_cannot_be_skipped_into_is_named_when_training_starts(tmp_path: Path) -> None:
    """An IterableDataset: said at the start, and a mid-epoch resume says what it does instead of skipping."""
    args = [*PLAIN, *SHORT, "--data.stream=true"]
    stopped = train_process(["fit", *args, *sigterm_at(epoch=0, batch=5)], tmp_path, expect=STOPPED)
    assert "the training loader reads an IterableDataset (InkStream), which cannot continue from the middle" in (
        stopped.stderr
    )
    resumed = train_process(["fit", *args, "--ckpt_path=last"], tmp_path)
    assert "resuming epoch 0 after 6 batches, but the training loader reads an IterableDataset" in resumed.stderr


@pytest.mark.slow
def test_a_non_finite_loss_stops_a_plain_task_in_one_line(tmp_path: Path) -> None:
    done = train_process(["fit", *PLAIN, *SHORT, "--model.nan_at_step=3"], tmp_path, expect=1)
    assert "Error: Loss became nan in epoch 0, batch_idx 3 (optimizer step 3)." in done.stderr
    assert "Traceback" not in done.stderr


def test_predictions_of_a_plain_task_are_written_one_row_per_sample(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    ProjectCLI(args=["fit", *PLAIN, *SHORT, "--trainer.max_epochs=1", "--data.train_size=320"])
    checkpoint = next(tmp_path.glob("logs/*/version_0/checkpoints/last.ckpt"))
    ProjectCLI(args=["predict", *PLAIN, f"--ckpt_path={checkpoint}", "--trainer.enable_progress_bar=false"])
    with open(tmp_path / "predictions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 256 and list(rows[0]) == ["index", "output_0"]
    assert [int(r["index"]) for r in rows] == list(range(256))


@pytest.mark.slow
def test_early_stopping_says_why_and_where_the_run_stopped(tmp_path: Path, monkeypatch, capsys) -> None:
    """A learning rate of 0 never improves val_loss: with a patience of 1 the run stops after its second epoch."""
    monkeypatch.chdir(tmp_path)
    ProjectCLI(args=["fit", *PLAIN, *SHORT, "--model.lr=0", "--trainer.max_epochs=5", "--early_stopping.patience=1",
                      "--data.train_size=64", "--trainer.logger=false"])  # fmt: skip
    printed = capsys.readouterr().out
    said = r"early stopping: Monitored metric val_loss did not improve in the last 1 records\. Best score: [\d.]+;"
    assert re.search(said + " stopped after epoch 2 of 5\n", printed), printed


@pytest.mark.slow
@pytest.mark.parametrize(
    ("length", "planned"),
    [(["--trainer.max_epochs=5"], " of 5"), (["--trainer.max_epochs=-1", "--trainer.max_steps=50"], "")],
)
def test_early_stopping_in_the_first_epoch_at_a_threshold_says_lightnings_reason(
    tmp_path, monkeypatch, capsys, length: list[str], planned: str
):
    monkeypatch.chdir(tmp_path)
    ProjectCLI(args=["fit", *PLAIN, *SHORT, *length, "--early_stopping.stopping_threshold=100", "--data.train_size=64",
                     "--trainer.logger=false"])  # fmt: skip
    printed = capsys.readouterr().out
    said = rf"early stopping: Stopping threshold reached: val_loss = [\d.]+ < 100\.0; stopped after epoch 1{planned}\n"
    assert re.search(said, printed), printed  # in the first epoch, where Lightning's stopped_epoch is 0


class CountedData(RegressionData):
    """States one more fact, the number of classes (as a classification datamodule would), that Regressor does not
    take."""

    model_facts = (*RegressionData.model_facts, "num_classes")
    num_classes = 3


def test_a_fact_the_model_does_not_take_is_not_handed_to_it_when_resumed(tmp_path: Path, monkeypatch) -> None:
    """Not saved among the model's hyper-parameters, not passed to it by the resume that rebuilds it from them."""
    monkeypatch.chdir(tmp_path)
    args = ["fit", PLAIN[0], "--data=tests.test_any_task.CountedData", *SHORT, "--data.train_size=64"]
    ProjectCLI(args=[*args, "--trainer.max_epochs=1"])
    assert "num_classes" not in last_checkpoint(tmp_path)["hyper_parameters"]
    resumed = ProjectCLI(args=[*args, "--ckpt_path=last"])
    assert resumed.trainer.global_step == 4 and "num_classes" not in resumed.model.hparams
    # A checkpoint of an earlier version, which recorded it among the hyper-parameters, resumes too.
    (path,) = tmp_path.glob("logs/*/version_0/checkpoints/last.ckpt")
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"]["num_classes"] = 3
    torch.save(checkpoint, path)
    resumed = ProjectCLI(args=[*args, "--trainer.max_epochs=3", "--ckpt_path=last"])
    assert resumed.trainer.global_step == 6 and "num_classes" not in resumed.model.hparams


@pytest.mark.slow
def test_resuming_from_the_path_of_a_runs_checkpoint_continues_that_run_as_last_does(tmp_path: Path, monkeypatch):
    """The path the console printed (`last checkpoint: logs/...`) and `--ckpt_path last` continue the same run folder;
    a checkpoint of another experiment starts a run of this one."""
    monkeypatch.chdir(tmp_path)
    args = ["fit", *PLAIN, *SHORT, "--data.train_size=64", "--trainer.logger.init_args.name=ink"]
    ProjectCLI(args=[*args, "--trainer.max_epochs=1"])
    printed = Path("logs/ink/version_0/checkpoints/last.ckpt")
    ProjectCLI(args=[*args, f"--ckpt_path={printed}"])
    assert sorted(p.name for p in Path("logs/ink").iterdir()) == ["version_0"]
    assert torch.load(printed, weights_only=True)["global_step"] == 4  # two epochs of 2 batches, in one run
    ProjectCLI(args=[*args, "--trainer.max_epochs=3", "--ckpt_path=last"])
    assert sorted(p.name for p in Path("logs/ink").iterdir()) == ["version_0"]
    other = ["--trainer.max_epochs=4", "--trainer.logger.init_args.name=other", f"--ckpt_path={printed}"]
    ProjectCLI(args=[*args, *other])
    assert torch.load("logs/other/version_0/checkpoints/last.ckpt", weights_only=True)["global_step"] == 8
    assert torch.load(printed, weights_only=True)["global_step"] == 6  # untouched: not this experiment's run


@pytest.mark.slow
def test_a_run_stopped_mid_epoch_resumes_only_with_its_own_seed(tmp_path: Path, monkeypatch) -> None:
    """Another seed would order the rest of the epoch anew while skipping the batches done: refused in one line. At
    an epoch end it only orders the epochs to come, and is said."""
    monkeypatch.chdir(tmp_path)
    args = ["fit", *PLAIN, *SHORT, "--data.train_size=160", "--trainer.enable_progress_bar=false"]
    with contextlib.suppress(SIGTERMException):
        ProjectCLI(args=[*args, *sigterm_at(epoch=0, batch=2)])
    with pytest.raises(ConfigError, match=r"middle of epoch 0 of a run seeded 42, not 7: .* --seed_everything 42,"):
        ProjectCLI(args=[*args, "--ckpt_path=last", "--seed_everything=7"])
    assert last_checkpoint(tmp_path)["global_step"] == 3  # untouched by the refused resume
    with contextlib.suppress(SIGTERMException):
        ProjectCLI(args=[*args, "--ckpt_path=last", *sigterm_at(epoch=0, batch=4)])  # the epoch's last batch
    with pytest.warns(UserWarning, match=r"The checkpoint's run was seeded 42; it goes on with seed 7: the epochs fr"):
        ProjectCLI(args=[*args, "--ckpt_path=last", "--seed_everything=7"])
    assert last_checkpoint(tmp_path)["global_step"] == 10


def test_a_run_logged_in_a_tensorboard_sub_dir_is_continued_in_its_own_folder(tmp_path: Path, monkeypatch) -> None:
    """The run is the folder of its checkpoints (logs/<name>/version_0), not TensorBoard's sub_dir inside it."""
    monkeypatch.chdir(tmp_path)
    args = ["fit", *PLAIN, *SHORT, "--data.train_size=64", "--trainer.logger.init_args.sub_dir=extra"]
    ProjectCLI(args=[*args, "--trainer.max_epochs=1"])
    run = tmp_path / "logs/regressor/version_0"
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=True)["tracker_runs"] == {
        "TensorBoardLogger": "version_0"
    }
    cli = ProjectCLI(args=[*args, "--ckpt_path=last"])
    assert cli.trainer.logger.version == "version_0" and cli.trainer.global_step == 2 * 64 // 32
    assert sorted(p.name for p in run.parent.iterdir()) == ["version_0"]


@pytest.mark.slow
def test_best_and_last_are_found_in_the_runs_of_the_job_for_every_command(tmp_path: Path, monkeypatch) -> None:
    """`--ckpt_path best` validates the best epoch of the job's newest run that has one; a job without one says so."""
    monkeypatch.chdir(tmp_path)
    args = [*PLAIN, "--data.train_size=64", "--trainer.enable_progress_bar=false", "--trainer.limit_val_batches=2"]
    ProjectCLI(args=["fit", *args, "--trainer.max_epochs=2", "--trainer.enable_model_summary=false"])
    (best,) = tmp_path.glob("logs/regressor/version_0/checkpoints/epoch=*.ckpt")
    cli = ProjectCLI(args=["validate", *args, "--ckpt_path=best"])
    assert cli.trainer.ckpt_path == str(best.relative_to(tmp_path))
    score = float(best.stem.rpartition("val_loss=")[2])
    assert float(cli.trainer.callback_metrics["val_loss"]) == pytest.approx(score, abs=1e-4)
    cut_off = tmp_path / "logs/regressor/version_1/checkpoints/last.ckpt"  # a run killed while it wrote
    cut_off.parent.mkdir(parents=True)
    cut_off.write_bytes(best.read_bytes()[:100])
    os.utime(cut_off, (0, 0))  # older: `last` is the newest run's, and the older one is not read
    cli = ProjectCLI(args=["validate", *args, "--ckpt_path=last"])
    assert cli.trainer.ckpt_path == "logs/regressor/version_0/checkpoints/last.ckpt"
    os.utime(cut_off)  # the newest: refused, not replaced by an older run's
    with pytest.raises(
        ConfigError, match=r"--ckpt_path logs/regressor/version_1/checkpoints/last.ckpt: not a readable"
    ):
        ProjectCLI(args=["validate", *args, "--ckpt_path=last"])
    cut_off.unlink()
    ProjectCLI(args=["fit", *args, "--trainer.max_epochs=1", "--trainer.logger.init_args.name=none",
                     "--checkpoint.monitor=null", "--early_stopping.monitor=null"])  # fmt: skip
    with pytest.raises(MissingFileError, match=r"--ckpt_path best: no best-epoch checkpoint recorded in logs/none/"):
        ProjectCLI(args=["test", *args, "--ckpt_path=best", "--trainer.logger.init_args.name=none"])


@pytest.mark.slow
def test_a_run_continued_from_an_earlier_checkpoint_goes_on_in_a_new_run(
    tmp_path: Path, monkeypatch, caplog, recwarn
) -> None:
    """A learning rate of 0: epoch 1 stays the best of 3. Continued from it, the run's later epochs are not written or
    logged again in its folder: a new run, said in one line (not again by Lightning's warning that the checkpoints'
    folder changed)."""
    monkeypatch.chdir(tmp_path)
    args = ["fit", *PLAIN, *SHORT, "--data.train_size=64", "--model.lr=0", "--trainer.max_epochs=3"]
    ProjectCLI(args=args)
    run = tmp_path / "logs/regressor/version_0"
    (best,) = run.glob("checkpoints/epoch=*.ckpt")
    before = {p.name: p.stat().st_mtime_ns for p in run.rglob("*")}
    assert best.name.startswith("epoch=1-") and torch.load(best, weights_only=True)["global_step"] == 2
    ProjectCLI(args=[*args, f"--ckpt_path={best}"])
    assert {p.name: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # not a file of the run rewritten
    branch = torch.load(tmp_path / "logs/regressor/version_1/checkpoints/last.ckpt", weights_only=True)
    assert branch["global_step"] == 6
    assert f"--ckpt_path {best} is step 2 of {run}, which went on to step 6: continuing from it in a new run" in (
        caplog.text
    )
    assert not [w for w in recwarn if "dirpath has changed" in str(w.message)]


@pytest.mark.slow
def test_a_run_continued_with_other_data_is_refused_and_keeps_its_record(tmp_path: Path, monkeypatch) -> None:
    """The run's config.yaml says how it was trained: continuing it with other data flags is refused in one line."""
    monkeypatch.chdir(tmp_path)
    args = ["fit", *PLAIN, *SHORT, "--data.train_size=64", "--trainer.max_epochs=1"]
    ProjectCLI(args=args)
    last, saved = Path("logs/regressor/version_0/checkpoints/last.ckpt"), Path("logs/regressor/version_0/config.yaml")
    record = saved.read_text()
    more = [*args, "--trainer.max_epochs=2", f"--ckpt_path={last}"]
    with pytest.raises(ConfigError) as refused:
        ProjectCLI(args=[*more, "--data.batch_size=16"])
    message = str(refused.value)
    assert "\n" not in message and "--data.batch_size 16 (the run: 32)" in message
    assert "--trainer.logger.init_args.name <name>" in message and saved.read_text() == record
    ProjectCLI(args=[*more, "--data.num_workers=1"])  # how the data loads is not what it is
    assert torch.load(last, weights_only=True)["global_step"] == 4


@pytest.mark.slow
def test_a_checkpoint_alone_validates_and_predicts_or_says_what_to_give(tmp_path: Path, monkeypatch) -> None:
    """No --config: the model from the checkpoint, the data from its run's config.yaml (the plain datamodule saves
    no hyper-parameters), flags on top. The file copied away from its run says in one line what to give."""
    monkeypatch.chdir(tmp_path)
    ProjectCLI(args=["fit", *PLAIN, *SHORT, "--data.train_size=64", "--trainer.max_epochs=1", "--data.batch_size=16",
                     "--trainer.logger.init_args.name=ink", "--trainer.enable_progress_bar=false"])  # fmt: skip
    last = "logs/ink/version_0/checkpoints/last.ckpt"
    quiet = ["--trainer.enable_progress_bar=false", "--trainer.logger=false"]
    alone = ProjectCLI(args=["validate", f"--ckpt_path={last}", "--trainer.limit_val_batches=2", *quiet])
    assert type(alone.model).__name__ == "Regressor" and alone.datamodule.batch_size == 16
    with_job = ProjectCLI(args=["validate", *PLAIN, "--data.batch_size=16", f"--ckpt_path={last}", *quiet,
                                "--trainer.limit_val_batches=2"])  # fmt: skip
    assert alone.trainer.callback_metrics["val_loss"] == with_job.trainer.callback_metrics["val_loss"]
    ProjectCLI(args=["predict", f"--ckpt_path={last}", "--data.batch_size=8", *quiet])  # a flag on top
    assert not (tmp_path / "predictions.csv").exists()  # beside the run, not in the current folder
    with open("logs/ink/version_0/predictions.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 256
    Path("away.ckpt").write_bytes(Path(last).read_bytes())
    with pytest.raises(ConfigError, match=r"--ckpt_path away.ckpt: the checkpoint does not say which data it was"):
        ProjectCLI(args=["test", "--ckpt_path=away.ckpt", *quiet])
    with pytest.raises(ConfigError, match=r"--ckpt_path best is found among the runs of a job: give its --config"):
        ProjectCLI(args=["test", "--ckpt_path=best", *quiet])
    checkpoint = torch.load(last, weights_only=True)
    del checkpoint["hyper_parameters"]["_class_path"]  # as a plain Trainer writes it
    torch.save(checkpoint, "plain.ckpt")
    with pytest.raises(ConfigError, match=r"--ckpt_path plain.ckpt: the checkpoint does not name its model's class"):
        ProjectCLI(args=["test", "--ckpt_path=plain.ckpt", *quiet])
    with pytest.raises(ConfigError, match=r"--ckpt_path away.ckpt: the checkpoint does not say which data"):
        ProjectCLI(args=["test", "--ckpt_path=plain.ckpt", "--ckpt_path", "away.ckpt", *quiet])  # the last one given
    with pytest.raises(MissingFileError, match=r"--ckpt_path best: this run has no logger, so no run folder"):
        ProjectCLI(args=["test", *PLAIN, "--ckpt_path=best", *quiet])


def test_a_prediction_of_no_rows_or_no_batches_leaves_no_file_and_says_so(tmp_path: Path, capsys) -> None:
    """No CSV of a header alone passes for a result."""

    class NoRows(BoringModel):
        def prediction_rows(self, outputs: Any, indices: list[int]) -> list[dict[str, Any]]:
            return []

    output = tmp_path / "predictions.csv"
    trainer = Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[CSVPredictionWriter(str(output))])  # fmt: skip
    said = f"no predictions: the predict data was empty; nothing written to {output}"
    trainer.predict(NoRows(), DataLoader(RandomDataset(32, 8), batch_size=4))
    assert not output.exists()
    assert said in capsys.readouterr().out
    output.write_text("an earlier run's rows\n")
    trainer.predict(BoringModel(), DataLoader(RandomDataset(32, 0), batch_size=4))  # no batch: Lightning skips the loop
    assert not output.exists()
    assert said in capsys.readouterr().out


def test_a_datamodule_hands_the_facts_it_declares_to_the_model_with_no_engine_edit(tmp_path, monkeypatch) -> None:
    """RegressionData declares `num_features` (its `model_facts`), which its `pool` decides: Regressor is built
    with it, never told twice; a fact that could not reach the model is refused rather than left at its default."""
    monkeypatch.chdir(tmp_path)
    cli = ProjectCLI(args=[*PLAIN, "--data.pool=7", "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
                           "--trainer.logger=false", "--trainer.enable_progress_bar=false"], run=False)  # fmt: skip
    assert cli.model.hparams.num_features == cli.model.net[0].in_features == cli.datamodule.num_features == 16
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    with pytest.raises(ConfigError, match=r"RegressionData hands num_features=16 to the model, which was built with 49:"
                       r".* \(--data tests\.plain_task\.RegressionData\)"):  # fmt: skip
        check_facts_reached_the_model(RegressionData(pool=7), Regressor(), linked=())


@pytest.mark.slow
def test_a_datamodule_named_by_its_path_in_a_fresh_process_hands_its_facts_to_the_model(tmp_path: Path) -> None:
    train_process(["fit", *PLAIN, *SHORT, "--data.pool=7", "--trainer.max_steps=2"], tmp_path)
    assert last_checkpoint(tmp_path)["hyper_parameters"]["num_features"] == 16
