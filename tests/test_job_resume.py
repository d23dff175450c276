"""Every shipped job config, and every preset that adds a callback, resumes exactly through the CLI.

As a user runs it: `train.py fit --config <job> [--config <preset>]` stopped by a real SIGTERM in the middle of
an epoch (exit status 143), then the same command with `--ckpt_path last`, must end with the weights and the
step of the same command never stopped. Each case is three `train.py` processes; the main job and the two-stage
fine-tuning jobs run with the suite, every case with `make matrix`.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT, last_checkpoint, offline_flags, sigterm_at, train_process
from tests.helpers import same_state

JOBS = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml") if p.stem != "defaults")
SHORT = [
    "--trainer.max_epochs=2", "--trainer.limit_train_batches=6", "--trainer.limit_val_batches=2",
    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=2",
    "--test_after_fit=false",
]  # fmt: skip
STOP_AT = (1, 2)  # epoch, batch: mid-epoch, after the first epoch's checkpoint


@dataclass(frozen=True)
class Case:
    """A job config, the presets stacked on it, and what this offline machine supplies instead (data, weights)."""

    job: str
    presets: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    needs: tuple[str, ...] = field(default=(), compare=False)  # "fmnist_weights": an earlier run's network
    stop_at: tuple[int, int] = STOP_AT

    @property
    def id(self) -> str:
        return "+".join((self.job, *self.presets))

    def args(self) -> list[str]:
        configs = [f"configs/{self.job}.yaml", *(f"configs/presets/{p}.yaml" for p in self.presets)]
        return ["fit", *(f"--config={ROOT / c}" for c in configs), *SHORT, *self.flags]


def _cases() -> list[Case]:
    """One case per job config; the presets that add a callback, on the job they are meant for."""
    cases = [Case(job) for job in JOBS]
    # Stopped in stage 1 (epoch 1), unfrozen at epoch 2 by the preset after the resume.
    cases.append(Case("resnet_fmnist_small", ("transfer",), ("--trainer.max_epochs=3",), ("fmnist_weights",)))
    # extra:tools
    cases += [Case("simple_cnn", (preset,)) for preset in ("ema", "swa", "lr_find")]
    # /extra:tools
    return cases


CASES = _cases()
IN_SUITE = {"simple_cnn"}  # the main job in `make test-all`; every job in `make matrix`


def _marks(case: Case) -> list[pytest.MarkDecorator]:
    return [pytest.mark.slow] + ([] if case.id in IN_SUITE else [pytest.mark.matrix])


def _flags(case: Case, inputs: dict[str, Path], request: pytest.FixtureRequest) -> list[str]:
    flags = offline_flags(f"configs/{case.job}.yaml", inputs, request)
    if "fmnist_weights" in case.needs:  # an earlier run's network, as `make transfer` passes step 1's checkpoint
        flags.append(f"--model.weights={inputs['resnet_weights']}")
    return flags


@pytest.mark.parametrize("case", [pytest.param(c, marks=_marks(c), id=c.id) for c in CASES])
def test_a_job_stopped_by_sigterm_resumes_exactly_with_ckpt_path_last(
    case: Case, tmp_path: Path, offline_inputs: dict[str, Path], request: pytest.FixtureRequest
) -> None:
    args = [*case.args(), *_flags(case, offline_inputs, request)]
    train_process(args, tmp_path / "full")
    stopped = train_process([*args, *sigterm_at(*case.stop_at)], tmp_path / "cut", expect=128 + signal.SIGTERM)
    assert "Stopping after optimizer step" in stopped.stdout + stopped.stderr
    train_process([*args, "--ckpt_path=last"], tmp_path / "cut")
    full, resumed = last_checkpoint(tmp_path / "full"), last_checkpoint(tmp_path / "cut")
    assert resumed["global_step"] == full["global_step"] > 0
    assert same_state(full["state_dict"], resumed["state_dict"]), f"{case.id}: weights differ after the resume"
