"""Streaming datasets: convert.py's round trip, training through the CLI, and damaged or unreachable data.

Exact resume of streamed runs is in the resume matrix (tests/matrix.py, data `stream-w2`);
multi-process sharding in tests/streaming/test_multinode.py.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import lightning_template.streaming
from lightning_template.engine.cli import ProjectCLI
from lightning_template.streaming import StreamingImageDataModule, StreamingTextDataModule
from lightning_template.streaming.datamodules import StreamingDataError, decode_image
from lightning_template.tasks.classification import (
    FashionMNISTDataModule,
    ImageFolderDataModule,
    TextClassificationDataModule,
)

from convert import convert
from tests.conftest import ONE_EPOCH, QUICK, ROOT, run_cli, warning_filters_added_by_importing
from tests.test_datamodules import assert_contract

SUBSET = {"classes": [0, 1, 7], "train_samples_per_class": 40, "val_size": 300}


def stored(datamodule, split: str) -> list[tuple[object, int]]:
    """Every sample of a converted split, read by index in order."""
    dataset = datamodule.loader(split, shuffle=False).dataset
    return [dataset[i] for i in range(len(dataset))]


@pytest.fixture(scope="module")
def fashion_stream(tmp_path_factory: pytest.TempPathFactory, fashion_mnist_dir) -> Path:
    output = tmp_path_factory.mktemp("stream") / "fashion"
    convert(FashionMNISTDataModule(**SUBSET), str(output), images="raw", num_workers=2, chunk_bytes="64KB")
    return output


@pytest.mark.slow
@pytest.mark.parametrize("images", ["raw", "encoded"])
def test_in_memory_images_round_trip(tmp_path: Path, fashion_mnist_dir, images: str) -> None:
    source = FashionMNISTDataModule(**SUBSET)
    convert(source, str(tmp_path / "out"), images=images, num_workers=2, chunk_bytes="16KB")  # several chunks
    streamed = StreamingImageDataModule(input_dir=str(tmp_path / "out"))
    assert streamed.class_names == list(source.class_names) and streamed.input_shape == (1, 28, 28)
    assert (streamed.mean, streamed.std) == (source.mean, source.std)
    for split in ("train", "val", "test"):
        samples = stored(streamed, split)
        assert torch.equal(torch.stack([image for image, _ in samples]), source.splits[split].images)
        assert [label for _, label in samples] == source.splits[split].labels.tolist()


@pytest.mark.parametrize("images", ["raw", "encoded"])
def test_image_files_round_trip(tmp_path: Path, image_tree: Path, images: str) -> None:
    source = ImageFolderDataModule(root=str(image_tree), image_size=28, num_workers=0)
    convert(source, str(tmp_path / "out"), images=images, size=32, num_workers=2)
    streamed = StreamingImageDataModule(input_dir=str(tmp_path / "out"))
    assert streamed.input_shape == (3, 28, 28) and streamed.crop_size == 28
    assert streamed.serving_spec() == source.serving_spec()
    for split in ("train", "val"):
        samples = stored(streamed, split)
        files = source.splits[split].samples
        assert [label for _, label in samples] == [label for _, label in files]
        for (image, _), (path, _) in zip(samples, files, strict=True):
            assert torch.equal(image, torch.from_numpy(decode_image(Path(path).read_bytes(), "RGB", 32)))


def test_an_empty_split_is_skipped_and_named_and_all_empty_is_refused(tmp_path: Path, image_tree: Path, capsys) -> None:
    shutil.copytree(image_tree / "train", tmp_path / "images" / "train")
    for folder in (tmp_path / "images" / "train").iterdir():
        (tmp_path / "images" / "val" / folder.name).mkdir(parents=True)  # class folders, no images
    source = ImageFolderDataModule(root=str(tmp_path / "images"), image_size=28, num_workers=0)
    assert convert(source, str(tmp_path / "out"), size=28, num_workers=1)["splits"] == {"train": 144}
    assert "val: no samples in the source; skipped" in capsys.readouterr().out
    with pytest.raises(StreamingDataError, match=r"has no val split"):
        StreamingImageDataModule(input_dir=str(tmp_path / "out")).loader("val", shuffle=False)
    shutil.rmtree(tmp_path / "images" / "train")
    shutil.copytree(tmp_path / "images" / "val", tmp_path / "images" / "train")
    source = ImageFolderDataModule(root=str(tmp_path / "images"), image_size=28, num_workers=0)
    with pytest.raises(ValueError, match=r"ImageFolderDataModule: every split is empty; nothing to convert"):
        convert(source, str(tmp_path / "out"), num_workers=1)
    assert (tmp_path / "out" / "dataset.json").is_file()  # the previous conversion is left as it was


def test_text_round_trip(tmp_path: Path, fortunes_dir: Path) -> None:
    files = {f"{split}_file": str(fortunes_dir / f"{split}.jsonl") for split in ("train", "val", "test")}
    source = TextClassificationDataModule(**files, max_length=40)
    convert(source, str(tmp_path / "out"), num_workers=2)
    streamed = StreamingTextDataModule(input_dir=str(tmp_path / "out"))
    assert (streamed.vocab_size, streamed.pad_id, streamed.max_length) == (source.vocab_size, 0, 40)
    for split in ("train", "val", "test"):
        samples = stored(streamed, split)
        assert [ids for ids, _ in samples] == source.splits[split].ids
        assert [label for _, label in samples] == source.splits[split].labels


@pytest.mark.slow
def test_fit_and_predict_from_chunks_through_the_cli(tmp_path: Path, fashion_stream: Path) -> None:
    data = ["--data", "lightning_template.streaming.StreamingImageDataModule"]
    data += [f"--data.input_dir={fashion_stream}"]
    job = str(ROOT / "configs/simple_cnn_classic.yaml")
    args = ["--config", job, *data, "--data.augment=true", "--data.batch_size=32"]
    fit = run_cli("fit", *args, *QUICK, "--trainer.max_epochs=2", cwd=tmp_path)
    assert "test accuracy:" in fit.stdout
    accuracy = float(fit.stdout.rpartition("test accuracy:")[2].split()[0])
    assert accuracy > 0.8  # 3 easy classes (T-shirt, trouser, sneaker), 20 steps
    checkpoint = tmp_path / "logs/simple_cnn_classic/version_0/checkpoints/last.ckpt"
    run_cli("predict", *args, f"--ckpt_path={checkpoint}", "--trainer.enable_progress_bar=false", cwd=tmp_path)
    with open(tmp_path / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    test_samples = StreamingImageDataModule(input_dir=str(fashion_stream)).metadata["splits"]["test"]
    assert [row["input"] for row in rows] == [f"test[{i}]" for i in range(test_samples)]


@pytest.mark.slow
def test_a_streamed_run_says_nothing_of_its_length_and_leaves_the_warning_filters(
    tmp_path: Path, fashion_stream: Path, monkeypatch
) -> None:
    """LitData's IterableDataset has a true length: Lightning's warning that it has one is not shown in its run,
    and silenced for that run alone."""
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(ROOT / "configs/simple_cnn_classic.yaml"), *ONE_EPOCH]
    args += ["--data=lightning_template.streaming.StreamingImageDataModule", f"--data.input_dir={fashion_stream}"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        ProjectCLI(args=[*args, "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"])
        assert warnings.filters == before
    assert not [w for w in caught if "`IterableDataset` has `__len__`" in str(w.message)]


@pytest.mark.slow
def test_an_interrupted_conversion_is_refused_and_a_rerun_completes_it(tmp_path: Path, fashion_mnist_dir) -> None:
    output = tmp_path / "out"
    command = [sys.executable, str(ROOT / "convert.py"), "--job", str(ROOT / "configs/simple_cnn.yaml"),
               "--output", str(output), "--chunk_bytes", "1MB"]  # fmt: skip
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (output / "train" / "index.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.kill()  # the train split is written, val and test are not
    process.wait()
    assert not (output / "dataset.json").exists()
    with pytest.raises(StreamingDataError, match=r"the conversion did not finish .* run convert.py again"):
        StreamingImageDataModule(input_dir=str(output))
    subprocess.run(command, cwd=tmp_path, check=True, capture_output=True, timeout=300)
    assert StreamingImageDataModule(input_dir=str(output)).metadata["splits"] == {"train": 55000, "val": 5000,
                                                                                    "test": 10000}  # fmt: skip


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_truncated_chunk_is_named(tmp_path: Path, fashion_stream: Path, damage: str) -> None:
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(fashion_stream), str(copy)], check=True)
    chunk = sorted((copy / "train").glob("chunk-*.bin"))[-1]
    if damage == "missing":
        chunk.unlink()
    else:
        chunk.write_bytes(chunk.read_bytes()[:100])
    expected = "chunk missing" if damage == "missing" else "chunk 100 bytes instead of"
    with pytest.raises(StreamingDataError, match=f"{chunk}: {expected}.*Run convert.py again"):
        StreamingImageDataModule(input_dir=str(copy))


def test_an_unreachable_url_fails_fast_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    # An S3 endpoint nobody listens on (the machine has no network in tests).
    for name, value in {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "test",
                        "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    start = time.monotonic()
    with pytest.raises(StreamingDataError, match=r"s3://no-bucket/data/dataset.json: cannot be read .* credentials"):
        StreamingImageDataModule(input_dir="s3://no-bucket/data")
    assert time.monotonic() - start < 30


def test_the_wrong_kind_and_a_folder_without_data_are_explained(tmp_path: Path, fashion_stream: Path) -> None:
    with pytest.raises(StreamingDataError, match="holds image data; use --data StreamingImageDataModule"):
        StreamingTextDataModule(input_dir=str(fashion_stream))
    with pytest.raises(StreamingDataError, match=r"no converted dataset here.*convert.py --job"):
        StreamingImageDataModule(input_dir=str(tmp_path))


def test_encoded_images_of_any_size_decode_to_the_stored_square() -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (600, 900, 3), dtype=np.uint8)).save(buffer, "JPEG")
    image = decode_image(buffer.getvalue(), "RGB", 64)
    assert image.shape == (3, 64, 64) and image.dtype == np.uint8


@pytest.mark.slow
def test_every_streaming_datamodule_meets_the_contract(image_tree: Path, fortunes_dir: Path, tmp_path: Path) -> None:
    text = TextClassificationDataModule(train_file=str(fortunes_dir / "train.jsonl"))
    convert(text, str(tmp_path / "text"), num_workers=1)
    convert(ImageFolderDataModule(root=str(image_tree), num_workers=0), str(tmp_path / "images"), num_workers=1)
    built = {
        "StreamingImageDataModule": StreamingImageDataModule(input_dir=str(tmp_path / "images")),
        "StreamingTextDataModule": StreamingTextDataModule(input_dir=str(tmp_path / "text")),
    }
    assert set(lightning_template.streaming.__all__) == set(built)
    assert_contract(built)


@pytest.mark.slow  # a fresh process: the module is imported in it for the first time
def test_importing_the_streaming_datamodules_adds_no_warning_filter() -> None:
    """Lightning's length warning is silenced for the streamed runs alone (the test above), not by the import."""
    assert warning_filters_added_by_importing("lightning_template.streaming.datamodules") == []
