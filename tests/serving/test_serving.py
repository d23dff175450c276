"""serve.py as a client sees it: a real server on 127.0.0.1, real Fashion-MNIST PNG files and real
texts, answers compared with `train.py predict` on the same inputs."""

from __future__ import annotations

import base64
import csv
import io
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch
from PIL import Image

from lightning_template.data import ImageFolderDataModule
from lightning_template.data.idx import read_idx
from lightning_template.serving.launch import background_server
from lightning_template.serving.preprocess import ImagePreprocessor
from tests.conftest import ROOT, best_checkpoint

pytestmark = pytest.mark.slow
NUM_IMAGES = 16


def serving(*args: str, cwd: Path):
    return background_server(*args, "--batch_timeout", "0.05", cwd=cwd)


def _predicted(csv_path: Path) -> list[tuple[str, list[float]]]:
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [(row["prediction"], [float(v) for k, v in row.items() if k.startswith("p_")]) for row in rows]


def _assert_same(answers: list[dict], expected: list[tuple[str, list[float]]]) -> None:
    assert len(answers) == len(expected)
    for answer, (label, probabilities) in zip(answers, expected, strict=True):
        assert answer["label"] == label
        served = list(answer["probabilities"].values())
        assert max(abs(a - b) for a, b in zip(served, probabilities, strict=True)) < 1e-5


@pytest.fixture(scope="module")
def image_model(main_run: Path, main_predictions, main_export, fashion_mnist_dir: Path) -> dict:
    """The main run's best checkpoint, its ONNX export, the first test images as PNG files and predict's answers."""
    images = read_idx(fashion_mnist_dir / "t10k-images-idx3-ubyte.gz")[:NUM_IMAGES]
    pngs = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image.numpy()).save(buffer, format="PNG")
        pngs.append(buffer.getvalue())
    return {
        "checkpoint": best_checkpoint(main_run, "simple_cnn"), "onnx": main_run / "out/net.onnx", "pngs": pngs,
        "work": main_run, "expected": _predicted(main_run / "predictions.csv")[:NUM_IMAGES],
    }  # fmt: skip


@pytest.fixture(scope="module")
def image_server(image_model: dict) -> Iterator[str]:
    with serving("--ckpt_path", str(image_model["checkpoint"]), cwd=image_model["work"]) as url:
        yield url


def _upload(pngs: list[bytes]) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("file", (f"{i}.png", png, "image/png")) for i, png in enumerate(pngs)]


def _base64(pngs: list[bytes]) -> list[str]:
    return [base64.b64encode(png).decode() for png in pngs]


def test_png_uploads_and_base64_images_get_predict_s_answers(image_model: dict, image_server: str) -> None:
    pngs, expected = image_model["pngs"], image_model["expected"]
    uploaded = requests.post(f"{image_server}/predict", files=_upload(pngs[:10]), timeout=30)
    assert uploaded.status_code == 200, uploaded.text
    as_json = requests.post(f"{image_server}/predict", json={"images": _base64(pngs[10:])}, timeout=30)
    assert as_json.status_code == 200, as_json.text
    _assert_same(uploaded.json()["predictions"] + as_json.json()["predictions"], expected)
    one = requests.post(f"{image_server}/predict", json={"image": _base64(pngs[:1])[0]}, timeout=30).json()
    _assert_same(one["predictions"], expected[:1])
    info = requests.get(f"{image_server}/info", timeout=5).json()
    assert info["model"]["class_names"][9] == "Ankle boot" and info["model"]["backend"] == "torch"


def test_concurrent_requests_are_batched_and_a_bad_one_fails_alone(image_model: dict, image_server: str) -> None:
    pngs, expected = image_model["pngs"], image_model["expected"]
    bad_index = 5

    def post(i: int) -> requests.Response:
        if i == bad_index:
            return requests.post(f"{image_server}/predict", json={"images": ["bm90IGFuIGltYWdl"]}, timeout=30)
        return requests.post(f"{image_server}/predict", files=_upload([pngs[i]]), timeout=30)

    with ThreadPoolExecutor(NUM_IMAGES) as pool:
        responses = list(pool.map(post, range(NUM_IMAGES)))
    assert responses[bad_index].status_code == 400 and "not an image" in responses[bad_index].json()["detail"]
    good = [(r, e) for i, (r, e) in enumerate(zip(responses, expected, strict=True)) if i != bad_index]
    assert all(r.status_code == 200 for r, _ in good), [r.text for r, _ in good if r.status_code != 200]
    for response, answer in good:
        _assert_same(response.json()["predictions"], [answer])
    assert max(r.json()["batch_size"] for r, _ in good) > 1  # several requests went through one forward pass


def test_bad_requests_get_a_4xx_with_a_message_and_the_server_keeps_serving(
    image_model: dict, image_server: str
) -> None:
    rgb = io.BytesIO()
    Image.new("RGB", (28, 28), (200, 30, 30)).save(rgb, format="PNG")  # a color picture
    large, deep = io.BytesIO(), io.BytesIO()
    Image.new("L", (64, 64)).save(large, format="PNG")
    Image.new("I;16", (28, 28)).save(deep, format="PNG")
    url, as_json = f"{image_server}/predict", {"Content-Type": "application/json"}
    cases = {
        "not an image": dict(files=[("file", ("a.png", b"GIF89a...nope", "image/png"))]),
        "not valid base64": dict(json={"images": ["%%%"]}),
        "3 channel": dict(files=_upload([rgb.getvalue()])),
        "64x64 pixels": dict(files=_upload([large.getvalue()])),
        "send an 8-bit image": dict(files=_upload([deep.getvalue()])),
        "both 'images' and 'image'": dict(json={"images": [], "image": "x"}),
        "unknown field": dict(json={"images": _base64(image_model["pngs"][:1]), "threshold": 0.5}),
        "no inputs": dict(json={"images": []}),
        "not valid JSON": dict(data=b"{images:", headers=as_json),
        "Content-Type text/plain": dict(data=b"hello", headers={"Content-Type": "text/plain"}),
        "at most 64": dict(json={"images": _base64(image_model["pngs"][:1]) * 65}),
        "Payload too large": dict(data=b"[" + b" " * (11 * 1024 * 1024) + b"]", headers=as_json),
    }  # fmt: skip
    for message, request in cases.items():
        response = requests.post(url, timeout=30, **request)
        assert 400 <= response.status_code < 500, f"{message}: {response.status_code} {response.text[:300]}"
        assert message in response.json()["detail"], f"{message}: {response.text[:300]}"
    # The same picture as a palette GIF and as gray RGB is read as the grayscale PNG was.
    picture = Image.open(io.BytesIO(image_model["pngs"][0]))
    gif, gray_rgb = io.BytesIO(), io.BytesIO()
    picture.save(gif, format="GIF")
    picture.convert("RGB").save(gray_rgb, format="PNG")
    after = requests.post(url, files=_upload([image_model["pngs"][0], gif.getvalue(), gray_rgb.getvalue()]), timeout=30)
    assert after.status_code == 200, after.text
    _assert_same(after.json()["predictions"], image_model["expected"][:1] * 3)


def test_the_onnx_export_serves_the_same_answers(image_model: dict) -> None:
    with serving("--onnx_path", str(image_model["onnx"]), cwd=image_model["work"]) as url:
        response = requests.post(f"{url}/predict", files=_upload(image_model["pngs"]), timeout=30)
        assert response.status_code == 200, response.text
        _assert_same(response.json()["predictions"], image_model["expected"])
        assert requests.get(f"{url}/info", timeout=5).json()["model"]["backend"] == "onnxruntime"


def test_the_onnx_request_path_never_imports_torch(image_model: dict) -> None:
    """The API's own hooks run in a process that has not imported torch, and still has not afterwards."""
    script = f"""
import sys
from lightning_template.serving.api import ClassifierAPI
api = ClassifierAPI({str(image_model["onnx"])!r}, max_batch_size=4)
api.setup("cpu")
decoded = [api.decode_request({{"image": {_base64(image_model["pngs"][:1])[0]!r}}})]
print(api.encode_response(api.predict(decoded)[0])["predictions"][0]["label"])
print("torch imported:", "torch" in sys.modules)
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[:2] == [image_model["expected"][0][0], "torch imported: False"]


@pytest.mark.parametrize("size", [(28, 28), (40, 30), (200, 64)])
def test_image_folder_preprocessing_is_the_evaluation_transform(size: tuple[int, int], tmp_path: Path) -> None:
    """serve.py's numpy/PIL resize, crop and normalization equal torchvision's eval transform of the datamodule."""
    (tmp_path / "train/a").mkdir(parents=True)
    datamodule = ImageFolderDataModule(root=str(tmp_path), image_size=24)
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (*size[::-1], 3), generator=generator, dtype=torch.uint8).numpy()
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    served = ImagePreprocessor(datamodule.serving_spec()).decode(buffer.getvalue(), 0)
    expected = datamodule.eval_transform(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))
    assert served.shape == tuple(expected.shape) == (3, 24, 24)
    assert (torch.from_numpy(served) - expected).abs().max().item() < 1e-5
