"""The CLI as a user runs it: job configs over the defaults, fit -> validate -> resume, loggers, optimizers."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from jsonargparse import ArgumentParser, Namespace
from lightning.pytorch.callbacks import LearningRateMonitor

from lightning_template.engine import (
    ExactResume,
    FiniteLossGuard,
    GracefulStop,
    ResumableBatches,
    ResumeCheckpoint,
)
from lightning_template.engine.cli import ProjectCLI, main, named_subcommand
from lightning_template.engine.errors import ConfigError, MissingFileError, StorageError
from lightning_template.engine.monitor import EarlyStop
from lightning_template.script_args import parse_known, script_parser
from lightning_template.tasks.classification import SimpleCNN

from tests.conftest import QUICK, ROOT, offline_flags, run_cli, save_random_weights
from tests.helpers import event_tags, same_state, scalar_steps

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
JOBS = [c for c in CONFIGS if c.name != "defaults.yaml"]
# Jobs whose first steps take over a second (large networks, pretrained-weight stand-ins): in the full tier.
HEAVY_JOBS = [
    "resnet_finetune.yaml",
    "resnet_fmnist_pretrain.yaml",
    # extra:language_model
    "language_model.yaml",
    # /extra:language_model
    # extra:timm
    "timm_finetune.yaml",
    # /extra:timm
    # extra:hf
    "hf_fortunes.yaml",
    "hf_pretrain.yaml",
    # /extra:hf
]
SHARED = ("logger", "ModelCheckpoint", "EarlyStopping", "LearningRateMonitor", "save_dir", "seed_everything")


@pytest.mark.parametrize(
    "config",
    [pytest.param(c, marks=[pytest.mark.slow] if c.name in HEAVY_JOBS else []) for c in JOBS],
    ids=lambda p: p.name,
)
def test_every_job_config_is_a_short_delta_that_trains_a_few_steps(
    config: Path, tmp_path: Path, monkeypatch, offline_inputs: dict[str, Path], request: pytest.FixtureRequest
) -> None:
    """Each shipped job, end to end at a few steps: parsed over the defaults, built, two training and validation
    batches (fast_dev_run), a test batch where the job tests after fit."""
    text = config.read_text()
    assert len(text.splitlines()) <= 25 and not [word for word in SHARED if word in text]
    monkeypatch.chdir(tmp_path)
    flags = offline_flags(str(config.relative_to(ROOT)), offline_inputs, request)
    # Batches of 8: the job at its own batch size is make matrix's to run (each job stopped and resumed).
    args = ["--config", str(config), *flags, "--trainer.fast_dev_run=2", "--data.batch_size=8"]
    cli = ProjectCLI(args=args, run=False)
    # facts of the data are linked into the model, not typed twice
    linked = [name for name in cli.datamodule.model_facts if name in cli.model.hparams]
    assert linked and all(cli.model.hparams[name] == getattr(cli.datamodule, name) for name in linked)
    types = {type(c) for c in cli.trainer.callbacks}
    engine = {ResumableBatches, ExactResume, GracefulStop, ResumeCheckpoint, FiniteLossGuard}
    assert {*engine, LearningRateMonitor, EarlyStop} <= types
    assert cli.config.trainer.logger.init_args.name == config.stem  # the run is named after its config file
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2 and "val_loss" in cli.trainer.callback_metrics
    if "test_after_fit: true" in text:
        cli.trainer.test(cli.model, datamodule=cli.datamodule)
        assert "test_loss" in cli.trainer.callback_metrics


def test_print_config_still_shows_everything(capsys) -> None:
    with pytest.raises(SystemExit):
        ProjectCLI(args=["fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), "--print_config"])
    printed = capsys.readouterr().out
    job = yaml.safe_load((ROOT / "configs/simple_cnn.yaml").read_text())  # the job's values over the defaults'
    lr, epochs = job["model"]["init_args"]["optimizer"]["init_args"]["lr"], job["trainer"]["max_epochs"]
    for line in ("class_path: lightning.pytorch.loggers.TensorBoardLogger", "monitor: val_acc", "patience: 5",
                 "class_path: torch.optim.AdamW", f"lr: {lr}", f"max_epochs: {epochs}"):  # fmt: skip
        assert line in printed, line


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory, fashion_mnist_dir) -> tuple[Path, str]:
    """One short real run of the main config (2 epochs x 10 batches), shared by the tests below."""
    workdir = tmp_path_factory.mktemp("run")
    result = run_cli(
        "fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), "--trainer.max_epochs=2", *QUICK, cwd=workdir
    )
    return workdir, result.stdout + result.stderr


# Every line is the project's, the user's or Lightning's own report: no warning raised inside a library (with its
# category, or as Lightning prints its own: "file.py:21: message"), no advertisement.
NOISE = r".*(?:\w+Warning\b|\.py:\d+: |Tip:|litlogger|SIGTERMException).*"


@pytest.mark.slow
def test_fit_reports_test_accuracy_checkpoint_and_logs(fitted: tuple[Path, str]) -> None:
    workdir, stdout = fitted
    assert not re.findall(NOISE, stdout)
    run_dir = workdir / "logs" / "simple_cnn" / "version_0"
    assert re.search(r"test accuracy: 0\.\d{4}", stdout)
    assert "TensorBoard logs: tensorboard --logdir logs/simple_cnn/version_0" in stdout
    assert "last checkpoint: logs/simple_cnn/version_0/checkpoints/last.ckpt" in stdout
    assert (run_dir / "config.yaml").is_file()
    assert {"train_loss", "val_loss", "val_acc", "train_acc", "lr-AdamW/head", "lr-AdamW/backbone"} <= event_tags(
        run_dir
    )


@pytest.mark.slow
@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_every_command_from_a_checkpoint_is_as_quiet_as_fit(command: str, fitted: tuple[Path, str]) -> None:
    workdir, _ = fitted
    last = "logs/simple_cnn/version_0/checkpoints/last.ckpt"
    done = run_cli(
        command, "--config", str(ROOT / "configs/simple_cnn.yaml"), f"--ckpt_path={last}", *QUICK,
        "--trainer.limit_predict_batches=2", f"--predictions.output_file={workdir / 'predictions.csv'}", cwd=workdir,
    )  # fmt: skip
    assert not re.findall(NOISE, done.stdout + done.stderr)
    assert f"Loaded model weights from the checkpoint at {last}" in done.stdout + done.stderr


@pytest.mark.slow
def test_a_checkpoint_alone_from_another_folder_finds_its_data_and_writes_beside_its_run(
    fitted: tuple[Path, str], tmp_path: Path
) -> None:
    """`test|predict --ckpt_path <file>` and nothing else, from another folder, of a run whose data the datamodule
    found at a fallback (no data/ anywhere): evaluated without Lightning's warning about its rebuilt command line;
    the logs go to a new run of the checkpoint's job and the predictions beside the run, not to this folder."""
    workdir, _ = fitted
    last = workdir / "logs/simple_cnn/version_0/checkpoints/last.ckpt"
    done = run_cli("test", f"--ckpt_path={last}", "--trainer.limit_test_batches=2", cwd=tmp_path)
    assert "test_acc" in done.stdout and "args parameter" not in done.stdout + done.stderr
    assert (workdir / "logs/simple_cnn/version_1/config.yaml").is_file()
    done = run_cli("predict", f"--ckpt_path={last}", "--trainer.limit_predict_batches=1", cwd=tmp_path)
    assert f"predictions written to {last.parents[1] / 'predictions.csv'} (128 rows)" in done.stdout
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_validate_reproduces_best_checkpoint_score(fitted: tuple[Path, str]) -> None:
    workdir, _ = fitted
    best = next((workdir / "logs" / "simple_cnn" / "version_0" / "checkpoints").glob("epoch=*.ckpt"))
    saved = torch.load(best, weights_only=True)
    callback_state = next(v for k, v in saved["callbacks"].items() if k.startswith("BestCheckpoint"))
    cli = ProjectCLI(args=["validate", "--config", str(ROOT / "configs/simple_cnn.yaml"), f"--ckpt_path={best}",
                            *QUICK, f"--trainer.default_root_dir={workdir}", "--trainer.logger=false"])  # fmt: skip
    val_acc = cli.trainer.callback_metrics["val_acc"].item()
    assert val_acc == pytest.approx(callback_state["best_model_score"].item(), abs=1e-6)


@pytest.mark.slow
def test_a_config_of_model_and_data_alone_resumes_exactly(
    tmp_path: Path, monkeypatch, fashion_mnist_dir, capsys
) -> None:
    """The defaults and the CLI supply everything resume needs: a SIGTERM mid-epoch (a real process, stopped
    with exit status 143), then --ckpt_path last (here in-process, like the uninterrupted reference); the weights,
    the logged steps, the stopped epoch's training accuracy and its console line's mean loss are the run's never
    stopped."""
    (tmp_path / "mine.yaml").write_text(
        "model: lightning_template.tasks.classification.SimpleCNN\n"
        "data:\n  class_path: lightning_template.tasks.classification.FashionMNISTDataModule\n"
        "  init_args: {augment: true}\n"
    )
    args = [
        "fit", "--config", "mine.yaml", "--trainer.max_epochs=2", "--trainer.limit_train_batches=10",
        "--trainer.limit_val_batches=2", "--trainer.deterministic=true", "--trainer.log_every_n_steps=1",
    ]  # fmt: skip
    (tmp_path / "full").mkdir()
    monkeypatch.chdir(tmp_path / "full")
    uninterrupted = ProjectCLI(args=[a if a != "mine.yaml" else "../mine.yaml" for a in args])
    epoch_loss = lambda: re.search(r"^epoch 2/2 .*?train_loss (\S+)", capsys.readouterr().out, re.M).group(1)  # noqa: E731
    full_loss = epoch_loss()
    monkeypatch.chdir(tmp_path)
    stop = ["--trainer.callbacks+=tests.helpers.SignalAtBatch", "--trainer.callbacks.epoch=1",
            "--trainer.callbacks.batch=4", "--trainer.callbacks.signum=15"]  # fmt: skip
    stopped = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args, *stop],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert stopped.returncode == 143, stopped.stderr[-2000:]  # 128 + SIGTERM: stopped, not finished
    resumed_cli = ProjectCLI(args=[*args, "--ckpt_path=last"])
    # The stopped epoch's training accuracy counts its batches before the stop too.
    accuracy = [float(cli.trainer.callback_metrics["train_acc"]) for cli in (uninterrupted, resumed_cli)]
    assert accuracy[0] == accuracy[1] and epoch_loss() == full_loss
    load = lambda d: torch.load(d / "logs/mine/version_0/checkpoints/last.ckpt", weights_only=True)  # noqa: E731
    full, resumed = load(tmp_path / "full"), load(tmp_path)
    assert resumed["global_step"] == full["global_step"] == 20
    assert same_state(full["state_dict"], resumed["state_dict"])
    assert [p.name for p in (tmp_path / "logs/mine").iterdir()] == ["version_0"]  # the same run folder continued
    steps = scalar_steps(sorted((tmp_path / "logs/mine/version_0").glob("events.out.tfevents.*")), "train_loss")
    assert max(steps) == 19 and len(steps) == len(set(steps))  # logged once per step across the two runs


@pytest.mark.slow
def test_any_torch_optimizer_from_the_command_line_or_a_yaml(tmp_path: Path, monkeypatch, fashion_mnist_dir) -> None:
    monkeypatch.chdir(tmp_path)
    weights = save_random_weights(SimpleCNN, tmp_path / "cnn.pt", pool="early", batch_norm=True)  # the main job's net
    quick = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
             "--trainer.enable_progress_bar=false", "--test_after_fit=false", f"--model.weights={weights}"]  # fmt: skip
    transfer = [
        "--config",
        str(ROOT / "configs/simple_cnn.yaml"),
        "--config",
        str(ROOT / "configs/presets/transfer.yaml"),
    ]
    flags = ["--model.optimizer=torch.optim.SGD", "--model.optimizer.lr=0.05", "--model.optimizer.momentum=0.9"]
    (tmp_path / "sgd.yaml").write_text(
        "model:\n  init_args:\n    optimizer:\n      class_path: torch.optim.SGD\n"
        "      init_args: {lr: 0.05, momentum: 0.9, nesterov: true}\n"
    )
    for extra in (flags, ["--config", "sgd.yaml"]):
        cli = ProjectCLI(args=["fit", *transfer, *extra, *quick])
        optimizer = cli.trainer.optimizers[0]
        assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["momentum"] == 0.9
        assert [g["name"] for g in optimizer.param_groups] == ["head", "head_no_decay"]  # stage 1: the head only
        assert optimizer.param_groups[0]["initial_lr"] == 0.05


@pytest.mark.slow
def test_runs_without_a_logger(tmp_path: Path, monkeypatch, fashion_mnist_dir) -> None:
    monkeypatch.chdir(tmp_path)
    flags = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    cli = ProjectCLI(
        args=["fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), "--trainer.logger=false", *flags,
              "--test_after_fit=false", "--trainer.enable_progress_bar=false"]
    )  # fmt: skip
    assert cli.trainer.global_step == 2 and not any(isinstance(c, LearningRateMonitor) for c in cli.trainer.callbacks)


def test_bad_options_fail_before_any_data_loads(capsys) -> None:
    config = ["--config", str(ROOT / "configs/simple_cnn.yaml")]
    with pytest.raises(SystemExit):
        ProjectCLI(args=[*config, "--model.init_args.lrr=0.1"], run=False)
    assert "lrr" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a name spelled in part is not read as the option it begins
        ProjectCLI(args=[*config, "--trainer.max_epoch=1"], run=False)
    assert "did you mean --trainer.max_epochs?" in capsys.readouterr().err


def test_a_cosine_schedule_without_an_end_is_refused_before_the_first_step(
    tmp_path: Path, monkeypatch, fashion_mnist_dir
) -> None:
    monkeypatch.chdir(tmp_path)
    flags = ["--trainer.max_epochs=-1", "--trainer.logger=false", "--trainer.enable_progress_bar=false"]
    with pytest.raises(ConfigError, match=r"cosine needs a finite run: set trainer.max_epochs"):
        ProjectCLI(args=["fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), *flags])
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.slow
def test_a_checkpoint_of_other_data_is_refused_in_one_line_before_anything_runs(
    tmp_path: Path, monkeypatch, image_tree: Path
) -> None:
    """SimpleCNN trained on 3-channel image folders, validated with the Fashion-MNIST job: the shapes named."""
    monkeypatch.chdir(tmp_path)
    ProjectCLI(args=["fit", "--model=SimpleCNN", "--data=ImageFolderDataModule", f"--data.root={image_tree}",
                      "--data.image_size=32", "--data.num_workers=0", "--trainer.max_steps=1",
                      "--trainer.limit_val_batches=1", "--test_after_fit=false", "--trainer.logger.init_args.name=rgb",
                      "--trainer.enable_model_summary=false"])  # fmt: skip
    last = tmp_path / "logs/rgb/version_0/checkpoints/last.ckpt"
    with pytest.raises(ValueError) as refused:
        ProjectCLI(args=["validate", "--config", str(ROOT / "configs/simple_cnn.yaml"), f"--ckpt_path={last}"])
    message = str(refused.value)
    assert "\n" not in message and "does not fit the model built for this data" in message
    assert "net.features.0.weight: checkpoint (32, 3, 3, 3) vs model (32, 1, 3, 3)" in message
    assert not (tmp_path / "logs/simple_cnn").exists()  # refused before the run began


@pytest.mark.slow
def test_a_run_refused_before_its_first_step_removes_the_folder_it_made(tmp_path: Path, monkeypatch, caplog) -> None:
    """The two-stage check refuses at fit start, after Lightning has made the run's folder (and its event file):
    the folder goes, said in one line; a run folder that was there before is left alone."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs/refused/version_0").mkdir(parents=True)  # an earlier run's
    (tmp_path / "logs/refused/version_0/notes.txt").write_text("mine")
    refused = ["fit", "--config", str(ROOT / "configs/resnet_fmnist_small.yaml"), "--config",
               str(ROOT / "configs/presets/transfer.yaml"), "--model.weights=null", *QUICK,
               "--trainer.logger.init_args.name=refused", "--test_after_fit=false"]  # fmt: skip
    with pytest.raises(ValueError, match=r"random weights \(--model.weights is null\)"):
        ProjectCLI(args=refused)
    assert sorted(p.name for p in (tmp_path / "logs/refused").iterdir()) == ["version_0"]
    assert (tmp_path / "logs/refused/version_0/notes.txt").read_text() == "mine"
    assert "Removed logs/refused/version_1: the run stopped before its first step" in caplog.text


@pytest.mark.slow
def test_resume_refuses_another_models_checkpoint_and_flags_it_would_override(
    tmp_path: Path, monkeypatch, fashion_mnist_dir
) -> None:
    monkeypatch.chdir(tmp_path)
    cnn = ["fit", "--config", str(ROOT / "configs/simple_cnn.yaml")]
    # Kept tiny in every call: a run that is not refused trains only a step.
    tiny = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1"]
    tiny += ["--test_after_fit=false", "--trainer.enable_progress_bar=false"]
    ProjectCLI(args=[*cnn, *tiny])
    last = tmp_path / "logs/simple_cnn/version_0/checkpoints/last.ckpt"
    vit = ["fit", "--config", str(ROOT / "configs/vit_fashion_mnist.yaml"), f"--ckpt_path={last}", *tiny]
    other_model = r"checkpoint of \S*\.SimpleCNN, but this config.s model is \S*\.Transf"
    with pytest.raises(ValueError, match=other_model):
        ProjectCLI(args=vit)
    flags = ["--model.optimizer.lr=0.5", "--model.init_args.dropout", "0.4", "--model.hidden=128"]  # hidden: as saved
    with pytest.raises(ValueError) as refused:
        ProjectCLI(args=[*cnn, f"--ckpt_path={last}", *flags, *tiny, "--trainer.max_epochs=2"])
    message = str(refused.value)
    job = yaml.safe_load((ROOT / "configs/simple_cnn.yaml").read_text())["model"]["init_args"]
    assert f"--model.optimizer.lr 0.5 (checkpoint: {job['optimizer']['init_args']['lr']})" in message
    assert f"--model.dropout 0.4 (checkpoint: {job['dropout']})" in message
    assert "hidden" not in message
    # The same value from a stacked config or from the environment is refused the same way.
    (tmp_path / "presets").mkdir()
    (tmp_path / "presets/smooth.yaml").write_text("model:\n  init_args:\n    label_smoothing: 0.0\n")
    with pytest.raises(ValueError, match=r"--model.label_smoothing 0.0 \(checkpoint: 0.1\), set by a flag, a stacked"):
        ProjectCLI(args=[*cnn, "--config=presets/smooth.yaml", f"--ckpt_path={last}", *tiny])
    validate = ["validate", "--data=FashionMNISTDataModule", f"--ckpt_path={last}", *tiny[1:3]]
    model = '{"class_path": "SimpleCNN", "init_args": {"dropout": 0.3}}'
    monkeypatch.setenv("PL_VALIDATE__MODEL", model)
    with pytest.raises(ValueError, match=rf"--model.dropout 0.3 \(checkpoint: {job['dropout']}\)"):
        ProjectCLI(args=validate)
    monkeypatch.delenv("PL_VALIDATE__MODEL")
    ProjectCLI(args=[*validate, "--model=SimpleCNN"])  # the class's defaults are not a choice: the checkpoint's win
    assert not (tmp_path / "logs/simple_cnn/version_1").exists() and not (tmp_path / "logs/vit_fashion_mnist").exists()


def _usage_error(args: list[str], capsys) -> list[str]:
    with pytest.raises(SystemExit) as exit_:
        ProjectCLI(args=args)
    assert exit_.value.code == 2
    return capsys.readouterr().err.splitlines()


@pytest.mark.slow
def test_a_misspelled_option_or_file_is_named_first_with_the_nearest_one(capsys) -> None:
    config = ["fit", "--config", str(ROOT / "configs/simple_cnn.yaml")]
    lines = _usage_error([*config, "--trainer.max_epohcs=3"], capsys)
    assert lines[:2] == ["error: unrecognized arguments: --trainer.max_epohcs=3", "did you mean --trainer.max_epochs?"]
    assert len(lines) == 3  # and where the options are listed: no 80-line usage
    assert _usage_error([*config, "--model.dropot=0.4"], capsys)[-2] == "did you mean --model.dropout?"
    assert _usage_error([*config, "--model.optimizer.lrr=3"], capsys)[-2] == "did you mean --model.optimizer.lr?"
    lines = _usage_error(["fit", "--config", str(ROOT / "configs/simple_cn.yaml")], capsys)
    assert lines[0].startswith("error: ") and "simple_cn.yaml" in lines[0]
    assert lines[1] == f"did you mean {ROOT / 'configs/simple_cnn.yaml'}?"


def test_a_misspelled_class_a_tab_in_a_config_and_another_class_option_are_one_clear_line(capsys, tmp_path) -> None:
    config = ["fit", "--config", str(ROOT / "configs/simple_cnn.yaml")]
    lines = _usage_error([*config, "--model", "SimpleCN"], capsys)
    assert lines[:2] == [
        "error: --model SimpleCN: no such class (a task's class name, or an import path)",
        "did you mean SimpleCNN?",
    ]  # not jsonargparse's list of Union subtypes
    (tmp_path / "tabbed.yaml").write_text("model:\n\tclass_path: SimpleCNN\n")
    line = _usage_error(["fit", "--config", str(tmp_path / "tabbed.yaml")], capsys)[0]
    assert line.startswith(f"error: a config file is not valid YAML: {tmp_path / 'tabbed.yaml'}: ") and "line 2" in line
    lines = _usage_error([*config, "--data.image_size=32"], capsys)
    assert lines[:-1] == [
        "error: --data.image_size is an argument of ImageFolderDataModule, not of FashionMNISTDataModule (this"
        " config's class)"
    ]  # not "did you mean --data.val_size?"


def test_a_misspelled_key_in_a_config_file_is_named_with_its_file_and_the_nearest_key(capsys, tmp_path) -> None:
    """As a misspelled flag is: the file, the key and the class it is no argument of, then the nearest valid key."""
    config, typo = ["fit", "--config", str(ROOT / "configs/simple_cnn.yaml")], tmp_path / "typo.yaml"
    for text, refused, near in [
        ("model:\n  dropot: 0.3\n", "model.dropot is not an option of SimpleCNN", "model.dropout"),
        ("model:\n  init_args:\n    dropot: 0.3\n", "model.dropot is not an option of SimpleCNN", "model.dropout"),
        ("model:\n  optimizer:\n    lrr: 3\n", "model.optimizer.lrr is not an option of AdamW", "model.optimizer.lr"),
        ("trainer:\n  max_epoch: 3\n", "trainer.max_epoch is not an option", "trainer.max_epochs"),
    ]:
        typo.write_text(text)
        lines = _usage_error([*config, "--config", str(typo)], capsys)
        assert lines[:2] == [f"error: {typo}: {refused}", f"did you mean {near}?"] and len(lines) == 3, lines


def test_a_log_folder_that_cannot_be_made_is_refused_in_one_line_before_anything_runs(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    (tmp_path / "notes").write_text("a file where the logs' folder would go")
    monkeypatch.chdir(tmp_path)
    config = ["train.py", "fit", "--config", str(ROOT / "configs/simple_cnn.yaml")]
    monkeypatch.setattr(sys, "argv", [*config, "--trainer.logger.init_args.save_dir=notes/logs"])
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "Traceback" not in err
    assert (
        f"Error: --trainer.logger.init_args.save_dir notes/logs: no folder can be made in {tmp_path / 'notes'} (a"
        " file, not a folder); give a folder that can be written." in err
    )
    if Path("/proc/self").is_dir():  # procfs takes no folder
        with pytest.raises(StorageError, match=r"save_dir /proc/logs: no folder can be made in /proc \("):
            ProjectCLI(args=[*config[1:], "--trainer.logger.init_args.save_dir=/proc/logs"])
    assert [p.name for p in tmp_path.iterdir()] == ["notes"]


def test_a_folder_name_that_is_not_utf8_or_a_folder_given_as_checkpoint_is_one_line(tmp_path: Path, monkeypatch):
    """A name in bytes of another encoding (as Python reads it from the command line), and `--ckpt_path <folder>`."""
    monkeypatch.chdir(tmp_path)
    save_dir = os.fsdecode(b"logs-\xe9t\xe9")  # Latin-1
    with pytest.raises(
        ConfigError, match=r"^--trainer.logger.init_args.save_dir logs-\\xe9t\\xe9: not UTF-8 \(the run"
    ):
        ProjectCLI(args=["fit", f"--trainer.logger.init_args.save_dir={save_dir}"])
    assert not list(tmp_path.iterdir())
    run = tmp_path / "logs" / "simple_cnn" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").touch()
    suggested = re.escape(str(run / "checkpoints" / "last.ckpt"))
    for folder in (run, run / "checkpoints"):
        given = re.escape(str(folder))
        with pytest.raises(
            ConfigError, match=rf"^--ckpt_path {given} is a folder: give a checkpoint file, e.g. {suggested}\.$"
        ):
            ProjectCLI(args=["validate", f"--ckpt_path={folder}"])


def test_ckpt_path_is_explained_as_this_project_reads_it(capsys) -> None:
    """`--help` of `fit` and of `test` says what `--ckpt_path` takes here (`last`, `best`, a checkpoint alone), not
    Lightning's text about its model registry."""
    fit, evaluate = "`last` (the newest run of the job, exactly where it stopped)", "`last` or `best` (of the job's"
    for subcommand, said in (("fit", fit), ("test", evaluate)):
        with pytest.raises(SystemExit):
            ProjectCLI(args=[subcommand, "--help"])
        text = " ".join(capsys.readouterr().out.split())  # the help's lines joined again
        assert said in text
        assert "Lightning Model Registry" not in text and "special keywords" not in text


def test_a_command_builds_the_parser_of_its_subcommand_alone_and_help_still_lists_them_all(monkeypatch, capsys):
    config = ["--config", str(ROOT / "configs/simple_cnn.yaml")]
    built: list[list[str]] = []
    every = ProjectCLI.subcommands
    monkeypatch.setattr(ProjectCLI, "subcommands", lambda cli: built.append(list(every(cli))) or every(cli))
    for subcommand in ("validate", "fit"):
        with pytest.raises(SystemExit):
            ProjectCLI(args=[subcommand, *config, "--print_config"])
        assert "max_epochs: 3" in capsys.readouterr().out and built and all(b == [subcommand] for b in built)
        built.clear()
    with pytest.raises(SystemExit):  # a script's settings for another subcommand's parser: that one is built too
        ProjectCLI(args=["validate", *config, "--print_config"], parser_kwargs={"fit": {"prog": "train.py"}})
    assert "max_epochs: 3" in capsys.readouterr().out and built[0] == ["fit", "validate"]
    with pytest.raises(SystemExit):
        ProjectCLI(args=["--help"])
    assert "{fit,validate,test,predict}" in capsys.readouterr().out
    assert _usage_error(["fitt", *config], capsys)[:2] == [
        "error: argument subcommand: invalid choice: 'fitt' (choose from 'fit', 'validate', 'test', 'predict')",
        "did you mean fit?",
    ]
    named = {"test": ["-c", "fit.yaml", "test", "--ckpt_path=best"], "predict": ["--print_config", "predict"], None: []}
    for subcommand, args in [*named.items(), (None, ["fitt", "fit"])]:
        assert named_subcommand(args) == subcommand
    assert named_subcommand(Namespace(subcommand="validate")) == "validate"


def test_model_help_says_what_each_model_accepts_as_weights(capsys) -> None:
    with pytest.raises(SystemExit):
        ProjectCLI(args=["fit", "--model.help", "ResNetClassifier"])
    help_text = " ".join(capsys.readouterr().out.split())
    weights = help_text[help_text.index("--model.weights WEIGHTS Start") :][:300]
    assert "torchvision weights name" in weights and "DEFAULT, IMAGENET1K_V1" in weights


def test_turning_checkpointing_off_is_refused_in_one_line_with_the_option_that_does_what_is_meant(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train.py", "fit", "--config", str(ROOT / "configs/simple_cnn.yaml"),
                                      "--trainer.enable_checkpointing=false"])  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "Traceback" not in err
    assert (
        "--trainer.enable_checkpointing false: every run writes last.ckpt" in err and "--checkpoint.monitor null" in err
    )


@pytest.mark.slow
def test_how_a_network_runs_is_not_part_of_its_checkpoint(tmp_path: Path, monkeypatch, fashion_mnist_dir) -> None:
    """compile and channels_last are execution choices, not the model: a checkpoint trained without channels_last is
    validated with it, and one trained with it without it."""
    monkeypatch.chdir(tmp_path)
    tiny = ["--trainer.max_steps=1", "--trainer.limit_val_batches=1", "--test_after_fit=false",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]  # fmt: skip
    for layout, name in (("false", "plain"), ("true", "nhwc")):
        ProjectCLI(args=["fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), f"--model.channels_last={layout}",
                         f"--trainer.logger.init_args.name={name}", *tiny])  # fmt: skip
    for name, layout in (("plain", True), ("nhwc", False)):
        last = tmp_path / f"logs/{name}/version_0/checkpoints/last.ckpt"
        cli = ProjectCLI(args=["validate", "--config", str(ROOT / "configs/simple_cnn.yaml"), f"--ckpt_path={last}",
                               f"--model.channels_last={layout}", *tiny[1:2], "--trainer.logger=false"])  # fmt: skip
        assert "val_acc" in cli.trainer.callback_metrics
        conv = next(m for m in cli.model.net.modules() if isinstance(m, torch.nn.Conv2d) and m.in_channels > 1)
        assert conv.weight.is_contiguous(memory_format=torch.channels_last) is layout
        assert not {"compile", "channels_last"} & set(torch.load(last, weights_only=True)["hyper_parameters"])


@pytest.mark.slow
@pytest.mark.matrix  # nightly: the slowest checks
def test_a_checkpoint_alone_tests_on_its_data_or_names_the_option_for_data_that_moved(
    tmp_path: Path, monkeypatch, fashion_mnist_dir: Path
) -> None:
    """`test --ckpt_path <file>` and nothing else: the datamodule from the hyper-parameters it saved in the checkpoint;
    data that is not where it was is named in one line with the option that gives it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fm").mkdir()
    for source in fashion_mnist_dir.glob("*-ubyte.gz"):
        (tmp_path / "fm" / source.name).symlink_to(source)
    ProjectCLI(args=["fit", "--config", str(ROOT / "configs/simple_cnn.yaml"), f"--data.data_dir={tmp_path / 'fm'}",
                     "--trainer.max_steps=2", "--trainer.limit_val_batches=1", "--test_after_fit=false",
                     "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"])  # fmt: skip
    last = "logs/simple_cnn/version_0/checkpoints/last.ckpt"
    quick = ["--trainer.limit_test_batches=2", "--trainer.enable_progress_bar=false", "--trainer.logger=false"]
    alone = ProjectCLI(args=["test", f"--ckpt_path={last}", *quick])
    assert type(alone.datamodule).__name__ == "FashionMNISTDataModule" and "test_acc" in alone.trainer.callback_metrics
    (tmp_path / "fm").rename(tmp_path / "moved")
    with pytest.raises(MissingFileError) as missing:
        ProjectCLI(args=["test", f"--ckpt_path={last}", *quick])
    assert str(missing.value) == (
        f"--ckpt_path {last} was trained on data from --data.data_dir {tmp_path / 'fm'}, which is not there: give"
        " --data.data_dir <where that data is now>."
    )
    moved = ProjectCLI(args=["test", f"--ckpt_path={last}", f"--data.data_dir={tmp_path / 'moved'}", *quick])
    assert moved.trainer.callback_metrics["test_acc"] == alone.trainer.callback_metrics["test_acc"]


def test_a_script_keeps_its_own_options_and_passes_every_other_flag_to_train_py(capsys) -> None:
    parser = script_parser("A script.")
    parser.add_argument("--config", action="append", required=True, help="Job config(s).")
    parser.add_argument("--seeds", type=int, nargs="+", help="Seeds.")
    argv = ["--config", "a.yaml", "--trainer.max_epochs", "3", "--seeds", "1", "2", "--model.init_args.lr=-1e-3",
            "--model.lr", "-0.5", "--config=b.yaml", "--data.topics", "food", "work"]  # fmt: skip
    args, rest = parse_known(parser, argv)
    assert args.config == ["a.yaml", "b.yaml"] and args.seeds == [1, 2]
    assert rest == ["--trainer.max_epochs", "3", "--model.init_args.lr=-1e-3", "--model.lr", "-0.5", "--data.topics",
                    "food", "work"]  # fmt: skip
    refusals = [
        (["--seeds", "x"], "error: Parser key \"seeds\" element 1: Expected a <class 'int'>. Got value: x"),
        (["--see", "1"], "error: unrecognized arguments: --see 1\ndid you mean --seeds?"),
    ]
    with pytest.raises(SystemExit) as stop:  # --help is the script's own, wherever it stands
        parse_known(parser, ["--trainer.max_epochs", "3", "-h"])
    assert stop.value.code == 0 and "--seeds SEEDS" in capsys.readouterr().out
    for argv, said in refusals:
        with pytest.raises(SystemExit):
            parser.parse_args(["--config=a.yaml", *argv])
        assert capsys.readouterr().err.startswith(f"{said}\n`")  # the reason first, in one line; no usage above it


# Every script that parses a command line of its own (train.py's is LightningCLI's).
SCRIPTS = sorted(
    path
    for folder in [
        ROOT,
        *(
            p
            for p in ROOT.iterdir()
            if p.is_dir() and not p.is_symlink() and p.name != "tests" and not p.name.startswith(".")
        ),
    ]
    for path in (folder.glob("*.py") if folder == ROOT else folder.rglob("*.py"))
    if '__name__ == "__main__"' in (text := path.read_text()) and re.search(r"\bparse_(args|known)\(", text)
)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_script_reads_its_arguments_one_way_each_with_its_help(script: Path, monkeypatch) -> None:
    """jsonargparse, as train.py (LightningCLI, whose arguments are documented by their classes' docstrings), with a
    help line per option."""
    spec = importlib.util.spec_from_file_location(f"script_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # as `python script.py` has it (a dataclass looks it up)
    spec.loader.exec_module(module)
    parser = module.parser()
    assert isinstance(parser, ArgumentParser)
    assert [action.option_strings or action.dest for action in parser._actions if not action.help] == []
