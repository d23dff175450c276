"""What train.py prints and reads besides flags: per-epoch lines in logs, errors without tracebacks, options from
the environment."""

from __future__ import annotations

import signal
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import RichProgressBar

from lightning_template.engine import ResumeCheckpoint, exact_resume
from lightning_template.engine.cli import ProjectCLI, main, project_error
from lightning_template.engine.console import EpochLines, library_noise_quieted
from lightning_template.engine.errors import ConfigError
from lightning_template.tasks.classification import FashionMNISTDataModule, SimpleCNN

from tests.conftest import QUICK, ROOT
from tests.helpers import SignalAtBatch

JOB = ["--config", str(ROOT / "configs/simple_cnn.yaml")]


@pytest.mark.slow
def test_a_log_file_gets_one_line_per_epoch_and_no_progress_frames(
    tmp_path: Path, monkeypatch, capsys, fashion_mnist_dir
) -> None:
    monkeypatch.chdir(tmp_path)  # stdout is pytest's capture: not a terminal, as under CI or nohup
    flags = [f for f in QUICK if "progress_bar" not in f]  # the default progress bar, as `make train` runs
    ProjectCLI(args=["fit", *JOB, *flags, "--trainer.max_epochs=3"])
    out, err = capsys.readouterr()
    log = out + err
    epochs = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in epochs] == ["1/3", "2/3", "3/3"]
    assert all("val_acc" in line and "train_loss" in line for line in epochs)
    assert "\r" not in log and "it/s" not in log  # no progress-bar redraws
    assert len(log.encode()) < 20_000


def _main(args: list[str], monkeypatch, capsys) -> str:
    """train.py's main() on `args` (in this process); its exit status must be 1; returns stderr."""
    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 1
    return capsys.readouterr().err


@pytest.mark.slow
def test_errors_print_the_message_without_traceback_and_debug_shows_it(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.pth").write_text("not a tensor file")
    weights = _main(["fit", *JOB, f"--model.weights={tmp_path / 'bad.pth'}"], monkeypatch, capsys)
    assert f"Error: --model.weights {tmp_path / 'bad.pth'}: not a readable torch file" in weights
    assert "Traceback" not in weights and "Union subtypes" not in weights  # the cause, not its wrapper
    no_data = _main(
        [
            "fit",
            *JOB,
            "--data=lightning_template.tasks.classification.ImageFolderDataModule",
            f"--data.root={tmp_path}",
        ],
        monkeypatch,
        capsys,
    )
    assert f"Error: {tmp_path / 'train'} not found. ImageFolderDataModule expects" in no_data
    monkeypatch.setattr(sys, "argv", ["train.py", "fit", *JOB, f"--model.weights={tmp_path / 'bad.pth'}", "--debug"])
    with pytest.raises(ValueError, match="Does not validate against any of the Union subtypes"):
        main()  # --debug: the exception itself propagates, with its traceback


def test_every_option_can_come_from_the_environment(monkeypatch, capsys) -> None:
    monkeypatch.setenv("PL_FIT__CONFIG", str(ROOT / "configs/simple_cnn.yaml"))
    monkeypatch.setenv("PL_FIT__TRAINER__MAX_EPOCHS", "3")
    monkeypatch.setenv("PL_FIT__MODEL", '{"init_args": {"dropout": 0.4}}')  # subclass options: one variable, merged
    with pytest.raises(SystemExit):
        ProjectCLI(args=["fit", "--print_config", "--trainer.min_epochs=2"])
    printed = capsys.readouterr().out
    assert "  max_epochs: 3\n" in printed and "    dropout: 0.4\n" in printed
    assert "class_path: lightning_template.tasks.classification.SimpleCNN" in printed
    assert "  min_epochs: 2\n" in printed  # flags still apply


def _raised(function) -> Exception:
    try:
        function()
    except Exception as error:
        return error
    raise AssertionError("did not raise")


def test_only_project_errors_drop_their_traceback() -> None:
    def refuse() -> None:
        raise ConfigError("--data.fold 7: only 5 folds; use 0..4.")

    def plain() -> None:
        raise ValueError("a ValueError of the project's own code is a bug unless it is a ProjectError")

    def bug() -> None:
        _ = {}["num_classes"]  # raised by the builtin: a bug, whose traceback the user needs

    def wrapped() -> None:
        raise RuntimeError("Does not validate against any of the Union subtypes") from _raised(refuse)

    on_purpose = _raised(refuse)
    assert project_error(on_purpose) is on_purpose
    assert project_error(_raised(bug)) is None
    assert project_error(_raised(plain)) is None
    assert isinstance(project_error(_raised(wrapped)), ConfigError)  # the cause, not the wrapper
    assert project_error(_raised(lambda: torch.zeros(2) @ torch.zeros(3))) is None  # a library's error


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "log-file"])
def test_rich_in_a_terminal_and_epoch_lines_elsewhere(terminal: bool, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    trainer = ProjectCLI(args=[*JOB], run=False).trainer
    assert type(trainer.progress_bar_callback) is (RichProgressBar if terminal else EpochLines)
    quiet = ProjectCLI(args=[*JOB, "--trainer.enable_progress_bar=false"], run=False).trainer
    assert quiet.progress_bar_callback is None  # no clash with Lightning's switch


@pytest.mark.slow
def test_epoch_lines_show_this_epochs_train_acc_and_time_after_a_mid_epoch_resume(
    tmp_path: Path, quick_trainer, capsys, fashion_mnist_dir
) -> None:
    def fit(*callbacks, ckpt_path=None):
        callbacks = [*exact_resume(), ResumeCheckpoint(dirpath=tmp_path), *callbacks]
        trainer = quick_trainer(max_epochs=2, enable_progress_bar=True, callbacks=callbacks)
        trainer.fit(SimpleCNN(), datamodule=FashionMNISTDataModule(batch_size=32), ckpt_path=ckpt_path)
        return trainer

    full = fit(EpochLines())
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert "train_acc" in lines[0]  # logged by the module's last step, before the line is printed
    assert f"train_acc {float(full.callback_metrics['train_acc']):.4g} " in lines[1]
    with pytest.raises(SystemExit):
        fit(SignalAtBatch(epoch=1, batch=1, signum=signal.SIGTERM))
    capsys.readouterr()
    started = time.monotonic()
    fit(EpochLines(), ckpt_path=str(tmp_path / "last.ckpt"))
    elapsed = time.monotonic() - started
    resumed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert resumed[0].startswith("epoch 2/2") and float(resumed[0].rpartition("(")[2].split()[0]) <= elapsed


@pytest.mark.slow
def test_the_epoch_line_shows_the_true_mean_loss_whatever_the_accumulation(tmp_path: Path, monkeypatch, capsys):
    """Lightning hands callbacks the loss divided by the accumulation count; the epoch line shows the loss itself.
    With a learning rate of 0 the model never moves: the same batches give the same mean loss for K = 1 and 4."""
    monkeypatch.chdir(tmp_path)
    shown = []
    for accumulate in (1, 4):
        ProjectCLI(args=[
            "fit", "--model=tests.plain_task.Regressor", "--data=tests.plain_task.RegressionData", "--model.lr=0",
            "--trainer.max_epochs=1", "--data.train_size=256", "--trainer.limit_val_batches=1",
            f"--trainer.accumulate_grad_batches={accumulate}", "--trainer.logger=false",
            "--trainer.enable_model_summary=false",
        ])  # fmt: skip
        line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch 1/1"))
        shown.append(float(line.split("train_loss ")[1].split()[0]))
    assert shown[0] == pytest.approx(shown[1], rel=1e-3) and shown[0] > 0.01


def test_the_engines_warnings_print_as_their_line_and_any_other_keeps_its_place() -> None:
    engine_file = str(ROOT / "lightning_template" / "engine" / "resume.py")
    task_file = str(ROOT / "lightning_template" / "tasks" / "loaders.py")
    with library_noise_quieted():  # a run of the CLI
        assert warnings.formatwarning("ExactResume: a line.", UserWarning, engine_file, 10) == "ExactResume: a line.\n"
        assert warnings.formatwarning("a user's warning", UserWarning, task_file, 3).startswith(f"{task_file}:3: ")
    # Python's own after it
    assert warnings.formatwarning("ExactResume: a line.", UserWarning, engine_file, 10).startswith(engine_file)
