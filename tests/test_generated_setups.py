"""Exact resume over generated setups: Hypothesis draws a user's Lightning setup (tests/generated_setups.py) and a
stop, and the run stopped there and resumed with `--ckpt_path` must end bit-identical to the run never stopped
(weights, buffers, optimizer and scheduler states, global step, the module's own checkpoint entry, a stateful
callback's fingerprint of every trained batch and of every validation's loss), or must have been told at its start,
in one line, why it cannot be exact (`ExactResume: ...`), or refused in one line.

Every run goes through train.py's CLI in this process (`ProjectCLI`), as `python train.py fit ...` runs it; a DDP
setup (2 processes on the CPU) runs `python train.py fit ... --trainer.strategy=ddp` in its own processes. The
stops: a real SIGTERM after any training batch of the run (an epoch's last included) or inside any validation, and a
hard kill right after any checkpoint was written (the resume starts from that file as it was on disk).

`make test-all` runs a fixed, derandomized set of examples; `make resume-fuzz EXAMPLES=N` as many as asked
(RESUME_FUZZ_SEED picks another set). A failure is shrunk to its smallest setup, printed with the commands that
replay it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_template.engine.cli import ProjectCLI
from lightning_template.engine.errors import ProjectError

from tests import generated_setups as user
from tests.conftest import ROOT

EXAMPLES = int(os.environ.get("RESUME_FUZZ_EXAMPLES", 24))
DDP_EXAMPLES = int(os.environ.get("RESUME_FUZZ_DDP_EXAMPLES", 2))  # each starts its runs' processes: seconds each
FUZZ_SEED = int(os.environ.get("RESUME_FUZZ_SEED", 0))
QUIET = [
    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=2",
]  # fmt: skip


# What the resume says, in one line at its start, when it cannot be the run never stopped: its loader cannot be
# skipped into (it starts the epoch's data again), its checkpoint was written inside an accumulated step, or before
# the validation due after its batch, or a loader the engine keeps has persistent workers (their random streams), or
# DDP processes in manual optimization keep buffers of their own, or an epoch's training metrics cannot be the run's
# (each DDP process gathered its own, written after the epoch's last batch, a value not logged again), or the module
# keeps state no checkpoint holds, or a checkpoint written before an epoch's end resumes without it (at an epoch's
# last batch, or at max_steps inside the epoch).
SAID_WHY = (
    "starts the epoch's data again", "inside an accumulated step", "before the validation due",
    "keeps its worker processes from epoch to epoch", "without that epoch's end",
    "Lightning's StochasticWeightAveraging, resumed after its last averaging epoch or at the run's end",
    "each process keeps its own buffers", "are not the run's after this resume", "are not logged for it",
    "changed during the run that wrote the checkpoint and no checkpoint holds them", "never runs for it",
)  # fmt: skip


@dataclass(frozen=True)
class Setup:
    """A user's setup: the module's, the datamodule's and the Trainer's arguments, and the callbacks it adds."""

    model: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] = field(default_factory=dict)
    step_checkpoints: int | None = None  # a ModelCheckpoint every N optimizer steps, all kept
    early_stopping: bool = False  # stops at the first validation that does not improve val_loss by 0.1
    # Lightning's GradientAccumulationScheduler, 2 micro-batches a step from epoch 1: a callback (--trainer.callbacks)
    # or the module's (configure_callbacks)
    accumulation_schedule: str | None = None
    fine_tuning: bool = False  # a BaseFinetuning: the hidden layer, BatchNorm included, frozen until epoch 1
    epoch_checkpoints: bool = False  # a ModelCheckpoint at every training epoch's end, all kept
    averaging: str | None = None  # Lightning's EMAWeightAveraging (exponential), StochasticWeightAveraging (stochastic)
    # 1: the run in this process; 2: `python train.py fit ... --trainer.strategy=ddp` with 2 processes on the CPU
    processes: int = 1

    def args(self) -> list[str]:
        args = ["--model=tests.generated_setups.GeneratedModule", "--data=tests.generated_setups.GeneratedData"]
        args += [f"--model.{k}={v}" for k, v in self.model.items()]
        args += [f"--data.{k}={v}" for k, v in self.data.items()]
        args += [f"--trainer.{k}={v}" for k, v in self.trainer.items()]
        args += ["--trainer.callbacks+=tests.generated_setups.TrainedBatches"]
        if self.step_checkpoints:
            every = f"--trainer.callbacks.every_n_train_steps={self.step_checkpoints}"
            args += [
                "--trainer.callbacks+=ModelCheckpoint", every, "--trainer.callbacks.save_top_k=-1",
                "--trainer.callbacks.filename={step}",
            ]  # fmt: skip
        if self.epoch_checkpoints:
            args += [
                "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.save_on_train_epoch_end=true",
                "--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.filename={epoch}-end",
            ]  # fmt: skip
        if self.averaging == "exponential":
            args += ["--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging"]
        elif self.averaging == "stochastic":
            args += [
                "--trainer.callbacks+=StochasticWeightAveraging", "--trainer.callbacks.swa_lrs=0.01",
                "--trainer.callbacks.swa_epoch_start=2",
            ]  # fmt: skip
        if self.early_stopping:
            args += ["--early_stopping.patience=1", "--early_stopping.min_delta=0.1"]
        if self.accumulation_schedule == "callbacks":
            args += ["--trainer.callbacks+=GradientAccumulationScheduler", "--trainer.callbacks.scheduling={1: 2}"]
        elif self.accumulation_schedule == "module":  # configure_callbacks: after the engine's callbacks
            args += ["--model.scheduled_accumulation=true"]
        if self.fine_tuning:
            args += ["--model.batch_norm=true", "--trainer.callbacks+=tests.generated_setups.FreezeUntilEpoch"]
        if self.processes > 1:
            # Two optimizers, each stepping half of the network: DDP must look for the parameters a loss did not use.
            strategy = "ddp_find_unused_parameters_true" if self.model.get("optimization") == "manual-two" else "ddp"
            args += [
                f"--trainer.strategy={strategy}", f"--trainer.devices={self.processes}", "--trainer.accelerator=cpu",
                "--trainer.callbacks+=tests.generated_setups.RecordOutcome",
            ]  # fmt: skip
        sanity = [] if "num_sanity_val_steps" in self.trainer else ["--trainer.num_sanity_val_steps=0"]
        return [*args, *QUIET, *sanity]


@dataclass(frozen=True)
class Stop:
    """How the run is stopped: `sigterm` after training batch `at % batches + 1`, `validation` (a SIGTERM inside
    validation `at % validations`), or `kill` right after checkpoint `at % checkpoints` was written. Under DDP, a
    SIGTERM goes to the process of `rank`, or to every process (None, as a cluster's pre-emption sends it)."""

    kind: str
    at: int
    rank: int | None = None


@st.composite
def setups(draw: st.DrawFn) -> Setup:
    optimization = draw(st.sampled_from(["automatic", "automatic", "manual", "manual-two"]))
    automatic = optimization == "automatic"
    loader = draw(st.sampled_from(user.LOADERS))
    iterable = loader == "iterable"
    scheduler = draw(st.none() | st.sampled_from(user.SCHEDULERS))
    if iterable and scheduler == "OneCycleLR":  # a stream has no length to plan the cycle by
        scheduler = "CosineAnnealingLR"
    interval = "step" if scheduler == "OneCycleLR" else draw(st.sampled_from(["epoch", "step"]))
    every_other_epoch = draw(st.booleans()) and not iterable
    model = {
        "optimization": optimization,
        "returns": "dict"
        if scheduler == "ReduceLROnPlateau" and automatic
        else draw(st.sampled_from(["list", "dict"])),
        "scheduler": scheduler,
        "interval": interval,
        "frequency": draw(st.integers(1, 2)),
        # A plateau stepped at every step or every other epoch finds no val_loss at first: Lightning's docs say strict
        # False there.
        "strict": interval == "epoch" and not every_other_epoch,
        "dropout": draw(st.sampled_from([0.0, 0.2])),
        "step_buffer": draw(st.booleans()),
        "checkpoint_entry": draw(st.booleans()),
    }
    if scheduler is None:
        model = {k: v for k, v in model.items() if k in ("optimization", "dropout", "step_buffer", "checkpoint_entry")}
    data = {
        "loader": loader,
        "batch_size": draw(st.sampled_from([12, 16])),
        "num_workers": draw(st.sampled_from([0, 0, 2])),
        "augment": draw(st.booleans()),
        "train_size": draw(st.sampled_from([100, 112])),
    }
    if loader == "map":
        data["sampler"] = draw(st.sampled_from(user.SAMPLERS))
    if loader != "iterable":
        data["drop_last"] = draw(st.booleans())
    trainer: dict[str, Any] = {}
    if automatic:
        trainer["accumulate_grad_batches"] = draw(st.integers(1, 3))
        if draw(st.booleans()):
            trainer["gradient_clip_val"] = 0.5
    if draw(st.booleans()):
        trainer["max_epochs"] = draw(st.integers(2, 3))
    else:
        trainer["max_steps"] = draw(st.integers(7, 15))
    if not iterable and draw(st.booleans()):
        trainer["limit_train_batches"] = 0.75
    validation = draw(st.sampled_from(["epoch", "fraction", "batches"]))
    if validation == "fraction" and not iterable:
        trainer["val_check_interval"] = 0.5
    elif validation == "batches":
        trainer["val_check_interval"] = 3
    if every_other_epoch:
        trainer["check_val_every_n_epoch"] = 2
    if draw(st.booleans()):
        trainer["precision"] = "bf16-mixed"
    step_checkpoints = draw(st.none() | st.integers(2, 3))
    model["hook_draws"] = draw(st.booleans())  # drawn late: the setups drawn before it stay as they were
    early_stopping = draw(st.booleans())
    scheduled = draw(st.sampled_from([None, "callbacks", "module"]))
    scheduled = scheduled if trainer.get("accumulate_grad_batches") == 1 else None  # Lightning's condition for it
    finetuning = draw(st.booleans()) and optimization != "manual-two"  # one of its optimizers would train nothing
    if draw(st.booleans()):
        trainer["reload_dataloaders_every_n_epochs"] = 1
    epoch_checkpoints = draw(st.booleans())
    averaging = draw(st.sampled_from([None, "exponential", "stochastic"]))
    # Lightning's StochasticWeightAveraging takes one optimizer, and a loader with a length for its BatchNorm epoch
    averaging = (
        None if averaging == "stochastic" and (optimization == "manual-two" or (iterable and finetuning)) else averaging
    )
    if draw(st.booleans()):  # drawn last: the setups drawn before it stay as they were
        data["collate"] = "masking"
    if draw(st.booleans()):
        model["epoch_metrics"] = True
    # Drawn last, as the two above: Lightning's sanity validation before training (its default is 2 batches), a
    # validation of 2 batches, a step count for validation that runs across epochs, the epochs early stopping waits.
    if draw(st.booleans()):
        trainer["num_sanity_val_steps"] = 2
    if draw(st.booleans()):
        trainer["limit_val_batches"] = 2
    if validation == "batches" and not every_other_epoch and draw(st.booleans()):
        trainer["check_val_every_n_epoch"] = "null"
    if early_stopping and draw(st.booleans()):
        trainer["min_epochs"] = 2
    # Drawn last, as those above: state no checkpoint holds steering the loss, Lightning's overfit_batches (the first
    # 3 batches, in the dataset's order; a map-style dataset's), a max_time the run never reaches (Lightning's Timer,
    # whose state the checkpoint holds).
    if draw(st.booleans()):
        model["unsaved_state"] = True
    if loader == "map" and draw(st.booleans()):
        trainer.pop("limit_train_batches", None)
        trainer["overfit_batches"] = 3
    if draw(st.booleans()):
        trainer["max_time"] = "00:01:00:00"
    return Setup(
        model, data, trainer, step_checkpoints, early_stopping, scheduled, finetuning, epoch_checkpoints, averaging
    )


stops = st.builds(
    Stop, kind=st.sampled_from(["sigterm", "sigterm", "validation", "kill", "kill"]), at=st.integers(0, 999)
)
# Each process trains on its share of the data: twice the samples give each the batches of the setup in one process.
# A torch BatchSampler is refused under DDP (Lightning would train on batches of 1): tested below.
ddp_setups = (
    setups()
    .filter(lambda setup: setup.data["loader"] != "batch_sampler")
    .map(lambda setup: replace(setup, processes=2, data={**setup.data, "train_size": 2 * setup.data["train_size"]}))
)
ddp_stops = st.builds(
    Stop,
    kind=st.sampled_from(["sigterm", "sigterm", "validation", "kill"]),
    at=st.integers(0, 999),
    rank=st.sampled_from([None, 0, 1]),
)


@dataclass
class Finished:
    """A run that trained to its end: what it ended with (`user.outcome`; a DDP run's other processes' as `rank N:
    <key>`), and the training batches it ran."""

    outcome: dict[str, Any]
    batches: int


@dataclass
class Reference:
    """The run never stopped: its end, and what a stop can be drawn from."""

    outcome: dict[str, Any]
    batches: int  # training batches it ran
    validations: int  # validations inside fit
    checkpoints: list[Path]  # every checkpoint file it wrote, in order (copies)


REFERENCES: dict[str, Reference] = {}


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    previous = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def run(args: list[str], folder: Path) -> tuple[ProjectCLI | None, list[str]]:
    """`train.py fit <args>` in `folder`, in this process; the CLI (None if stopped) and the engine's warnings."""
    cli = None
    with inside(folder), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.suppress(SIGTERMException):  # stopped at a step boundary (train.py exits 143)
            cli = ProjectCLI(args=["fit", *args])
    return cli, [str(w.message) for w in caught if "ExactResume" in str(w.message)]


def run_processes(args: list[str], folder: Path) -> tuple[Finished | None, list[str]]:
    """`python train.py fit <args>` in `folder`, its DDP processes started by Lightning: how it finished (None if
    stopped) and the engine's lines; a refusal raises its one-line error, as in this process."""
    folder.mkdir(parents=True, exist_ok=True)
    for earlier in folder.glob("outcome-rank*.pt"):
        earlier.unlink()
    # One thread a process: several on 2 cores, each with as many threads as cores, run many times slower.
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")} | {"OMP_NUM_THREADS": "1"}
    # A session of its own: a run past its time is killed with every process it started (its other rank, workers).
    with subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), "fit", *args], cwd=folder, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    ) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if done.returncode == 1 and "\nError: " in done.stderr:
        raise ProjectError(done.stderr.partition("\nError: ")[2].partition("\n(--debug")[0])
    if done.returncode == 143:  # stopped at a step boundary
        return None, []
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}"
    ranks = [torch.load(path, weights_only=False) for path in sorted(folder.glob("outcome-rank*.pt"))]
    assert len(ranks) == 2, f"{len(ranks)} processes recorded their outcome"
    first, second = ranks[0]["outcome"], ranks[1]["outcome"]
    # The processes train one model: the same weights and optimizer states on both, stopped or not.
    same_weights = equal({name: first["weights and buffers"][name] for name in second["weights"]}, second["weights"])
    assert same_weights and equal(first["optimizers"], second["optimizers"]), "the DDP processes ended apart"
    merged = {**first, **{f"rank 1: {k}": v for k, v in second.items()}}
    told = [message for rank in ranks for message in rank["warned"] if "ExactResume" in message]
    return Finished(merged, ranks[0]["batches"]), told


def launch(setup: Setup, args: list[str], folder: Path) -> tuple[Finished | None, list[str]]:
    """The setup's run with `args`, in this process or in its DDP processes."""
    if setup.processes > 1:
        return run_processes(args, folder)
    cli, told = run(args, folder)
    if cli is None:
        return None, told
    return Finished(user.outcome(cli.trainer), cli.trainer.fit_loop.total_batch_idx + 1), told


def equal(a: Any, b: Any, close: bool = False) -> bool:
    """Bit-identical nested states (tensors, numbers, lists, dicts); `close`: floats equal to rounding (a mean the
    resumed run reduces from the stopped run's sum and its own, in another order)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k], close) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y, close) for x, y in zip(a, b, strict=True))
    if close and isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    return a == b


def reference(setup: Setup, root: Path) -> Reference:
    key = json.dumps(asdict(setup), sort_keys=True)
    if key not in REFERENCES:
        folder = root / f"reference-{len(list(root.iterdir()))}"  # a new folder, also after a run that failed
        keep_every_checkpoint = "--trainer.plugins=tests.generated_setups.KeepEveryCheckpoint"
        finished, _ = launch(setup, [*setup.args(), keep_every_checkpoint], folder)
        assert finished is not None
        validations = len(finished.outcome["validations"])
        checkpoints = sorted((folder / "snapshots").glob("*.ckpt"))
        REFERENCES[key] = Reference(finished.outcome, finished.batches, validations, checkpoints)
    return REFERENCES[key]


def stop_flags(stop: Stop, ref: Reference) -> list[str] | Path:
    """The flags that stop the run, or the checkpoint a hard kill leaves."""
    if stop.kind == "kill":
        return ref.checkpoints[stop.at % len(ref.checkpoints)]
    rank = [] if stop.rank is None else [f"--trainer.callbacks.rank={stop.rank}"]
    if stop.kind == "validation" and ref.validations:
        index = stop.at % ref.validations
        return [
            "--trainer.callbacks+=tests.generated_setups.SigtermInValidation", f"--trainer.callbacks.index={index}",
            *rank,
        ]  # fmt: skip
    count = stop.at % ref.batches + 1
    return [
        "--trainer.callbacks+=tests.generated_setups.SigtermAfterBatches",
        f"--trainer.callbacks.count={count}",
        *rank,
    ]


def stops_before_the_end(stop: Stop, ref: Reference) -> bool:
    """Whether a SIGTERM comes with training left after the step it interrupts: a validation with another after it,
    or a batch with a whole optimizer step (at most 3 micro-batches) after its own. The run must then stop there."""
    if stop.kind == "validation" and ref.validations:
        return stop.at % ref.validations < ref.validations - 1
    return stop.at % ref.batches + 1 <= ref.batches - 3


def replay(setup: Setup, stop: Stop) -> str:
    spec = json.dumps({"setup": asdict(setup), "stop": asdict(stop)})
    command = " ".join(["python train.py fit", *(f"'{a}'" if "{" in a else a for a in setup.args())])
    return (
        f"\nreplay: RESUME_SETUP='{spec}' .venv/bin/python -m pytest tests/test_generated_setups.py::test_replay -s"
        f"\nthe uninterrupted run by hand: {command}"
    )


def check(setup: Setup, stop: Stop, root: Path) -> str:
    """Stop the setup's run, resume it, compare with the run never stopped; what happened, in a word.

    A difference is allowed only where the resume said at its start why it cannot be exact (`SAID_WHY`): a resume
    from an epoch's end, or from last.ckpt of a loader the engine can skip into, must be exact.
    """
    ref = reference(setup, root)
    folder = root / f"stopped-{len(list(root.iterdir()))}"
    stopping = stop_flags(stop, ref)
    if isinstance(stopping, Path):  # a hard kill: what is on disk is that file, resumed by its path
        start = f"--ckpt_path={stopping}"
    else:
        stopped, _ = launch(setup, [*setup.args(), *stopping], folder)
        # Otherwise the resume below would start from the run's end, and prove nothing about a stop.
        assert stopped is None or not stops_before_the_end(stop, ref), f"the stop did not stop it{replay(setup, stop)}"
        start = "--ckpt_path=last"
    try:
        resumed, told = launch(setup, [*setup.args(), start], folder)
    except ProjectError as refusal:
        assert "\n" not in str(refusal), f"a refusal must be one line: {refusal}"
        return "refused"
    assert resumed is not None, "the resumed run was stopped"
    assert all("\n" not in line for line in told), told
    expected, got = ref.outcome, resumed.outcome
    differ = [key for key in expected if not equal(expected[key], got[key], close=key == "epoch metrics")]
    # A skipped validation changes the validations recorded: said of a run that has them all, it is false.
    false_alarm = [line for line in told if "before the validation due" in line and not differ]
    assert not false_alarm, f"{false_alarm}{replay(setup, stop)}"
    if differ and any(why in line for line in told for why in SAID_WHY):
        return "warned"
    assert not differ, (
        f"the resumed run differs from the one never stopped in: {', '.join(differ)}"
        f" (global step {got['global_step']} vs {expected['global_step']}){replay(setup, stop)}"
    )
    return "exact"


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="generated-setups-") as folder:
        yield Path(folder)


# What the generator found, each ending otherwise before its fix: the smallest setups, checked one by one below.
PLATEAU = Setup(  # ReduceLROnPlateau on val_loss at epoch ends, as Lightning's docs configure it
    model={"scheduler": "ReduceLROnPlateau", "interval": "epoch", "returns": "dict", "strict": True},
    data={"loader": "map"},
    trainer={"max_epochs": 3},
)
PLATEAU_EVERY_STEP = Setup(  # the same at every step, validating twice an epoch
    model={"scheduler": "ReduceLROnPlateau", "interval": "step", "returns": "dict", "strict": False},
    data={"loader": "map"},
    trainer={"max_epochs": 2, "val_check_interval": 0.5},
)
STATEFUL_LOADER = Setup(  # torchdata's StatefulDataLoader, the schedule's length read from the trainer
    model={"scheduler": "OneCycleLR", "interval": "step", "returns": "dict"},
    data={"loader": "stateful"},
    trainer={"max_epochs": 2},
)
MAX_STEPS = Setup(data={"loader": "map", "batch_size": 16, "drop_last": True}, trainer={"max_steps": 9})
MAX_STEPS_NO_VALIDATION = replace(MAX_STEPS, trainer={"max_steps": 9, "check_val_every_n_epoch": 2})
BATCH_SAMPLER = Setup(  # a RandomSampler in a BatchSampler draws its order from torch's generator
    data={"loader": "batch_sampler", "batch_size": 16}, trainer={"max_epochs": 2}
)
STEP_BEFORE_VALIDATION = Setup(  # a checkpoint every 2 steps, written before the validation after the same batch
    model={"dropout": 0.2},
    data={"loader": "map", "batch_size": 12, "drop_last": True},
    trainer={"accumulate_grad_batches": 3, "max_epochs": 2, "val_check_interval": 3},
    step_checkpoints=2,
)
EPOCH_END_STEP = Setup(  # step checkpoints at epochs' last batches, validation every other epoch
    model={"dropout": 0.2},
    data={"loader": "map", "batch_size": 12, "train_size": 100},
    trainer={"max_epochs": 2, "check_val_every_n_epoch": 2},
    step_checkpoints=3,
)
AT_MAX_STEPS = Setup(  # a step checkpoint at max_steps, before the validation due after that step
    data={"loader": "map", "batch_size": 12, "train_size": 100}, trainer={"max_steps": 9}, step_checkpoints=3
)
PERSISTENT_WORKERS = Setup(  # a stream augmented in 2 persistent workers, resumed from an epoch's end
    data={"loader": "iterable", "num_workers": 2, "augment": True, "train_size": 100, "batch_size": 12},
    trainer={"accumulate_grad_batches": 2, "max_epochs": 2},
)
STOP_BEFORE_VALIDATION = Setup(  # a SIGTERM after a batch with a validation due: the stop waits for it to end
    data={"loader": "map", "batch_size": 12, "train_size": 100}, trainer={"max_steps": 7, "val_check_interval": 0.5}
)
HOOK_DRAWS = Setup(  # random numbers drawn in the module's on_train_batch_end, after the engine's callbacks
    model={"hook_draws": True, "dropout": 0.2}, data={"loader": "map", "batch_size": 16}, trainer={"max_epochs": 2}
)
EARLY_STOP = Setup(  # early stopping decides at the second epoch's end (Lightning does not save that decision)
    data={"loader": "map", "batch_size": 12, "train_size": 100},
    trainer={"max_steps": 13, "limit_train_batches": 0.75},
    early_stopping=True,
)
EARLY_STOP_IN_AN_EPOCH = Setup(  # ... or at a validation every half epoch, written before that epoch's end
    model={"optimization": "manual"},
    data={"loader": "map", "batch_size": 12, "train_size": 100},
    trainer={"max_steps": 7, "limit_train_batches": 0.75, "val_check_interval": 0.5},
    early_stopping=True,
)
ACCUMULATION_SCHEDULE = Setup(  # GradientAccumulationScheduler sets epoch 1's accumulation at its start
    data={"loader": "map", "batch_size": 16, "train_size": 112},
    trainer={"max_epochs": 3},
    accumulation_schedule="module",
)
FINE_TUNING = Setup(  # a BaseFinetuning freezes the hidden layer again in the resumed run's setup
    data={"loader": "map", "batch_size": 16, "train_size": 112}, trainer={"max_epochs": 3}, fine_tuning=True
)
STOCHASTIC_AVERAGE = (
    Setup(  # Lightning's StochasticWeightAveraging sets up its averaging epochs in on_train_epoch_start
        data={"loader": "map", "batch_size": 12, "train_size": 100}, trainer={"max_epochs": 3}, averaging="stochastic"
    )
)
STOCHASTIC_AVERAGE_STOPPED_EARLY = Setup(  # early stopping ends the run inside the averaging epochs
    data={"loader": "map", "batch_size": 12, "train_size": 100},
    trainer={"accumulate_grad_batches": 2, "max_steps": 7, "limit_train_batches": 0.75},
    early_stopping=True,
    averaging="stochastic",
)
STOCHASTIC_AVERAGE_LAST_EPOCH_END = Setup(  # stopped at the last epoch's end, averaging since that epoch
    data={"loader": "map", "batch_size": 12, "train_size": 100},
    trainer={"max_epochs": 2, "check_val_every_n_epoch": 2},
    averaging="stochastic",
)
EXPONENTIAL_AVERAGE = replace(STOCHASTIC_AVERAGE, averaging="exponential")
STOCHASTIC_AVERAGE_BY_STEPS = replace(
    STOCHASTIC_AVERAGE, trainer={"max_steps": 22, "max_epochs": -1}
)  # averaged until training ends
RANDOM_COLLATE = Setup(  # a collate_fn that masks at random, in the main process or in persistent workers
    data={"loader": "map", "batch_size": 16, "train_size": 112, "collate": "masking"}, trainer={"max_epochs": 2}
)
RANDOM_COLLATE_IN_WORKERS = replace(RANDOM_COLLATE, data={**RANDOM_COLLATE.data, "num_workers": 2})
RANDOM_COLLATE_KEPT_LOADER = Setup(  # masks drawn in the persistent workers of a loader the engine keeps as it is
    data={"loader": "batch_sampler", "batch_size": 16, "num_workers": 2, "train_size": 100, "drop_last": True,
          "collate": "masking"},
    trainer={"max_steps": 7, "limit_train_batches": 0.75, "check_val_every_n_epoch": 2},
    step_checkpoints=2,
)  # fmt: skip
MIN_EPOCHS = Setup(  # early stopping decides in the first epoch; --trainer.min_epochs keeps the run going
    data={"loader": "map", "batch_size": 12, "train_size": 112},
    trainer={"max_steps": 20, "val_check_interval": 0.5, "min_epochs": 2},
    early_stopping=True,
)
LAST_STEP_VALIDATED = Setup(  # max_steps reached at a validation inside an epoch: the epoch's end follows it
    model={"epoch_metrics": True},
    data={"loader": "map", "batch_size": 16, "train_size": 100},
    trainer={"max_steps": 7, "limit_train_batches": 0.75, "val_check_interval": 0.5, "check_val_every_n_epoch": 2},
)
OVERFIT = Setup(  # Lightning's overfit_batches: its own sequential sampler took the engine's place
    data={"loader": "map", "batch_size": 12, "train_size": 100}, trainer={"max_epochs": 3, "overfit_batches": 3}
)
UNSAVED_STATE = Setup(  # a loss annealed by a buffer registered with persistent=False and a plain counter
    model={"unsaved_state": True}, data={"loader": "map", "batch_size": 16}, trainer={"max_epochs": 2}
)
EPOCHS_ENDED_EARLY = Setup(  # on_train_batch_start returns -1 at each epoch's fourth batch
    model={"end_epochs_at": 3}, data={"loader": "map", "batch_size": 12, "train_size": 100}, trainer={"max_steps": 8}
)
OUT_OF_TIME = Setup(  # Lightning's Timer, its state in every checkpoint
    data={"loader": "map", "batch_size": 16}, trainer={"max_epochs": 2, "max_time": "00:01:00:00"}
)
MAX_STEPS_AT_A_VALIDATION = (
    Setup(  # two optimizers step twice a batch: max_steps reached at a validation inside an epoch
        model={"optimization": "manual-two", "epoch_metrics": True},
        data={"loader": "batch_sampler", "batch_size": 12, "train_size": 100},
        trainer={"max_steps": 7, "val_check_interval": 0.5},
        early_stopping=True,
    )
)
LAST_BATCH_VALIDATED = Setup(  # the best checkpoint of the validation after an epoch's last batch, before its end
    model={"optimization": "manual", "epoch_metrics": True},
    data={"loader": "batch_sampler", "batch_size": 12, "train_size": 100},
    trainer={"max_steps": 7, "limit_train_batches": 0.75, "val_check_interval": 0.5, "min_epochs": 2},
    early_stopping=True,
)
EPOCH_END_STEP_METRICS = replace(EPOCH_END_STEP, model={"dropout": 0.2, "epoch_metrics": True})
INSIDE_A_STEP = Setup(  # the best-epoch checkpoint of a validation every 3 batches, accumulating 2
    data={"loader": "map", "batch_size": 12},
    trainer={"accumulate_grad_batches": 2, "val_check_interval": 3, "max_steps": 7},
)


def fuzzing(examples: int) -> Any:
    """Hypothesis's settings for `examples` drawn setups: the same fixed set on every machine unless a seed is given,
    every failure shrunk to its smallest setup and printed."""

    def apply(test: Any) -> Any:
        return seed(FUZZ_SEED)(
            settings(
                max_examples=examples, deadline=None, derandomize=FUZZ_SEED == 0, database=None, print_blob=True,
                suppress_health_check=[
                    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture
                ],
                phases=[Phase.generate, Phase.shrink],
            )(test)
        )  # fmt: skip

    return apply


@pytest.mark.slow
@fuzzing(EXAMPLES)
@given(setup=setups(), stop=stops)
def test_a_generated_setup_resumes_exactly_or_is_told_why_not(setup: Setup, stop: Stop, workdir: Path) -> None:
    note(replay(setup, stop))
    result = check(setup, stop, workdir)
    note(result)


@pytest.mark.slow
@pytest.mark.processes
@fuzzing(DDP_EXAMPLES)
@given(setup=ddp_setups, stop=ddp_stops)
def test_a_generated_ddp_setup_resumes_exactly_or_is_told_why_not(setup: Setup, stop: Stop, workdir: Path) -> None:
    note(replay(setup, stop))
    note(check(setup, stop, workdir))


FOUND = [  # each ended otherwise on an earlier version
    pytest.param(PLATEAU, Stop("sigterm", 6), "exact", id="plateau-sigterm-at-an-epochs-last-batch"),
    pytest.param(PLATEAU, Stop("kill", 1), "exact", id="plateau-kill-after-the-epoch-end-last-ckpt"),
    pytest.param(PLATEAU, Stop("sigterm", 2), "exact", id="plateau-sigterm-inside-the-first-epoch"),
    pytest.param(PLATEAU_EVERY_STEP, Stop("kill", 1), "exact", id="plateau-every-step-kill-after-mid-epoch-validation"),
    pytest.param(STATEFUL_LOADER, Stop("sigterm", 3), "exact", id="stateful-loader-onecycle-sigterm"),
    pytest.param(STATEFUL_LOADER, Stop("kill", 2), "exact", id="stateful-loader-kill-after-epoch-end"),
    pytest.param(MAX_STEPS, Stop("kill", 1), "exact", id="max-steps-kill-after-epoch-end"),
    pytest.param(MAX_STEPS_NO_VALIDATION, Stop("kill", 0), "exact", id="max-steps-epoch-without-validation"),
    pytest.param(BATCH_SAMPLER, Stop("validation", 0), "exact", id="batch-sampler-sigterm-in-epoch-end-validation"),
    pytest.param(STEP_BEFORE_VALIDATION, Stop("kill", 2), "warned", id="step-checkpoint-before-its-validation"),
    pytest.param(EPOCH_END_STEP, Stop("kill", 6), "warned", id="step-checkpoint-at-an-epochs-end-before-validation"),
    pytest.param(EPOCH_END_STEP, Stop("kill", 2), "exact", id="step-checkpoint-at-the-end-of-an-epoch-not-validated"),
    pytest.param(AT_MAX_STEPS, Stop("kill", 2), "warned", id="step-checkpoint-at-max-steps-before-validation"),
    pytest.param(AT_MAX_STEPS, Stop("kill", 4), "exact", id="finished-run-resumed-from-its-last-checkpoint"),
    pytest.param(PERSISTENT_WORKERS, Stop("validation", 0), "warned", id="persistent-workers-drawing-at-random"),
    pytest.param(STOP_BEFORE_VALIDATION, Stop("sigterm", 3), "exact", id="sigterm-before-a-mid-epoch-validation"),
    pytest.param(INSIDE_A_STEP, Stop("kill", 0), "warned", id="checkpoint-inside-an-accumulated-step"),
    pytest.param(HOOK_DRAWS, Stop("sigterm", 3), "exact", id="draws-in-the-modules-batch-end-hook"),
    pytest.param(EARLY_STOP, Stop("sigterm", 11), "exact", id="early-stopping-decided-at-an-epochs-end"),
    pytest.param(EARLY_STOP_IN_AN_EPOCH, Stop("sigterm", 5), "exact", id="early-stopping-decided-in-an-epoch"),
    pytest.param(ACCUMULATION_SCHEDULE, Stop("sigterm", 10), "exact", id="accumulation-scheduled-for-the-epoch"),
    pytest.param(FINE_TUNING, Stop("kill", 2), "exact", id="unfrozen-by-a-callback-before-an-epoch-end-checkpoint"),
    pytest.param(FINE_TUNING, Stop("sigterm", 10), "exact", id="unfrozen-by-a-callback-in-the-stopped-epoch"),
    pytest.param(
        STOCHASTIC_AVERAGE, Stop("sigterm", 12), "exact", id="stochastic-average-resumed-inside-an-averaging-epoch"
    ),
    pytest.param(STOCHASTIC_AVERAGE, Stop("kill", 5), "warned", id="stochastic-average-resumed-at-the-runs-end"),
    pytest.param(
        STOCHASTIC_AVERAGE_BY_STEPS,
        Stop("sigterm", 21),
        "warned",
        id="stochastic-average-by-steps-resumed-at-the-runs-end",
    ),
    pytest.param(RANDOM_COLLATE, Stop("sigterm", 9), "exact", id="random-collate-sigterm-inside-an-epoch"),
    pytest.param(
        RANDOM_COLLATE_IN_WORKERS, Stop("sigterm", 9), "exact", id="random-collate-in-workers-inside-an-epoch"
    ),
    pytest.param(
        RANDOM_COLLATE_IN_WORKERS, Stop("sigterm", 6), "exact", id="random-collate-in-workers-at-an-epoch-end"
    ),
    pytest.param(  # killed after the step checkpoint at the epoch's last batch: the workers' streams are not resumed
        RANDOM_COLLATE_KEPT_LOADER,
        Stop("kill", 1),
        "warned",
        id="random-collate-in-kept-persistent-workers-after-a-last-batch",
    ),
    pytest.param(
        STOCHASTIC_AVERAGE_STOPPED_EARLY,
        Stop("validation", 1),
        "warned",
        id="stochastic-average-resumed-where-early-stopping-ended-the-run",
    ),
    pytest.param(
        STOCHASTIC_AVERAGE_LAST_EPOCH_END,
        Stop("validation", 0),
        "warned",
        id="stochastic-average-resumed-at-the-last-epochs-end",
    ),
    pytest.param(
        EXPONENTIAL_AVERAGE,
        Stop("kill", 5),
        "exact",
        id="exponential-average-resumed-at-the-runs-end-ends-with-the-average",
    ),
    pytest.param(MIN_EPOCHS, Stop("sigterm", 9), "exact", id="min-epochs-after-early-stopping-at-an-epochs-end"),
    pytest.param(LAST_STEP_VALIDATED, Stop("validation", 0), "exact", id="sigterm-in-the-validation-at-max-steps"),
    pytest.param(OVERFIT, Stop("sigterm", 4), "exact", id="overfit-batches-sigterm-inside-an-epoch"),
    pytest.param(UNSAVED_STATE, Stop("sigterm", 9), "warned", id="state-no-checkpoint-holds-said-at-the-resume"),
    pytest.param(  # the state's values after the resumed run's first step were those of the stopped run's first
        UNSAVED_STATE, Stop("sigterm", 0), "warned", id="state-no-checkpoint-holds-stopped-after-the-first-step"
    ),
    pytest.param(EPOCHS_ENDED_EARLY, Stop("sigterm", 4), "exact", id="epochs-ended-early-sigterm-in-the-second"),
    pytest.param(EPOCHS_ENDED_EARLY, Stop("kill", 0), "exact", id="epochs-ended-early-kill-after-the-first"),
    pytest.param(OUT_OF_TIME, Stop("sigterm", 9), "exact", id="max-time-sigterm-inside-an-epoch"),
    pytest.param(  # the run resumed trained nothing and ended without the epoch's end, without a word
        MAX_STEPS_AT_A_VALIDATION, Stop("kill", 0), "warned", id="best-checkpoint-at-max-steps-inside-an-epoch"
    ),
    pytest.param(  # the harness read epoch 0's mean loss, which no batch was left to log after the resume
        LAST_BATCH_VALIDATED, Stop("kill", 2), "warned", id="best-checkpoint-after-an-epochs-last-batch"
    ),
    pytest.param(  # epoch 0's end never ran, without a word
        EPOCH_END_STEP_METRICS,
        Stop("kill", 2),
        "warned",
        id="step-checkpoint-at-an-epochs-last-batch-before-its-end",
    ),
]


@pytest.mark.slow
def test_a_generated_module_changes_no_state_its_checkpoint_lacks_unless_drawn_to(workdir: Path) -> None:
    """The resume names such state in one line (`SAID_WHY`), which would excuse any difference of the setup: only
    `unsaved_state` draws it (a module whose checkpoint lacks its sample count kept counting, naming it at every
    resume of the setups drawn without `checkpoint_entry`)."""
    from lightning import Trainer

    from lightning_template.engine.unsaved_state import fingerprints

    for drawn, expected in (({"epoch_metrics": True}, set()), ({"unsaved_state": True}, {"decay", "steps_taken"})):
        model = user.GeneratedModule(**drawn)
        before = fingerprints(model)
        with inside(workdir / "unsaved"):
            Trainer(
                max_steps=2, limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                enable_model_summary=False,
            ).fit(model, user.GeneratedData(batch_size=12, train_size=100))  # fmt: skip
        assert {name for name, value in fingerprints(model).items() if before.get(name) != value} == expected, drawn


@pytest.mark.slow
@pytest.mark.parametrize(("setup", "stop", "expected"), FOUND)
def test_the_setups_the_generator_found_end_as_they_should(setup, stop, expected, workdir: Path) -> None:
    assert check(setup, stop, workdir) == expected, replay(setup, stop)


@pytest.mark.slow
@pytest.mark.parametrize("setup", [EPOCH_END_STEP_METRICS, LAST_BATCH_VALIDATED], ids=["step-checkpoint", "validation"])
def test_a_metric_gathered_across_epochs_goes_on_after_a_resume_at_an_epochs_last_batch(setup, workdir: Path) -> None:
    """Resumed from a checkpoint written after an epoch's last batch, before its end, that epoch's metrics cannot be
    the run's (said); the sum of every loss so far, gathered across epochs, goes on: it started again from 0."""
    ref = reference(setup, workdir)
    start = stop_flags(Stop("kill", 2), ref)
    resumed, _ = launch(
        setup, [*setup.args(), f"--ckpt_path={start}"], workdir / f"across-{len(list(workdir.iterdir()))}"
    )
    assert resumed is not None
    total, expected = resumed.outcome["epoch metrics"][1][2], ref.outcome["epoch metrics"][1][2]
    assert math.isclose(total, expected, rel_tol=1e-6), (total, expected)


@pytest.mark.slow
def test_a_resume_that_min_epochs_keeps_going_does_not_say_it_ends_without_the_epochs_end(workdir: Path) -> None:
    """Early stopping had decided before the checkpoint, inside epoch 0; --trainer.min_epochs 2 keeps the run going, so
    the resumed run ends that epoch as the run never stopped did: a line saying otherwise would excuse a difference."""
    ref = reference(LAST_BATCH_VALIDATED, workdir)
    start = stop_flags(Stop("kill", 2), ref)
    folder = workdir / f"min-epochs-{len(list(workdir.iterdir()))}"
    resumed, told = launch(LAST_BATCH_VALIDATED, [*LAST_BATCH_VALIDATED.args(), f"--ckpt_path={start}"], folder)
    assert resumed is not None and 0 in resumed.outcome["epoch metrics"]  # epoch 0's end ran
    assert not [line for line in told if "without that epoch's end" in line], told


# Under DDP, the part a BaseFinetuning unfroze trained on each process's own gradients: the processes' weights differed
# in the run never stopped, and a resumed run restarted every process from rank 0's. In manual optimization, the part
# unfrozen was averaged only where Lightning's accumulation closed a step: not in the
# BatchNorm epoch of Lightning's StochasticWeightAveraging, which sets a whole epoch's accumulation and in which the
# module still steps. And Lightning has DDP broadcast no buffers in manual optimization: each process keeps its own
# BatchNorm statistics, which a checkpoint (rank 0's) cannot give back to the others.
MANUAL_UNDER_DDP = Setup(
    model={"optimization": "manual"}, data={"loader": "map", "batch_size": 12, "train_size": 200}, processes=2
)
FOUND_UNDER_DDP = [
    pytest.param(
        replace(FINE_TUNING, processes=2), Stop("sigterm", 10, rank=1), "exact", id="unfrozen-part-averaged-by-ddp"
    ),
    pytest.param(
        replace(MANUAL_UNDER_DDP, trainer={"max_epochs": 2}, fine_tuning=True, averaging="stochastic"),
        Stop("kill", 0),
        "exact",
        id="manual-optimization-unfrozen-part-averaged-in-swa-batchnorm-epoch",
    ),
    pytest.param(
        replace(
            MANUAL_UNDER_DDP,
            model={"optimization": "manual", "batch_norm": True},
            trainer={"max_epochs": 2, "val_check_interval": 0.5, "check_val_every_n_epoch": 2},
        ),
        Stop("validation", 0),
        "warned",
        id="manual-optimization-each-process-keeps-its-batchnorm-statistics",
    ),
    pytest.param(  # the shorter of two loaders, cycled inside the epoch after the one restarted at its end
        replace(
            MANUAL_UNDER_DDP,
            data={"loader": "dict", "batch_size": 12, "train_size": 200, "drop_last": True},
            trainer={"max_steps": 10, "check_val_every_n_epoch": 2},
            step_checkpoints=3,
            epoch_checkpoints=True,
        ),
        Stop("kill", 415),
        "exact",
        id="two-loaders-resumed-at-an-epochs-end-with-max-steps",
    ),
]


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize(("setup", "stop", "expected"), FOUND_UNDER_DDP)
def test_the_ddp_setups_the_generator_found_end_as_they_should(setup, stop, expected, workdir: Path) -> None:
    assert check(setup, stop, workdir) == expected, replay(setup, stop)


@pytest.mark.slow
@pytest.mark.processes
def test_under_ddp_a_loader_of_a_torch_batch_sampler_is_refused_in_one_line(workdir: Path) -> None:
    """Lightning would replace the BatchSampler with its distributed sampler and the loader's batch size, None: 1."""
    setup = Setup(data={"loader": "batch_sampler", "train_size": 200}, trainer={"max_epochs": 1}, processes=2)
    with pytest.raises(ProjectError, match="trains on batches of 1") as refused:
        run_processes(setup.args(), workdir / "batch-sampler-under-ddp")
    assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_a_resumed_run_writes_no_step_checkpoint_again_inside_an_accumulated_step(workdir: Path) -> None:
    """Resumed from step=3.ckpt, the next epoch's first micro-batches are still at step 3: a step checkpoint written
    there would replace the good one with one holding half a step."""
    setup = Setup(
        data={"loader": "map", "batch_size": 12, "train_size": 100},
        trainer={"accumulate_grad_batches": 4, "max_epochs": 2},
        step_checkpoints=3,
    )
    start = next(path for path in reference(setup, workdir).checkpoints if path.name.endswith("-step=3.ckpt"))
    folder = workdir / "no-rewrite"
    run([*setup.args(), f"--ckpt_path={start}"], folder)
    written = sorted(path.name for path in folder.rglob("*.ckpt"))
    assert "step=6.ckpt" in written and "step=3.ckpt" not in written, written


@pytest.mark.slow
def test_a_part_frozen_by_a_callback_the_resumed_run_drops_trains_and_that_is_said(workdir: Path) -> None:
    """Resumed without the callback that froze it (the user's choice), the part trains; a one-line warning says so."""
    folder, data = workdir / "dropped-callback", {"loader": "map", "batch_size": 16, "train_size": 112}
    freezing = ["--trainer.callbacks+=tests.generated_setups.FreezeUntilEpoch", "--trainer.callbacks.epoch=10"]
    run([*Setup(data=data, trainer={"max_epochs": 2}).args(), *freezing], folder)
    resumed, told = run([*Setup(data=data, trainer={"max_epochs": 3}).args(), "--ckpt_path=last"], folder)
    assert resumed is not None and all(p.requires_grad for p in resumed.model.body.parameters())
    said = "(body.0.weight, body.0.bias) were frozen when the checkpoint was written and train in this run"
    assert any(said in line for line in told), told


@pytest.mark.slow
def test_replay(workdir: Path) -> None:
    """One setup and stop, given as RESUME_SETUP (the line a failure prints)."""
    spec = os.environ.get("RESUME_SETUP")
    if not spec:
        pytest.skip("RESUME_SETUP not set: the line a failing generated setup prints")
    given_ = json.loads(spec)
    setup, stop = Setup(**given_["setup"]), Stop(**given_["stop"])
    print(check(setup, stop, workdir))
