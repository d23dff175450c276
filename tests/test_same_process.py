"""The project's CLI run in a process that goes on (a notebook's, a script's) leaves Lightning and torch as it found
them: a plain Lightning Trainer run after it, in the same process, behaves as it would in a fresh process."""

from __future__ import annotations

import logging
import signal
import sys
import warnings
from typing import Any

import pytest
import torch
from lightning import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_template.engine.cli import ProjectCLI

from tests.conftest import QUICK, ROOT

LIBRARIES = ("lightning.", "lightning_fabric.", "pytorch_lightning.", "torchmetrics.")
# A warning of Lightning's own, raised by a plain run's training steps, which the engine silences for its runs.
LIGHTNINGS_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def lightning_surface() -> dict[str, int]:
    """The identity of every attribute of Lightning's loaded modules and of the classes they define: a patch of a
    function, a method or a class replaces one."""
    surface = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(LIBRARIES):
            continue
        for attr, value in list(vars(module).items()):
            surface[f"{name}.{attr}"] = id(value)
            if isinstance(value, type) and value.__module__ == name:
                surface |= {f"{name}.{attr}.{key}": id(member) for key, member in vars(value).items()}
    return surface


def signal_handlers() -> dict[str, Any]:
    handlers = {}
    for signum in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
        try:
            handlers[signal.Signals(signum).name] = signal.getsignal(signum)
        except (ValueError, OSError):  # a real-time signal without a name
            continue
    return handlers


def python_settings() -> dict[str, Any]:
    """What Python's warnings and Lightning's loggers show: their filters and the warnings' format."""
    known = logging.root.manager.loggerDict.items()
    loggers = {name: list(log.filters) for name, log in known if isinstance(log, logging.Logger) and log.filters}
    return {"warning filters": list(warnings.filters), "warning format": warnings.formatwarning, "loggers": loggers}


def torch_flags() -> dict[str, Any]:
    """torch's process-wide settings that a training engine might turn."""
    return {
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic warn only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "cudnn benchmark": torch.backends.cudnn.benchmark,
        "cudnn deterministic": torch.backends.cudnn.deterministic,
        "grad enabled": torch.is_grad_enabled(),
        "anomaly detection": torch.is_anomaly_enabled(),
        "default dtype": torch.get_default_dtype(),
        "threads": torch.get_num_threads(),
    }


class Fails(Callback):
    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a run that raises")


# Shown each time (above pytest's own filter of it), unless a filter added later hides it.
@pytest.mark.filterwarnings(f"always:{LIGHTNINGS_WARNING}:FutureWarning")
def test_a_plain_trainer_after_the_cli_in_the_same_process_runs_as_in_a_fresh_one(
    tmp_path, monkeypatch, fashion_mnist_dir, caplog
) -> None:
    monkeypatch.chdir(tmp_path)
    # Lightning's modules that the CLI run imports for the first time are compared from the plain run before it.
    with warnings.catch_warnings(record=True) as fresh:
        plain_trainer_run(tmp_path)
    before = lightning_surface(), signal_handlers(), torch_flags(), python_settings()
    job = ["--config", str(ROOT / "configs/simple_cnn.yaml"), *QUICK, "--trainer.max_epochs=1",
           "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--test_after_fit=false"]  # fmt: skip
    ProjectCLI(args=["fit", *job])
    with pytest.raises(RuntimeError, match="a run that raises"):
        ProjectCLI(args=["fit", *job, "--trainer.callbacks+=tests.test_same_process.Fails"])
    surface, handlers, flags, settings = lightning_surface(), signal_handlers(), torch_flags(), python_settings()
    patched = sorted(key for key, identity in before[0].items() if surface.get(key, identity) != identity)
    assert not patched, f"the CLI's run left Lightning patched: {patched}"
    assert handlers == before[1] and flags == before[2]
    assert settings == before[3], "the CLI's run left warning filters, a warning format or logging filters behind"
    caplog.set_level(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:  # under the filters the run left
        assert plain_trainer_run(tmp_path) == 3 * 2  # a callback's hook of Lightning's own: called as ever
    # What the engine silences in its runs, Lightning says again in a plain one, as it did before the CLI's run (the
    # warning is that of the torch and Lightning releases installed: the locked ones say it).
    assert said_leafspec(caught) == said_leafspec(fresh)
    assert "Loading `train_dataloader` to estimate number of stepping batches." in caplog.messages


def said_leafspec(caught: list[warnings.WarningMessage]) -> bool:
    return any(issubclass(w.category, FutureWarning) and "LeafSpec" in str(w.message) for w in caught)


def plain_trainer_run(tmp_path) -> int:
    """A plain Trainer's fit, 3 batches with 2 callbacks that leave `on_train_batch_end` to Lightning's `Callback`:
    how many times Lightning called that hook."""
    calls = []

    class Scheduled(BoringModel):  # Lightning loads the loader to count the steps, and says so
        def configure_optimizers(self) -> Any:
            assert self.trainer.estimated_stepping_batches == 3
            return super().configure_optimizers()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Callback, "on_train_batch_end", lambda *args, **kwargs: calls.append(1))
        trainer = Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0, logger=False,
                          callbacks=[Callback(), Callback()], enable_progress_bar=False, enable_model_summary=False,
                          default_root_dir=tmp_path)  # fmt: skip
        trainer.fit(Scheduled())
    return len(calls)
