"""Several workers at once: `tune.py --workers N` on a real PostgreSQL server, `multirun.py --workers N`."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from lightning_template.search.search import SKIPPED

import multirun
import tune
from tests.conftest import ROOT
from tests.search.test_search import JOB, write_space

POSTGRES_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
# Grid trials with no pruning: which trial runs where changes with the workers, each trial's result must not.
GRID = {"model.optimizer.init_args.lr": {"choice": [3e-3, 2e-3, 1e-3]}}
SHORT = [
    "--trainer.limit_train_batches=10", "--trainer.limit_val_batches=2", "--trainer.max_epochs=2",
    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--test_after_fit=false",
]  # fmt: skip
# val_loss, not val_acc: two trials never tie, so the best is the same whichever order they ran in.
# Three epochs: a worker is killed between its first epoch's last.ckpt and its trial's end.
FLAGS = ["--sampler", "grid", "--pruner", "none", "--threads", "1", "--checkpoint.monitor=val_loss",
         "--checkpoint.mode=min", *SHORT, "--trainer.max_epochs=3"]  # fmt: skip


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A PostgreSQL server of Debian's `postgresql` package on 127.0.0.1, in a temporary data directory; its URL."""
    if not POSTGRES_BIN:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; .ci/run installs it)")
    bin_dir = POSTGRES_BIN[-1].parent
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []  # initdb refuses root
    folder = Path(tempfile.mkdtemp(prefix="postgres-"))
    if as_owner:
        shutil.chown(folder, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = folder / "data"
    subprocess.run([*as_owner, bin_dir / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync"],
                   check=True, capture_output=True)  # fmt: skip
    options = f"-h 127.0.0.1 -p {port} -k {folder}"
    pg_ctl = [*as_owner, bin_dir / "pg_ctl", "-D", data, "-w"]
    subprocess.run([*pg_ctl, "-o", options, "-l", folder / "server.log", "start"], check=True, capture_output=True)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*pg_ctl, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def start(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def kill_when(process: subprocess.Popen, find: Callable[[], int | None]) -> int:
    """SIGKILL the process `find` names (a worker mid-run: its first epoch-end last.ckpt is saved); its pid."""
    deadline = time.monotonic() + 240
    while (pid := find()) is None and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid is not None, process.communicate()[0][-3000:]
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.slow
@pytest.mark.processes
def test_two_workers_on_postgresql_share_the_grid_resume_a_killed_worker_and_match_one_process(tmp_path, postgres):
    """configs/slurm/tune.sbatch as one task of its array runs it on a node with 2 devices (here, CPU threads)."""
    space = write_space(tmp_path / "space.yaml", GRID)
    search = ["--search", str(space), "--trials", "3", "--study", "w", *FLAGS]  # after the script's own: they win
    node = tmp_path / "workers"
    node.mkdir()
    for path in ("tune.py", "configs"):  # the script runs in the repository's root
        (node / path).symlink_to(ROOT / path)
    slurm = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    slurm |= {"SLURM_GPUS_ON_NODE": "2", "STORAGE": postgres, "PYTHON": sys.executable, "CONFIG": JOB}
    workers = start(["bash", str(ROOT / "configs" / "slurm" / "tune.sbatch"), *search], node, slurm)
    out = node / "logs" / "tune" / "w"

    storage = optuna.storages.RDBStorage(postgres)  # one connection for every poll: a trial's last epoch is short

    def running_trial_with_a_checkpoint() -> int | None:
        saved = {int(c.parents[1].name.removeprefix("trial_")) for c in out.glob("trial_*/checkpoints/last.ckpt")}
        if saved:
            for trial in optuna.load_study(study_name="w", storage=storage).get_trials(states=(TrialState.RUNNING,)):
                if trial.number in saved:
                    return int(trial.user_attrs["process"].split(":")[0])
        return None

    killed = kill_when(workers, running_trial_with_a_checkpoint)
    output = workers.communicate(timeout=400)[0]
    assert workers.returncode == 0, output[-4000:]
    assert "ended by SIGKILL" in output, output[-4000:]

    trials = optuna.load_study(study_name="w", storage=postgres).trials
    (dead,) = [t for t in trials if t.state == TrialState.FAIL]
    assert dead.user_attrs["interrupted"] == "process died" and dead.user_attrs["process"].startswith(f"{killed}:")
    (resumed,) = [t for t in trials if t.user_attrs.get("resumes") == dead.number]
    assert resumed.state == TrialState.COMPLETE and resumed.params == dead.params
    assert not resumed.user_attrs["process"].startswith(f"{killed}:")  # by the other worker
    checkpoint = Path(f"logs/tune/w/trial_{dead.number:04d}/checkpoints/last.ckpt")
    assert f"Restoring states from the checkpoint path at {checkpoint}" in output
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 3 and len({t.params["model.optimizer.init_args.lr"] for t in complete}) == 3
    assert len({t.user_attrs["process"] for t in trials}) == 2  # both workers ran trials
    # No parameter set ran twice, the resumed one aside. A worker that asked for a trial as the other took the
    # budget's last one stores it as a surplus, not run: this happens when both finish their trials at once.
    trained = sorted(p.name for p in out.glob("trial_*"))
    ran = [t for t in trials if "resumes" not in t.user_attrs and not any(key in t.user_attrs for key in SKIPPED)]
    assert trained == sorted(f"trial_{t.number:04d}" for t in ran), [(t.number, t.state, t.user_attrs) for t in trials]

    # One process, on SQLite: the same table of values and the same best config.
    alone = start([sys.executable, str(ROOT / "tune.py"), "--config", JOB, *search], tmp_path / "alone")
    output = alone.communicate(timeout=400)[0]
    assert alone.returncode == 0, output[-4000:]

    def results(folder: Path) -> tuple[dict[str, str], list[str]]:
        rows = list(csv.DictReader((folder / "logs/tune/w/results.csv").open()))
        table = {r["model.optimizer.init_args.lr"]: r["value"] for r in rows if r["state"] == "complete"}
        best = (folder / "logs/tune/w/w_best.yaml").read_text().splitlines()
        return table, [line for line in best if not line.startswith("#")]  # the header names the trial's folder

    (table, best), (table_alone, best_alone) = results(tmp_path / "workers"), results(tmp_path / "alone")
    assert table == table_alone and len(table) == 3
    assert best == best_alone


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.matrix  # nightly: the slowest checks
def test_multirun_with_two_workers_takes_over_a_killed_workers_seed_and_resumes_it(tmp_path):
    args = ["--config", JOB, "--seeds", "1", "2", "--workers", "2", "--name", "m", *SHORT]
    process = start([sys.executable, str(ROOT / "multirun.py"), *args], tmp_path)
    out = tmp_path / "logs" / "multirun" / "m"

    def worker_with_a_checkpoint() -> int | None:
        for checkpoint in out.glob("seed_*/checkpoints/last.ckpt"):
            claim = checkpoint.parents[1] / "claim.json"
            if not (checkpoint.parents[1] / "result.json").exists() and claim.exists():
                return int(json.loads(claim.read_text())["process"].split(":")[0])
        return None

    kill_when(process, worker_with_a_checkpoint)
    output = process.communicate(timeout=400)[0]
    assert process.returncode == 0, output[-4000:]
    assert "ended by SIGKILL" in output and "died; taking it over" in output, output[-4000:]
    assert "resuming (--ckpt_path=" in output and "mean ± std over 2 runs" in output, output[-4000:]
    for seed in (1, 2):
        result = json.loads((out / f"seed_{seed}" / "result.json").read_text())
        config = yaml.safe_load((out / f"seed_{seed}" / "config.yaml").read_text())
        assert config["seed_everything"] == seed and result["best_score"] > 0.1  # trained, not a guess
        assert not (out / f"seed_{seed}" / "claim.json").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--workers", "0"], "--workers 0: give a number of worker processes of at least 1."),
        (["--threads", "0"], "--threads 0: give a number of threads of at least 1."),
    ],
)
def test_workers_or_threads_below_one_are_refused_in_one_line_before_anything_runs(
    tmp_path, monkeypatch, option, message
):
    monkeypatch.chdir(tmp_path)
    space = write_space(tmp_path / "space.yaml", GRID)
    for script, args in (
        (tune, ["--config", JOB, "--search", str(space), "--study", "z"]),
        (multirun, ["--config", JOB, "--seeds", "1", "2"]),
    ):
        with pytest.raises(SystemExit) as stop:
            script.main([*args, *option, *SHORT])
        assert stop.value.code == f"{script.__name__}.py: {message}"
    assert not (tmp_path / "logs").exists()
