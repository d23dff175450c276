"""Fixtures every test module shares: real data, a quick Trainer, and the CLI run as a user runs it."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from lightning import Trainer

# torch, Lightning and the tasks are imported where they are used, not here: under `pytest -n auto` the process that
# hands tests out to the worker processes imports this file too, and would import them before any worker starts.

ROOT = Path(__file__).resolve().parents[1]
# Small real subsets of the data sets, for a machine that has neither Debian's copy nor one of its own: the first 600
# training and 300 test images of Fashion-MNIST, and the first fortunes of three topics.
SAMPLES = ROOT / "tests" / "data"
TOPICS = ("computers", "food", "startrek")
# A few real batches per stage, for CLI runs (`--trainer.max_epochs` is each test's own).
QUICK = [
    "--trainer.limit_train_batches=10", "--trainer.limit_val_batches=4", "--trainer.limit_test_batches=4",
    "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=5",
]  # fmt: skip


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 0)):  # `make test`: pytest -n auto
    # The cores shared among the test processes (and the runs they start): torch's threads in each process
    # would otherwise take every core, and the processes slow each other down many times over.
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // workers)  # the cores this process may use (a container's or taskset's), as -n auto counts
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)


@pytest.fixture(autouse=True)
def stop_signals_left_as_found() -> Iterator[None]:
    """Every test leaves the SIGTERM and SIGINT handlers as it found them. A handler left behind (a trainer
    whose teardown was skipped, a library's) catches a signal meant for the test process and turns it into a
    stop of whatever test runs next, or an exit with status 0; the test that left it fails here instead."""
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    yield
    left = {
        signal.Signals(s).name: signal.getsignal(s) for s, handler in before.items() if signal.getsignal(s) != handler
    }
    for signum, handler in before.items():
        signal.signal(signum, handler)  # one leak fails one test, not every test after it
    if left:
        pytest.fail(f"the test left signal handlers installed: {left}")


# The fortunes where the jobs read them (the folder FORTUNES_DIR names, Debian's copy), else the sample: set before
# any test imports the tasks, and inherited by every process a test starts.
if not (Path(os.environ.get("FORTUNES_DIR") or "/usr/share/games/fortunes") / "computers").is_file():
    os.environ["FORTUNES_DIR"] = str(SAMPLES / "fortunes")


def fashion_mnist_from_sample(parent: Path) -> Path:
    """Fashion-MNIST's four files at their full sizes (60,000 and 10,000 images), built once from the sample's real
    images repeated in order: every job and its defaults (`val_size` 5,000) run as on the whole set. Built in
    `parent`, which the test processes share, under a name that changes with the sample."""
    import gzip
    import hashlib
    import tempfile

    source = SAMPLES / "fashion-mnist"
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in sorted(source.glob("*.gz")))).hexdigest()[:12]
    folder = parent / f"fashion-mnist-sample-{digest}"
    if folder.is_dir():
        return folder
    building = Path(tempfile.mkdtemp(dir=parent))
    for split, count in (("train", 60_000), ("t10k", 10_000)):
        for kind, header in (("images-idx3", 16), ("labels-idx1", 8)):
            data = gzip.decompress((source / f"{split}-{kind}-ubyte.gz").read_bytes())
            size = (len(data) - header) // int.from_bytes(data[4:8], "big")
            body = (data[header:] * (count // int.from_bytes(data[4:8], "big") + 1))[: count * size]
            head = data[:4] + count.to_bytes(4, "big") + data[8:header]
            (building / f"{split}-{kind}-ubyte.gz").write_bytes(gzip.compress(head + body, compresslevel=1))
    try:
        building.rename(folder)
    except OSError:  # another test process built it first
        shutil.rmtree(building)
    return folder


@pytest.fixture(scope="session", autouse=True)
def fashion_mnist_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fashion-MNIST where `make train` finds it (data/FashionMNIST/raw/, the folder FASHION_MNIST_DIR names,
    Debian's copy), else built from the sample; named in FASHION_MNIST_DIR for every process a test starts."""
    from lightning_template.tasks.classification import FashionMNISTDataModule

    found = FashionMNISTDataModule(data_dir=str(ROOT / "data")).find_files()
    folder = found or fashion_mnist_from_sample(tmp_path_factory.getbasetemp().parent)
    os.environ["FASHION_MNIST_DIR"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def whole_fashion_mnist(fashion_mnist_dir: Path) -> Path:
    """Fashion-MNIST itself, for a test of what only the whole set has: skipped where only the sample is."""
    if fashion_mnist_dir.name.startswith("fashion-mnist-sample-"):
        pytest.skip("needs the whole Fashion-MNIST: data/FashionMNIST/raw/ or `apt-get install dataset-fashion-mnist`")
    return fashion_mnist_dir


@pytest.fixture(scope="session")
def fortunes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real sentences by topic (Debian's `fortunes`, or the sample), as train/val/test JSONL files."""
    from lightning_template.tasks.classification.data.fortunes import build as build_fortunes

    out = tmp_path_factory.mktemp("fortunes")
    build_fortunes(out, topics=TOPICS)
    return out


@pytest.fixture(scope="session")
def image_tree(tmp_path_factory: pytest.TempPathFactory, fashion_mnist_dir: Path) -> Path:
    """train/, val/ and test/ class folders of real Fashion-MNIST images as PNG files (48 + 24 + 12 per class,
    3 classes)."""
    from PIL import Image

    from lightning_template.tasks.classification.data.idx import read_idx

    root = tmp_path_factory.mktemp("images")
    images = read_idx(fashion_mnist_dir / "t10k-images-idx3-ubyte.gz")[:2000]
    labels = read_idx(fashion_mnist_dir / "t10k-labels-idx1-ubyte.gz")[:2000]
    for label, name in {0: "tshirt", 1: "trouser", 7: "sneaker"}.items():
        picks = (labels == label).nonzero().flatten()[:84].tolist()
        for split, chosen in (("train", picks[:48]), ("val", picks[48:72]), ("test", picks[72:])):
            (root / split / name).mkdir(parents=True)
            for index in chosen:
                Image.fromarray(images[index].numpy()).save(root / split / name / f"{index}.png")
    return root


@pytest.fixture
def quick_trainer() -> Callable[..., Trainer]:
    """A Trainer for a few real batches: no logger, no progress bar, deterministic; override anything."""
    from lightning import Trainer

    def make(**overrides) -> Trainer:
        settings = dict(
            max_epochs=1, limit_train_batches=4, limit_val_batches=2, limit_test_batches=2, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, deterministic=True,
            num_sanity_val_steps=0,
        )  # fmt: skip
        settings["enable_checkpointing"] = any(
            type(c).__name__.endswith("Checkpoint") for c in overrides.get("callbacks", [])
        )
        return Trainer(**{**settings, **overrides})

    return make


def save_random_weights(model_class: type, path: Path, **kwargs) -> Path:
    """A weights file, the network's state dict as `torch.save(net.state_dict())` writes it, for fine-tuning tests."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(123)
        torch.save(model_class(**kwargs).net.state_dict(), path)
    return path


def warning_filters_added_by_importing(module: str) -> list:
    """The warning filters that importing `module` adds, in a fresh process where nothing imported it before (after
    the engine, which a run imports first): an import must change nothing that outlives a run."""
    code = (
        "import importlib, json, warnings, lightning_template.engine.cli\n"
        "before = list(warnings.filters)\n"
        f"importlib.import_module({module!r})\n"
        "print(json.dumps([[f[0], getattr(f[1], 'pattern', f[1])] for f in warnings.filters if f not in before]))\n"
    )
    added = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert added.returncode == 0, added.stderr
    return json.loads(added.stdout)


def run_cli(*args: str, cwd: Path, timeout: float = 300, script: str = "train.py") -> subprocess.CompletedProcess:
    """Run `train.py` in a fresh process, as a user would, and fail with its output if it fails."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        pytest.fail(
            f"{script} {' '.join(args)} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
        )
    return result


def train_process(
    args: list[str], cwd: Path, expect: int = 0, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`train.py <args>` in a fresh process in `cwd`, which must exit with `expect` (143: stopped by SIGTERM)."""
    cwd.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    done = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=environment, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert done.returncode == expect, (
        f"exit {done.returncode}, expected {expect}\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
    )
    return done


def sigterm_at(epoch: int, batch: int, rank: int | None = None) -> list[str]:
    """Flags that send this run a real SIGTERM after batch `batch` of epoch `epoch` (under DDP to rank `rank`)."""
    flags = [
        "--trainer.callbacks+=tests.helpers.SignalAtBatch", f"--trainer.callbacks.epoch={epoch}",
        f"--trainer.callbacks.batch={batch}", f"--trainer.callbacks.signum={int(signal.SIGTERM)}",
    ]  # fmt: skip
    return flags + ([f"--trainer.callbacks.rank={rank}"] if rank is not None else [])


@pytest.fixture(scope="session")
def offline_inputs(tmp_path_factory: pytest.TempPathFactory, fashion_mnist_dir: Path) -> dict[str, Path]:
    """Stand-ins for what a job downloads (ImageNet weights, MNIST, CIFAR-10), made from real Fashion-MNIST."""
    import numpy as np

    from lightning_template.tasks.classification import ResNetClassifier
    from lightning_template.tasks.classification.data.idx import read_idx

    root = tmp_path_factory.mktemp("offline")
    mnist = root / "data" / "MNIST" / "raw"  # MNIST's IDX layout, with Fashion-MNIST's files in it
    mnist.mkdir(parents=True)
    for source in fashion_mnist_dir.glob("*-ubyte.gz"):
        (mnist / source.name).symlink_to(source)
    cifar = root / "data" / "cifar-10-batches-py"  # the official pickles: 32x32 RGB, 10 classes
    cifar.mkdir(parents=True)
    images = read_idx(fashion_mnist_dir / "t10k-images-idx3-ubyte.gz")[:1200].numpy()
    labels = read_idx(fashion_mnist_dir / "t10k-labels-idx1-ubyte.gz")[:1200].tolist()
    rgb = np.repeat(np.pad(images, ((0, 0), (2, 2), (2, 2)))[:, None], 3, axis=1).reshape(len(images), -1)
    for i, name in enumerate([*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]):
        with open(cifar / name, "wb") as f:
            pickle.dump({"data": rgb[i * 200 : (i + 1) * 200], "labels": labels[i * 200 : (i + 1) * 200]}, f)
    weights = save_random_weights(ResNetClassifier, root / "resnet18.pth")
    return {"root": root, "resnet_weights": weights}


def offline_flags(config: str, inputs: dict[str, Path], request: pytest.FixtureRequest) -> list[str]:
    """What a job config needs on this offline machine: local weights, MNIST and CIFAR-10 stand-ins, an image
    tree, the fortune JSONL files."""
    text = (ROOT / config).read_text()
    flags = []
    if "weights: DEFAULT" in text:
        flags.append(f"--model.init_args.weights={inputs['resnet_weights']}")
    if "ImageFolderDataModule" in text:
        flags += [f"--data.init_args.root={request.getfixturevalue('image_tree')}", "--data.init_args.image_size=64"]
    if "TextClassificationDataModule" in text:
        texts = request.getfixturevalue("fortunes_dir")
        flags += [f"--data.init_args.{s}_file={texts / f'{s}.jsonl'}" for s in ("train", "val", "test")]
    if ("MNISTDataModule" in text and "Fashion" not in text) or "CIFAR10DataModule" in text:
        flags.append(f"--data.init_args.data_dir={inputs['root'] / 'data'}")
    if "CIFAR10DataModule" in text:  # 1,000 training images here
        flags.append("--data.init_args.val_size=100")
    # extra:timm
    if "weights: timm" in text:  # the backbone's files as timm saves them, in place of its download
        import yaml

        from tests.timm_models.weights_files import saved_by_timm

        backbone = yaml.safe_load(text)["model"]["init_args"]["backbone"]
        flags.append(f"--model.init_args.weights={saved_by_timm(backbone, inputs['root'])}")
    # /extra:timm
    # extra:hf
    if "MaskedTextDataModule" in text:
        texts = request.getfixturevalue("fortunes_dir")
        flags += [f"--data.init_args.{s}_file={texts / f'{s}.jsonl'}" for s in ("train", "val")]
    if "HFTextDataModule" in text:  # a tiny encoder saved here, in place of the one `make hf-pretrain` writes
        from tests.hf_models.encoders import saved_encoder

        texts, encoder = request.getfixturevalue("fortunes_dir"), saved_encoder("bert", inputs["root"])
        flags += [f"--data.init_args.{s}_file={texts / f'{s}.jsonl'}" for s in ("train", "val", "test")]
        flags += [f"--model.init_args.backbone={encoder}", f"--data.init_args.tokenizer={encoder}"]
    # /extra:hf
    return flags


def last_checkpoint(workdir: Path) -> dict:
    """The last.ckpt of the one run in `workdir`'s logs."""
    import torch

    (path,) = workdir.glob("logs/*/version_*/checkpoints/last.ckpt")
    return torch.load(path, weights_only=True)


ONE_EPOCH = [*QUICK, "--trainer.max_epochs=1", "--test_after_fit=false"]


def best_checkpoint(workdir: Path, name: str) -> Path:
    return next((workdir / "logs" / name / "version_0" / "checkpoints").glob("epoch=*.ckpt"))


@pytest.fixture(scope="session")
def main_run(tmp_path_factory: pytest.TempPathFactory, fashion_mnist_dir) -> Path:
    """A short run of the main config with augmentation, logging every step (shared by several tests)."""
    workdir = tmp_path_factory.mktemp("main")
    args = ["--config", str(ROOT / "configs/simple_cnn.yaml"), "--data.augment=true", "--trainer.log_every_n_steps=1"]
    run_cli("fit", *args, *ONE_EPOCH, cwd=workdir)
    return workdir


@pytest.fixture(scope="session")
def main_predictions(main_run: Path) -> subprocess.CompletedProcess:
    """`train.py predict` of the main run's best checkpoint on the first 256 test images -> predictions.csv."""
    return run_cli(
        "predict", "--config", str(ROOT / "configs/simple_cnn.yaml"), "--trainer.limit_predict_batches=2",
        f"--ckpt_path={best_checkpoint(main_run, 'simple_cnn')}", "--trainer.enable_progress_bar=false", cwd=main_run,
    )  # fmt: skip
