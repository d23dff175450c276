"""Logger presets: CSV, MLflow, W&B offline get metrics, images, tables and the config; resume continues a run."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lightning_template.engine.cli import ProjectCLI

from tests.conftest import QUICK, ROOT

JOB = str(ROOT / "configs" / "simple_cnn.yaml")
PRESETS = ROOT / "configs" / "presets"


def fit(tmp_path: Path, preset: str, *extra: str) -> None:
    """`train.py fit` in this process, from `tmp_path`."""
    os.chdir(tmp_path)
    try:
        ProjectCLI(args=["fit", "--config", JOB, "--config", str(PRESETS / preset), *QUICK, "--trainer.max_epochs=1",
                          "--test_after_fit=false", *extra])  # fmt: skip
    finally:
        if "wandb" in sys.modules:  # close the W&B run, or the next run in this process would join it
            sys.modules["wandb"].finish()


@pytest.mark.slow
def test_mlflow_run_holds_params_metrics_images_and_config_and_resume_continues_it(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    import mlflow

    store = f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path / 'logs' / 'mlflow.db'}"
    fit(tmp_path, "mlflow.yaml", store)
    fit(tmp_path, "mlflow.yaml", store, "--trainer.max_epochs=2", "--ckpt_path=last")
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'logs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("simple_cnn")  # named after the job
    (run,) = client.search_runs([experiment.experiment_id])  # resumed into the same run, not a second one
    where = (
        f"MLflow run {run.info.run_name} ({run.info.run_id}) in experiment simple_cnn: mlflow ui --backend-store-uri"
    )
    assert capsys.readouterr().out.count(where) == 2  # both runs said where they went
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_acc")] == [9, 19]
    job = yaml.safe_load((ROOT / "configs/simple_cnn.yaml").read_text())["model"]["init_args"]
    assert run.data.params["dropout"] == str(job["dropout"])  # the job's settings, as the run had them
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "train", "val"} <= artifacts
    matrix = {a.path for a in client.list_artifacts(run.info.run_id, "val/confusion_matrix")}
    assert {"val/confusion_matrix/step_0000010.png", "val/confusion_matrix/step_0000010.md"} <= matrix
    checkpoints = list((tmp_path / "logs" / "mlflow").glob(f"*/{run.info.run_id}/checkpoints/last.ckpt"))
    assert len(checkpoints) == 1


@pytest.mark.slow
def test_csv_and_wandb_offline_presets_write_their_files(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    fit(tmp_path, "csv_logger.yaml")
    (run_dir,) = (tmp_path / "logs" / "simple_cnn").glob("version_*")
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert any(row.get("val_acc") for row in rows) and any(row.get("lr-AdamW/head") for row in rows)
    assert any(row.get("final/val_acc") for row in rows)  # the run's summary, as TensorBoard gets in HPARAMS
    assert (run_dir / "images" / "val" / "confusion_matrix" / "step_0000010.png").is_file()
    assert "true \\ predicted" in (run_dir / "tables" / "val" / "confusion_matrix" / "step_0000010.csv").read_text()

    fit(tmp_path, "wandb.yaml")
    (offline,) = (tmp_path / "logs" / "wandb").glob("offline-run-*")
    assert f": wandb sync {offline.relative_to(tmp_path)}\n" in capsys.readouterr().out  # where the run went
    assert list(offline.glob("run-*.wandb"))  # the run, ready for `wandb sync`
    assert (offline / "files" / "config.yaml").is_file()
    assert list((offline / "files" / "media" / "images").rglob("*.png"))


@pytest.mark.slow
def test_a_tracker_that_is_not_installed_is_named_with_the_fix(tmp_path: Path) -> None:
    # without wandb
    code = "import sys; sys.modules['wandb'] = None; from lightning_template.engine.cli import main; main()"
    args = ["fit", "--config", JOB, "--config", str(PRESETS / "wandb.yaml"), *QUICK]
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, capture_output=True, text=True,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert result.returncode != 0
    assert "needs the `wandb` package: uv sync --inexact --extra wandb" in result.stderr
    assert not (tmp_path / "logs").exists()  # before anything ran


@pytest.mark.slow
def test_each_mlflow_run_of_a_job_has_its_own_name(tmp_path: Path, monkeypatch) -> None:
    """MLflow names runs from Python's `random`, which every run of a job seeds alike."""
    monkeypatch.chdir(tmp_path)
    args = ["--config", JOB, "--config", str(PRESETS / "mlflow.yaml"), "--seed_everything=42"]
    names = set()
    for _ in range(2):  # each run created right after its seeding, as in `train.py fit`
        logger = ProjectCLI(args=args, run=False).trainer.logger
        names.add(logger.experiment.get_run(logger.run_id).info.run_name)
    assert len(names) == 2, names
