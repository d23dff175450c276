"""A full disk, or a kill, while a checkpoint is written, for real: train.py with its run folder on a small tmpfs of its
own (mounted in a private mount namespace: `unshare -m`, which needs root or CAP_SYS_ADMIN; skipped elsewhere, with
the reason). The file under a checkpoint's name is always a whole checkpoint: the previous one, or none; the run
stops with one line naming the file; `--ckpt_path last` and `best` go on from what was written."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_template.engine.cli import ProjectCLI

from tests.conftest import ROOT

AUTOENCODER = ["--model=tests.foreign_code.LitAutoEncoder", "--data=tests.foreign_code.ImagesData"]
RUN = [
    "fit", *AUTOENCODER, "--trainer.max_epochs=2", "--trainer.limit_val_batches=2",
    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--early_stopping.monitor=null",
]  # fmt: skip
# The disk fills as epoch 1 starts, leaving less room than a checkpoint (1.2 MB): the next one written fails.
FULL_IN_EPOCH_1 = ["--trainer.callbacks+=tests.helpers.FillDisk", "--trainer.callbacks.epoch=1",
                   "--trainer.callbacks.keep=300000"]  # fmt: skip
STEP_CHECKPOINTS = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                    "--trainer.callbacks.every_n_train_steps=3", "--trainer.callbacks.save_top_k=-1"]  # fmt: skip


def _unshare() -> list[str]:
    """The command that runs a process in a private mount namespace, or a skip naming why mounting is not possible."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no `unshare` (util-linux) to mount a small filesystem in a private namespace")
    probe = subprocess.run([unshare, "-m", "--propagation", "private", "mount", "-t", "tmpfs", "tmpfs", "/mnt"],
                           capture_output=True, text=True)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here: {probe.stderr.strip()}")
    return [unshare, "-m", "--propagation", "private"]


def on_small_disk(tmp_path: Path, args: list[str], size: str = "8m", kill: bool = False) -> Path:
    """train.py `args` with its working folder on a tmpfs of `size`; the folder where its exit status, output and a
    copy of its logs/ are."""
    folder, out = tmp_path / "disk", tmp_path / "out"
    folder.mkdir()
    out.mkdir()
    script = ROOT / "tests" / "scripts" / "on_small_disk.py"
    flag = ["--kill-rewrite"] if kill else []
    command = [*_unshare(), sys.executable, str(script), str(folder), size, str(out), *flag, "--", *args]
    subprocess.run(command, check=True, timeout=600, cwd=ROOT)
    return out


def checkpoints(out: Path) -> dict[str, int]:
    """{name: global step} of each file in the run's checkpoint folder; a file that is not a whole checkpoint fails."""
    (folder,) = out.glob("logs/*/version_0/checkpoints")
    steps = {}
    for path in sorted(folder.iterdir()):
        try:
            steps[path.name] = torch.load(path, map_location="cpu", weights_only=True)["global_step"]
        except Exception as err:
            pytest.fail(f"{path.name} is not a whole checkpoint ({type(err).__name__}: {err})")
    return steps


def stopped_with_one_line(out: Path, name: str) -> None:
    stderr = (out / "stderr").read_text()
    assert (out / "rc").read_text() == "1", stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    error = [line for line in stderr.splitlines() if line.startswith("Error: ")]
    assert len(error) == 1, stderr[-3000:]
    assert re.search(rf"could not write the checkpoint \S+/checkpoints/{re.escape(name)}\S* \(No space left", error[0])


@pytest.mark.slow
def test_a_full_disk_while_last_ckpt_is_rewritten_keeps_the_previous_one(tmp_path: Path, monkeypatch) -> None:
    """The checkpoint grows by 2 MB in epoch 1: rewritten in place, it would not fit even where the old one was."""
    grows = ["--trainer.callbacks+=tests.helpers.Ballast", "--trainer.callbacks.megabytes=2",
             "--trainer.callbacks.epoch=1"]  # fmt: skip
    out = on_small_disk(tmp_path, [*RUN, "--checkpoint.monitor=null", *FULL_IN_EPOCH_1, *grows])
    stopped_with_one_line(out, "last.ckpt")
    assert checkpoints(out) == {"last.ckpt": 8}  # epoch 0's end, whole; nothing else left beside it
    monkeypatch.chdir(out)  # room again: the same command goes on from it
    cli = ProjectCLI(args=[*RUN, "--checkpoint.monitor=null", "--ckpt_path=last"])
    assert cli.trainer.global_step == 16


@pytest.mark.slow
def test_a_full_disk_while_a_best_checkpoint_is_written_leaves_the_previous_best(tmp_path: Path, monkeypatch) -> None:
    out = on_small_disk(tmp_path, [*RUN, *FULL_IN_EPOCH_1])
    saved = checkpoints(out)
    (best,) = [name for name in saved if name.startswith("epoch=")]
    assert best.startswith("epoch=1-val_loss=") and saved == {best: 8, "last.ckpt": 8}, saved
    stopped_with_one_line(out, "epoch=2-val_loss=")
    monkeypatch.chdir(out)
    cli = ProjectCLI(args=["validate", *AUTOENCODER, "--ckpt_path=best", "--trainer.limit_val_batches=2"])
    assert cli.run_checkpoint.path.name == best


@pytest.mark.slow
def test_a_full_disk_while_a_step_checkpoint_is_written_leaves_the_earlier_ones(tmp_path: Path) -> None:
    out = on_small_disk(tmp_path, [*RUN, "--checkpoint.monitor=null", *STEP_CHECKPOINTS, *FULL_IN_EPOCH_1])
    stopped_with_one_line(out, "epoch=1-step=9.ckpt")
    assert checkpoints(out) == {"epoch=0-step=3.ckpt": 3, "epoch=0-step=6.ckpt": 6, "last.ckpt": 8}


@pytest.mark.slow
def test_a_sigkill_while_last_ckpt_is_rewritten_keeps_the_previous_one(tmp_path: Path, monkeypatch) -> None:
    """A checkpoint of 200 MB, killed while last.ckpt is written the second time: the first stays, whole; the
    partial file beside it is no checkpoint `--ckpt_path last` reads, and the resumed run's first save removes it."""
    ballast = ["--trainer.callbacks+=tests.helpers.Ballast", "--trainer.callbacks.megabytes=200"]
    args = [*RUN, "--checkpoint.monitor=null", "--trainer.limit_train_batches=3"]
    out = on_small_disk(tmp_path, [*args, *ballast], size="1g", kill=True)
    assert (out / "caught").read_text() == "True", "the second write of last.ckpt was not caught while under way"
    assert (out / "rc").read_text() == "-9"
    (folder,) = out.glob("logs/*/version_0/checkpoints")
    left = sorted(p.name for p in folder.iterdir() if p.name != "last.ckpt")
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 3
    monkeypatch.chdir(out)
    cli = ProjectCLI(args=[*args, "--ckpt_path=last"])
    assert cli.trainer.global_step == 6
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"], f"left beside it: {left}"


def test_a_checkpoint_is_written_beside_its_name_and_a_failed_write_is_one_line(tmp_path: Path, quick_trainer) -> None:
    """A run with last.ckpt writes its checkpoints whole (`AtomicCheckpointIO`): a partial file an earlier process
    left is removed by the first save in its folder; a file that cannot be written is one line naming it."""
    from lightning.pytorch.demos import BoringModel

    from lightning_template.engine import ResumeCheckpoint
    from lightning_template.engine.errors import StorageError

    left = tmp_path / ".epoch=0-step=2.ckpt.partial"
    left.write_bytes(b"cut off by a kill")
    trainer = quick_trainer(callbacks=[ResumeCheckpoint(dirpath=tmp_path)], limit_val_batches=0)
    trainer.fit(BoringModel())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    (tmp_path / "file").touch()
    with pytest.raises(
        StorageError, match=r"^could not write the checkpoint \S+/file/x\.ckpt \(\S+/file is a file, not a"
    ):
        trainer.save_checkpoint(tmp_path / "file" / "x.ckpt")
