"""Code nobody here wrote, through train.py: Lightning's demos and modules written as Lightning's docs write them
(tests/foreign_code.py). Each is trained, stopped by a real SIGTERM in the middle of an epoch and resumed with
`--ckpt_path last`: it ends exactly as the run never stopped, or it was told at its start, in one line, why its
training loader cannot continue from the middle of an epoch (and it still trains, resumes and honours its loader)."""

from __future__ import annotations

import contextlib
import csv
import signal
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch.demos.transformer import tokenize
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_template.engine.cli import ProjectCLI
from lightning_template.engine.errors import ConfigError, InterfaceError
from lightning_template.tasks.classification.data.fortunes import FORTUNES_DIR

from tests.conftest import last_checkpoint, sigterm_at, train_process
from tests.foreign_code import EpochValues
from tests.helpers import same_state

RUN = [
    "--trainer.max_epochs=2", "--trainer.limit_val_batches=2", "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1",
]  # fmt: skip
UNMONITORED = ["--checkpoint.monitor=null", "--early_stopping.monitor=null"]  # a model that logs no metric
BORING = ["--model=lightning.pytorch.demos.BoringModel", "--data=lightning.pytorch.demos.BoringDataModule"]
TRANSFORMER = ["--model=lightning.pytorch.demos.LightningTransformer"]  # its own loader: ./data/wikitext-2.txt
AUTOENCODER = ["--model=tests.foreign_code.LitAutoEncoder", "--data=tests.foreign_code.ImagesData"]
MANUAL = ["--model=tests.foreign_code.ManualAutoEncoder", "--data=tests.foreign_code.ImagesData"]
CODE = [f"output_{i}" for i in range(3)]  # the autoencoder's code of a sample
PER_LOADER = ["--checkpoint.monitor=val_loss/dataloader_idx_0", "--early_stopping.monitor=val_loss/dataloader_idx_1"]
CELLS = {  # flags, and the reason its training loader cannot continue mid-epoch (None: it resumes exactly)
    "boring-model": ([*BORING, *UNMONITORED, "--trainer.limit_train_batches=8"], None),
    "demo-transformer": ([*TRANSFORMER, *UNMONITORED, "--trainer.limit_train_batches=6"], None),
    "reduce-lr-on-plateau": (AUTOENCODER, None),
    "manual-optimization": (MANUAL, None),
    "manual-accumulation": ([*MANUAL, "--model.accumulate=2"], None),  # stopped between two steps
    "lazy-layers": ([*AUTOENCODER, "--model.lazy=true"], None),
    "two-validation-loaders": (
        [*MANUAL, "--data.val_loaders=2", *PER_LOADER],
        None,
    ),
    "weighted-sampler": (
        [*AUTOENCODER, "--data.loader=weighted"],
        "the training loader's order comes from a WeightedRandomSampler",
    ),
    "batch-sampler": (
        [*AUTOENCODER, "--data.loader=batch_sampler"],
        "the training loader's batches come from its batch_sampler (a BatchSampler)",
    ),
    "fewer-samples-an-epoch": (
        [*AUTOENCODER, "--data.loader=num_samples"],
        "the training loader's RandomSampler draws num_samples=32 of the 128 samples an epoch",
    ),
    "dict-of-loaders": (
        [*AUTOENCODER, "--data.loader=dict"],
        "the training loaders are a dict of 2 (Lightning's CombinedLoader)",
    ),
}


def corpus(folder: Path) -> int:
    """The demo transformer's data file, from real text (it would download WikiText-2); returns its vocabulary size."""
    text = (Path(FORTUNES_DIR) / "computers").read_text(encoding="utf-8", errors="replace").splitlines()[:400]
    path = folder / "data" / "wikitext-2.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(line for line in text if line.strip() and line != "%") + "\n", encoding="utf-8")
    return len(tokenize(path)[1])


def fit(folder: Path, monkeypatch, args: list[str]) -> list[str]:
    """train.py fit in this process (as train.py runs it) in `folder`; the ExactResume lines it warned."""
    folder.mkdir(exist_ok=True)
    monkeypatch.chdir(folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.suppress(SIGTERMException):  # stopped at a step boundary: train.py exits 143 here
            ProjectCLI(args=["fit", *args])
    return [str(w.message) for w in caught if str(w.message).startswith("ExactResume")]


@pytest.mark.slow
@pytest.mark.parametrize("cell", CELLS, ids=str)
def test_foreign_code_resumes_exactly_or_says_at_its_start_why_not(cell: str, tmp_path: Path, monkeypatch) -> None:
    args, reason = CELLS[cell]
    args = [*args, *RUN]
    if args[0] == TRANSFORMER[0]:
        args.append(f"--model.vocab_size={max(corpus(tmp_path / 'full'), corpus(tmp_path / 'cut'))}")
    stop = sigterm_at(epoch=1, batch=0 if cell == "fewer-samples-an-epoch" else 2)
    full = fit(tmp_path / "full", monkeypatch, args)
    fit(tmp_path / "cut", monkeypatch, [*args, *stop])
    resumed = fit(tmp_path / "cut", monkeypatch, [*args, "--ckpt_path=last"])
    uninterrupted, cut = last_checkpoint(tmp_path / "full"), last_checkpoint(tmp_path / "cut")
    assert cut["global_step"] == uninterrupted["global_step"] > 0
    if reason is None:
        assert not full and not resumed, full + resumed
        assert same_state(uninterrupted["state_dict"], cut["state_dict"]), "weights differ after the resume"
        return
    assert len(full) == 1 and full[0].startswith(f"ExactResume: {reason}, which cannot continue"), full
    assert any(f"but {reason}" in line for line in resumed), resumed
    if cell == "fewer-samples-an-epoch":  # the sampler is the user's: 2 batches an epoch, not a full shuffle
        assert uninterrupted["global_step"] == 4


@pytest.mark.slow
def test_a_loader_that_cannot_be_skipped_into_says_it_replays_the_epoch_only_where_batches_are_left(
    tmp_path: Path, monkeypatch
) -> None:
    """A batch_sampler's loader resumed from the checkpoint of the validation after an epoch's last batch (the best,
    watching the step): no batch of that epoch is left, nothing is trained again, and no line says otherwise. Resumed
    in the middle of an epoch, the line is said."""
    args = [
        *AUTOENCODER,
        *RUN,
        "--data.loader=batch_sampler",
        "--data.train_size=64",
        "--trainer.val_check_interval=0.5",
    ]
    watch_step = ["--checkpoint.monitor=step", "--checkpoint.mode=max"]
    fit(tmp_path / "end", monkeypatch, [*args, *watch_step, "--trainer.max_epochs=1"])
    (best,) = (tmp_path / "end").glob("logs/*/version_0/checkpoints/epoch=*.ckpt")
    assert (
        torch.load(best, weights_only=True)["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["ready"] == 4
    )
    resumed = fit(tmp_path / "end", monkeypatch, [*args, *watch_step, f"--ckpt_path={best}"])
    assert not [line for line in resumed if "starts the epoch's data again" in line], resumed
    fit(tmp_path / "mid", monkeypatch, [*args, *sigterm_at(epoch=0, batch=1)])
    resumed = fit(tmp_path / "mid", monkeypatch, [*args, "--ckpt_path=last"])
    assert [line for line in resumed if "after 2 batches" in line and "starts the epoch's data again" in line], resumed


@pytest.mark.slow
def test_an_epoch_set_up_by_a_callback_that_keeps_no_state_is_named_at_a_resume_inside_it(tmp_path, monkeypatch):
    """Lightning does not run `on_train_epoch_start` again for an epoch resumed in its middle: a callback that sets
    the epoch up there and keeps nothing in the checkpoint (a curriculum) leaves the rest of the epoch unlike the run
    never stopped, which is said in one line at the resume (and the attribute it sets, in one more)."""
    args = [*AUTOENCODER, *RUN, "--trainer.callbacks+=tests.foreign_code.InputShift"]
    full = fit(tmp_path / "full", monkeypatch, args)
    fit(tmp_path / "cut", monkeypatch, [*args, *sigterm_at(epoch=1, batch=2)])
    resumed = fit(tmp_path / "cut", monkeypatch, [*args, "--ckpt_path=last"])
    assert not full and len(resumed) == 2, full + resumed
    assert "Lightning does not run InputShift.on_train_epoch_start again for it" in resumed[0]
    assert resumed[1].startswith("ExactResume: the module's input_shift changed during the run that wrote")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "said"),
    [
        pytest.param(
            ["--model=tests.foreign_code.NoisyAutoEncoder", "--data=tests.foreign_code.ImagesData"],
            "the module draws from a torch.Generator of its own (noise), which no checkpoint holds",
            id="generator-of-its-own",
        ),
        pytest.param(
            [
                *AUTOENCODER,
                "--trainer.callbacks+=lightning.pytorch.callbacks.ModelPruning",
                "--trainer.callbacks.pruning_fn=l1_unstructured",
                "--trainer.callbacks.amount=0.2",
            ],
            "Lightning's ModelPruning saves the pruned weights without their masks",
            id="model-pruning",
        ),
    ],
)
def test_state_that_no_checkpoint_holds_is_said_at_the_resume(args, said, tmp_path, monkeypatch) -> None:
    full = fit(tmp_path / "full", monkeypatch, [*args, *RUN])
    fit(tmp_path / "cut", monkeypatch, [*args, *RUN, *sigterm_at(epoch=1, batch=2)])
    resumed = fit(tmp_path / "cut", monkeypatch, [*args, *RUN, "--ckpt_path=last"])
    assert not any(said in line for line in full) and any(said in line for line in resumed), full + resumed


@pytest.mark.slow
def test_epoch_level_metrics_of_a_run_resumed_twice_are_the_run_never_stopped(tmp_path: Path, monkeypatch) -> None:
    """A mean and a max of `self.log(..., on_epoch=True)`, a sum logged in `on_train_batch_end`, torchmetrics metrics
    logged by training and by a validation every 3 batches, and a lowest validation loss gathered across epochs: a run
    stopped twice in one epoch (before and after a validation inside it) logs what the run never stopped logs."""
    args = [
        *AUTOENCODER, "--model.epoch_metrics=true", *RUN, "--trainer.max_epochs=3", "--trainer.limit_train_batches=6",
        "--trainer.val_check_interval=3", "--trainer.callbacks+=tests.foreign_code.EpochValues",
    ]  # fmt: skip
    runs = {}
    for run, flags in (
        ("full", []),
        ("cut", sigterm_at(epoch=1, batch=1)),
        ("cut", [*sigterm_at(epoch=1, batch=4), "--ckpt_path=last"]),
        ("cut", ["--ckpt_path=last"]),
    ):
        (tmp_path / run).mkdir(exist_ok=True)
        monkeypatch.chdir(tmp_path / run)
        with contextlib.suppress(SIGTERMException):
            runs[run] = ProjectCLI(args=["fit", *args, *flags]).trainer.callbacks
    full, cut = (next(c.logged for c in runs[run] if isinstance(c, EpochValues)) for run in ("full", "cut"))
    assert full[1]["train_batches"] == 6 and {"train_worst", "train_mean", "val_mean", "lowest_val"} <= full[1].keys()
    assert cut == full[-2:]  # epoch 1, stopped twice, when epoch 2 starts; epoch 2 at the end


@pytest.mark.slow
@pytest.mark.parametrize("length", ["--trainer.max_epochs=3", "--trainer.max_steps=15"])
def test_a_metric_gathered_across_epochs_goes_on_after_a_resume_at_an_epochs_end(length, tmp_path, monkeypatch):
    """The lowest validation loss so far (a MinMetric never reset, whose state no `state_dict` holds): Lightning counts
    the epoch of an epoch-end checkpoint done on restoring it, and the metric still holds every validation's batches."""
    args = [*AUTOENCODER, "--model.epoch_metrics=true", *RUN, "--trainer.limit_train_batches=6", length,
            "--trainer.val_check_interval=3"]  # fmt: skip
    models = {}
    for run, flags in (("full", []), ("cut", sigterm_at(epoch=0, batch=5)), ("cut", ["--ckpt_path=last"])):
        (tmp_path / run).mkdir(exist_ok=True)
        monkeypatch.chdir(tmp_path / run)
        with contextlib.suppress(SIGTERMException):
            models[run] = ProjectCLI(args=["fit", *args, *flags]).model
    full, resumed = models["full"].lowest_val, models["cut"].lowest_val
    assert resumed.update_count == full.update_count  # every validation batch, the sanity check's included
    assert resumed.compute() == full.compute()


def test_a_plain_loader_overfits_a_few_batches(tmp_path: Path, monkeypatch) -> None:
    """`--trainer.overfit_batches` puts Lightning's sequential sampler into the loader the engine rebuilt."""
    monkeypatch.chdir(tmp_path)
    cli = ProjectCLI(args=["fit", *AUTOENCODER, *RUN, "--trainer.overfit_batches=2", "--trainer.max_epochs=1"])
    assert cli.trainer.global_step == 2


def test_a_model_of_lazy_layers_is_evaluated_from_its_checkpoint_alone(tmp_path: Path, monkeypatch) -> None:
    """`nn.LazyLinear` has no shape until its first batch: the checkpoint's shapes are what it loads, not a mismatch."""
    fit(tmp_path, monkeypatch, [*AUTOENCODER, "--model.lazy=true", *RUN, "--trainer.max_epochs=1",
                                "--trainer.limit_train_batches=2"])  # fmt: skip
    checkpoint = next(tmp_path.glob("logs/*/*/checkpoints/last.ckpt"))
    cli = ProjectCLI(args=["validate", f"--ckpt_path={checkpoint}", "--trainer.enable_progress_bar=false"])
    assert cli.model.encoder[0].weight.shape == (64, 28 * 28)
    assert "val_loss" in cli.trainer.callback_metrics


@pytest.mark.slow
def test_a_model_that_logs_nothing_is_told_how_to_train_without_a_metric(tmp_path: Path, monkeypatch) -> None:
    """Lightning's BoringModel logs nothing: the default monitor is refused with the way to go on, which trains."""
    monkeypatch.chdir(tmp_path)
    quick = [*BORING, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
             "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]  # fmt: skip
    with pytest.raises(ConfigError, match=r"it logged nothing\..*--checkpoint.monitor null --early_stopping.monitor"):
        ProjectCLI(args=["fit", *quick])
    assert not list(tmp_path.glob("logs/*/*/checkpoints/*.ckpt")), "a refused run left a checkpoint to resume from"
    cli = ProjectCLI(args=["fit", *quick, *UNMONITORED])
    assert cli.trainer.global_step == 2
    assert [p.name for p in tmp_path.glob("logs/boringmodel/*/checkpoints/*.ckpt")] == ["last.ckpt"]


def _predicted(folder: Path, monkeypatch, *flags: str) -> list[dict[str, str]]:
    """train.py predict of the autoencoder (its initial weights) in this process; the CSV's rows."""
    folder.mkdir(exist_ok=True)
    monkeypatch.chdir(folder)
    ProjectCLI(args=["predict", *AUTOENCODER, "--trainer.enable_progress_bar=false", *flags])
    with open(folder / "predictions.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_predictions_of_an_iterable_dataset_over_workers_are_numbered_by_their_place_in_the_stream(
    tmp_path, monkeypatch
):
    """An IterableDataset sharded over 2 loader workers has no sample indices: 64 rows, numbered as they came."""
    streamed = _predicted(tmp_path, monkeypatch, "--data.predict=stream")
    assert [int(r["index"]) for r in streamed] == list(range(64)) and list(streamed[0]) == ["index", *CODE]


def test_predictions_of_two_loaders_say_which_loader_each_row_comes_from(tmp_path: Path, monkeypatch) -> None:
    two = _predicted(tmp_path, monkeypatch, "--data.predict=two")
    assert list(two[0]) == ["dataloader_idx", "index", *CODE]
    assert [(r["dataloader_idx"], r["index"]) for r in two] == [(str(d), str(i)) for d in (0, 1) for i in range(64)]


def test_a_dict_or_tuple_of_per_sample_outputs_gets_a_column_per_value_and_a_scalar_no_file(tmp_path, monkeypatch):
    """A dict or a tuple of per-sample tensors: a column per value; a scalar is refused and no file is left."""
    named = _predicted(tmp_path, monkeypatch, "--model.returns=dict")
    assert list(named[0]) == ["index", "label", *(f"code_{i}" for i in range(3))]
    assert [int(r["label"]) for r in named] == [(128 + i) % 10 for i in range(64)]  # the labels, a sample each
    positional = _predicted(tmp_path, monkeypatch, "--model.returns=tuple")
    assert list(positional[0]) == ["index", *(f"output0_{i}" for i in range(3)), "output1"]
    with pytest.raises(
        InterfaceError, match=r"predict_step returned a tensor of shape \(\) as 'output' for a batch of"
    ):
        _predicted(tmp_path, monkeypatch, "--model.returns=scalar")
    assert not (tmp_path / "predictions.csv").exists()  # nothing that passes for a result


SHORT_EPOCHS = ["--model=tests.foreign_code.ShortEpochs", "--data=tests.foreign_code.ImagesData", *UNMONITORED, *RUN]


def test_epochs_ended_early_by_the_module_get_their_last_checkpoint(tmp_path: Path, monkeypatch, capsys) -> None:
    """`on_train_batch_start` returning -1 ends the epoch after 3 of its 8 batches (Lightning counts that batch
    processed, never started): last.ckpt is written at each epoch's end, and the closing line names it."""
    fit(tmp_path, monkeypatch, SHORT_EPOCHS)
    (named,) = [line.split(": ", 1)[1] for line in capsys.readouterr().out.splitlines() if "last checkpoint:" in line]
    assert (tmp_path / named).is_file(), f"the closing line names {named}, which is not there"
    saved = last_checkpoint(tmp_path)
    assert (saved["epoch"], saved["global_step"]) == (1, 6)


@pytest.mark.slow
def test_epochs_ended_early_resume_after_a_sigkill_as_the_run_never_stopped(tmp_path: Path) -> None:
    """Killed (SIGKILL: nothing saved on the way out) in epoch 2 of 3, the run resumes from the last.ckpt of epoch 1's
    end and ends with the weights of the run never stopped."""
    args = ["fit", *SHORT_EPOCHS, "--trainer.max_epochs=3"]
    train_process(args, tmp_path / "full")
    kill = ["--trainer.callbacks+=tests.helpers.SignalAtBatch", "--trainer.callbacks.epoch=1",
            "--trainer.callbacks.batch=1", f"--trainer.callbacks.signum={int(signal.SIGKILL)}"]  # fmt: skip
    train_process([*args, *kill], tmp_path / "cut", expect=-signal.SIGKILL)
    assert last_checkpoint(tmp_path / "cut")["global_step"] == 3  # epoch 1's end
    train_process([*args, "--ckpt_path=last"], tmp_path / "cut")
    uninterrupted, resumed = last_checkpoint(tmp_path / "full"), last_checkpoint(tmp_path / "cut")
    assert resumed["global_step"] == uninterrupted["global_step"] == 9
    assert same_state(uninterrupted["state_dict"], resumed["state_dict"])
