"""serve.py as a client sees it: a real server on 127.0.0.1, real Fashion-MNIST PNG files and real
texts, answers compared with `train.py predict` on the same inputs."""

from __future__ import annotations

import base64
import csv
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from lightning_template.serving.backends import load_backend
from lightning_template.serving.launch import server_process
from lightning_template.serving.preprocess import BadInput, ImagePreprocessor
from lightning_template.tasks.classification import ImageFolderDataModule
from lightning_template.tasks.classification.data.idx import read_idx

from tests.conftest import ROOT, best_checkpoint

NUM_IMAGES = 16


def serving(*args: str, cwd: Path, prefix: tuple[str, ...] = ()):
    return server_process(*args, "--batch_timeout", "0.05", cwd=cwd, prefix=prefix)


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
    with serving("--ckpt_path", str(image_model["checkpoint"]), cwd=image_model["work"]) as (url, _):
        yield url


@pytest.fixture(scope="module")
def onnx_server(image_model: dict) -> Iterator[tuple[str, subprocess.Popen]]:
    """The ONNX export served with serve.py's default flags, and its process."""
    with serving("--onnx_path", str(image_model["onnx"]), cwd=image_model["work"]) as server:
        yield server


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs (LitServe's API server, workers, manager), from /proc."""
    children = [
        int(child)
        for task in Path(f"/proc/{pid}/task").glob("*")
        for child in (task / "children").read_text().split()
        if (task / "children").is_file()
    ]
    return children + [grandchild for child in children for grandchild in descendants(child)]


def resident_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) / 1024


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited child its parent has not waited for yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _upload(pngs: list[bytes]) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("file", (f"{i}.png", png, "image/png")) for i, png in enumerate(pngs)]


def _base64(pngs: list[bytes]) -> list[str]:
    return [base64.b64encode(png).decode() for png in pngs]


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
        "Missing boundary": dict(data=b"abc", headers={"Content-Type": "multipart/form-data"}),
        "Invalid multipart data": dict(data=b"abc", headers={"Content-Type": "multipart/form-data; boundary=x"}),
        "nested more than 32": dict(data=b"[" * 100_000 + b"]" * 100_000, headers=as_json),  # past json's limit
        "more than 32 levels": dict(data=b'{"images": ' + b"[" * 500 + b"]" * 500 + b"}", headers=as_json),
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


@pytest.mark.slow
def test_the_onnx_export_serves_the_same_answers_and_no_process_loads_torch(image_model: dict, onnx_server) -> None:
    url, process = onnx_server
    response = requests.post(f"{url}/predict", files=_upload(image_model["pngs"]), timeout=30)
    assert response.status_code == 200, response.text
    _assert_same(response.json()["predictions"], image_model["expected"])
    assert requests.get(f"{url}/info", timeout=5).json()["model"]["backend"] == "onnxruntime"
    # Every process of the server (main, API server, worker, manager), with default flags: torch's library
    # is mapped into none of them; their resident memory is in the message.
    processes = [process.pid, *descendants(process.pid)]
    memory = {pid: f"{resident_mb(pid):.0f} MB" for pid in processes}
    with_torch = [pid for pid in processes if "libtorch" in Path(f"/proc/{pid}/maps").read_text()]
    assert len(processes) >= 4 and not with_torch, f"torch loaded in {with_torch}; resident memory: {memory}"


@pytest.mark.slow
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
    """serve.py's numpy/PIL resize, crop and normalization equal the datamodule's evaluation path."""
    (tmp_path / "train/a").mkdir(parents=True)
    datamodule = ImageFolderDataModule(root=str(tmp_path), image_size=24)
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (*size[::-1], 3), generator=generator, dtype=torch.uint8).numpy()
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    served = ImagePreprocessor(datamodule.serving_spec()).decode(buffer.getvalue(), 0)
    pixels_in = datamodule.eval_transform(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))
    expected = datamodule.normalize(pixels_in[None])[0]  # the workers' uint8 crop, normalized on the device
    assert served.shape == tuple(expected.shape) == (3, 24, 24)
    assert (torch.from_numpy(served) - expected).abs().max().item() < 1e-5


@pytest.mark.parametrize("size", [(1, 3000), (3000, 1), (1, 20000)])
def test_a_thin_image_is_refused_from_its_header_before_any_resize(size: tuple[int, int], tmp_path: Path) -> None:
    """Resizing the short side to 256 would make a 1x3000 PNG of 99 bytes 256x768,000 pixels (800 MB)."""
    (tmp_path / "train/a").mkdir(parents=True)
    preprocess = ImagePreprocessor(ImageFolderDataModule(root=str(tmp_path), image_size=224).serving_spec())
    thin, elongated = io.BytesIO(), io.BytesIO()
    Image.new("RGB", size).save(thin, format="PNG")
    with pytest.raises(BadInput, match=r"would be resized to \d+x\d+, more than 4,000,000 pixels") as refused:
        preprocess.decode(thin.getvalue(), 0)
    assert refused.value.status == 413
    Image.new("RGB", (60, 3000)).save(elongated, format="PNG")  # 50:1 stays within the cap
    assert preprocess.decode(elongated.getvalue(), 0).shape == (3, 224, 224)


@pytest.mark.slow
def test_a_checkpoint_cannot_make_the_server_import_a_module(image_model: dict, tmp_path: Path, monkeypatch) -> None:
    """The model class is checked against the project's tasks; the optimizer's class path is never imported."""
    (tmp_path / "planted.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\nclass Optimizer: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "planted", raising=False)
    checkpoint = torch.load(image_model["checkpoint"], map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"]["optimizer"] = {"class_path": "planted.Optimizer", "init_args": {}}
    torch.save(checkpoint, tmp_path / "planted.ckpt")
    backend = load_backend(tmp_path / "planted.ckpt")
    assert not (tmp_path / "imported").exists() and "planted" not in sys.modules
    first = ImagePreprocessor(backend.spec).decode(image_model["pngs"][0], 0)  # and serves predict's answer
    assert np.abs(backend(first[None])[0] - image_model["expected"][0][1]).max() < 1e-5


def _pid_1_prefix() -> tuple[str, ...]:
    """serve.py as PID 1 of its own PID namespace, as in a container (skips where user namespaces are off)."""
    prefix = ("unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc")
    if not shutil.which("unshare") or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare cannot make a PID namespace here (user namespaces disabled)")
    return prefix


@pytest.mark.slow
@pytest.mark.parametrize("signum, as_pid_1", [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGTERM, True)],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-to-PID-1"])  # fmt: skip
def test_a_signal_to_serve_py_alone_stops_every_process(signum: int, as_pid_1: bool, image_model: dict) -> None:
    """`kill`, `docker stop` and Kubernetes signal serve.py only (not its process group as Ctrl-C does)."""
    prefix = _pid_1_prefix() if as_pid_1 else ()
    with serving("--onnx_path", str(image_model["onnx"]), cwd=image_model["work"], prefix=prefix) as (url, process):
        serve_py = descendants(process.pid)[0] if as_pid_1 else process.pid  # unshare's child is PID 1 inside
        processes = [serve_py, *descendants(serve_py)]
        assert len(processes) >= 4  # API server, inference worker, LitServe's manager, ...
        os.kill(serve_py, signum)
        deadline = time.monotonic() + 120  # LitServe gives its API server 30 s to finish what it serves
        while any(map(running, processes)) and time.monotonic() < deadline:
            time.sleep(0.5)
        log = (image_model["work"] / f"serve-{url.rpartition(':')[2]}.log").read_text()
        assert not [pid for pid in processes if running(pid)], (
            f"processes left running after the signal:\n{log[-3000:]}"
        )
        assert process.wait(timeout=10) == 0
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{url}/health", timeout=5)
        assert "Traceback" not in log, log[-3000:]


def _fuzz(url: str, examples: int) -> Counter:
    """Requests generated from the server's OpenAPI schema (valid and invalid ones), statuses counted by kind."""
    # Imported here: at collection, every test process would import them for the one slow test that uses them.
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", timeout=30)
    statuses: Counter = Counter()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.one_of(*(schema.as_strategy(mode) for mode in schemathesis.GenerationMode)))
    def request(case) -> None:
        response = case.call(base_url=url, timeout=30)
        statuses[case.method, case.path, case.media_type, response.status_code // 100] += 1
        assert response.status_code < 500, f"{case.as_curl_command()}\n-> {response.status_code} {response.text[:500]}"

    request()
    return statuses


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", pytest.param("onnx", marks=pytest.mark.matrix)])
def test_requests_generated_from_the_openapi_schema_get_no_server_error(backend: str, request) -> None:
    """schemathesis: 150 requests per backend, valid and invalid bodies of both media types: no 5xx."""
    url = request.getfixturevalue("image_server") if backend == "torch" else request.getfixturevalue("onnx_server")[0]
    statuses = _fuzz(url, examples=150)
    assert sum(statuses.values()) >= 130, statuses
    for media_type in ("application/json", "multipart/form-data"):  # /predict's body is in the schema
        assert sum(n for (_, path, kind, _), n in statuses.items() if path == "/predict" and kind == media_type) >= 20
    assert requests.get(f"{url}/health", timeout=5).text == "ok"
