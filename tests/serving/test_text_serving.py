"""A text classifier end to end: fit, predict, export, and serve.py answering raw texts."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import requests

from lightning_template.serving.launch import background_server

from tests.conftest import ROOT, run_cli


def _assert_predict_s(answer: requests.Response, rows: list[dict[str, str]]) -> None:
    """serve.py's answer to the texts of predict's CSV rows: its labels, its probabilities to 1e-5."""
    assert answer.status_code == 200, answer.text
    for served, row in zip(answer.json()["predictions"], rows, strict=True):
        assert served["label"] == row["prediction"]
        assert all(abs(served["probabilities"][c] - float(row[f"p_{c}"])) < 1e-5 for c in served["probabilities"])


# extra:hf


def _fortunes(path: Path) -> list[str]:
    import json

    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_the_server_tokenizes_as_training_did(family: str, tmp_path: Path, fortunes_dir: Path) -> None:
    """A Hugging Face encoder's texts on the served path (serving.json's tokenizer.json, run by `tokenizers` alone)
    get the ids the datamodule trained on, special tokens and truncation included, for real fortunes."""
    import json

    from lightning_template.hf_models import HFTextDataModule
    from lightning_template.serving.preprocess import preprocessor

    from tests.hf_models.encoders import saved_encoder

    datamodule = HFTextDataModule(tokenizer=str(saved_encoder(family, tmp_path)), max_length=16,
                                  train_file=str(fortunes_dir / "train.jsonl"))  # fmt: skip
    preprocess = preprocessor(json.loads(json.dumps(datamodule.serving_spec())))  # as serving.json holds it
    texts = [*_fortunes(fortunes_dir / "val.jsonl"), "Beam me up.", "x"]
    expected = [datamodule.tokenizer.encode(text, 16) for text in texts]
    assert [preprocess.from_json(text, i) for i, text in enumerate(texts)] == expected
    assert {len(ids) == 16 for ids in expected} == {True, False}  # truncated texts and shorter ones


@pytest.mark.slow
@pytest.mark.parametrize(("family", "lora"), [("bert", 0), ("roberta", 5)], ids=["bert", "roberta-lora"])
def test_an_hf_classifier_is_exported_and_served_from_its_checkpoint_alone(
    family: str, lora: int, tmp_path: Path, fortunes_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Hugging Face encoder (a tiny random one saved here) fine-tuned on fortunes, two-stage or with LoRA (rank 5),
    then, offline: export.py's TorchScript and ONNX (LoRA merged) reproduce the model's logits, the ONNX file its
    probabilities on real sentences at two batch sizes and lengths; serve.py answers raw texts with predict's labels
    and probabilities from the checkpoint alone (the encoder's folder gone) and (LoRA) from the ONNX file."""
    import json
    import shutil

    import numpy as np
    import onnx

    from lightning_template.engine.cli import ProjectCLI
    from lightning_template.serving.backends import load_backend
    from lightning_template.serving.preprocess import preprocessor

    from tests.hf_models.encoders import saved_encoder

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the servers' processes too
    monkeypatch.chdir(tmp_path)
    encoder = saved_encoder(family, tmp_path / "encoders")
    job = [
        f"--config={ROOT / 'configs/hf_fortunes.yaml'}",
        f"--model.backbone={encoder}",
        f"--data.tokenizer={encoder}",
        "--data.max_length=32",
        "--data.batch_size=8",
    ]
    job += [f"--config={ROOT / 'configs/presets/hf_lora.yaml'}", f"--model.lora_rank={lora}"] if lora else []
    data = [f"--data.{split}_file={fortunes_dir / f'{split}.jsonl'}" for split in ("train", "val")]
    data.append("--data.test_file=null")
    quick = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=2"]
    ProjectCLI(
        args=[
            "fit",
            *job,
            *data,
            "--data.test_file=null",
            "--test_after_fit=false",
            *quick,
            "--trainer.enable_progress_bar=false",
        ]
    )
    checkpoint = next(tmp_path.glob("logs/hf_fortunes/version_0/checkpoints/epoch=*.ckpt"))
    exported = run_cli(*job, *data, f"--ckpt_path={checkpoint}", "--out=out", cwd=tmp_path, script="export.py")
    for kind, file in (("torchscript", "net.ts"), ("onnx", "net.onnx"), ("state_dict", "net_state_dict.pt")):
        assert f"{kind:<11} out/{file}  max |logit difference| = " in exported.stdout
    assert "FAILED" not in exported.stdout
    if lora:  # LoRA's matrices are the only ones with its rank (5) as a dimension: merged, none is left
        assert not [t.name for t in onnx.load(tmp_path / "out/net.onnx").graph.initializer if lora in t.dims]

    shutil.rmtree(encoder)  # from here on, the checkpoint (or the export) alone
    texts = ["The compiler crashed and dumped core.", "Beam me up, Scotty.", "BREAD, cheese & wine?!", "x"]
    texts.append(" ".join(_fortunes(fortunes_dir / "test.jsonl")[:3]))  # longer than max_length: truncated
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    ProjectCLI(args=["predict", f"--ckpt_path={checkpoint}", f"--data.predict_file={tmp_path / 'texts.txt'}",
                     "--predictions.output_file=predictions.csv", "--trainer.enable_progress_bar=false"])  # fmt: skip
    with open(tmp_path / "predictions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["input"] for row in rows] == texts

    model, onnx_model = load_backend(checkpoint), load_backend(tmp_path / "out/net.onnx")
    sentences = _fortunes(fortunes_dir / "test.jsonl")
    preprocess = preprocessor(onnx_model.spec)
    shortest = sorted(sentences, key=len)[:3]  # shorter than max_length
    batches = [preprocess.collate([preprocess.from_json(t, i) for i, t in enumerate(s)]) for s in (sentences[:16],
               shortest)]  # fmt: skip
    assert batches[0].shape[0] != batches[1].shape[0] and batches[0].shape[1] != batches[1].shape[1]
    assert all(np.abs(onnx_model(tokens) - model(tokens)).max() < 1e-5 for tokens in batches)

    servers = [("--ckpt_path", checkpoint), ("--onnx_path", tmp_path / "out/net.onnx")]
    for flag, path in servers[: 2 if lora else 1]:  # the ONNX server once, on the merged LoRA
        with background_server(flag, str(path), cwd=tmp_path) as url:
            _assert_predict_s(requests.post(f"{url}/predict", json={"texts": texts}, timeout=30), rows)
            assert requests.get(f"{url}/info", timeout=5).json()["model"]["input"] == "hf_text"
            schema = requests.get(f"{url}/openapi.json", timeout=5).json()["paths"]["/predict"]["post"]
            assert "texts" in json.dumps(schema["requestBody"])


# /extra:hf


@pytest.mark.slow
def test_fit_predict_export_and_serve_raw_texts(tmp_path: Path, fortunes_dir: Path) -> None:
    """One short run, then what a user does with it: predict raw texts to CSV, export (TorchScript, ONNX and
    the state dict reproduce the logits at two sequence lengths), and serve the same answers over HTTP."""
    data = [
        f"--data.train_file={fortunes_dir / 'train.jsonl'}",
        f"--data.val_file={fortunes_dir / 'val.jsonl'}",
        f"--data.test_file={fortunes_dir / 'test.jsonl'}",
    ]
    quick = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=30", "--trainer.enable_progress_bar=false"]
    quick += ["--model.depth=1", "--model.dim=32", "--test_after_fit=false"]
    run_cli("fit", "--config", str(ROOT / "configs/transformer_text.yaml"), *data, *quick, cwd=tmp_path)
    texts = ["The compiler crashed and dumped core.", "Beam me up, Scotty.", "BREAD, cheese & wine?!", "x"]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    checkpoint = next((tmp_path / "logs/transformer_text/version_0/checkpoints").glob("epoch=*.ckpt"))
    run_cli(
        "predict", "--config", str(ROOT / "configs/transformer_text.yaml"), f"--ckpt_path={checkpoint}",
        "--data.train_file=null", "--data.val_file=null", "--data.test_file=null",  # the checkpoint is enough
        f"--data.predict_file={tmp_path / 'texts.txt'}", "--model.depth=1", "--model.dim=32", cwd=tmp_path,
    )  # fmt: skip
    with open(tmp_path / "predictions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["input"] for row in rows] == texts
    assert all(row["prediction"] in {"computers", "food", "startrek"} for row in rows)
    assert list(rows[0]) == ["input", "prediction", "probability", "p_computers", "p_food", "p_startrek"]
    assert sum(float(rows[0][f"p_{c}"]) for c in ("computers", "food", "startrek")) == pytest.approx(1, abs=1e-3)
    exported = run_cli(
        "--config", str(ROOT / "configs/transformer_text.yaml"), *data, "--model.depth=1", "--model.dim=32",
        f"--ckpt_path={checkpoint}", "--out=out", cwd=tmp_path, script="export.py",
    )  # fmt: skip
    for kind, file in (("torchscript", "net.ts"), ("onnx", "net.onnx"), ("state_dict", "net_state_dict.pt")):
        assert f"{kind:<11} out/{file}  max |logit difference| = " in exported.stdout
    assert "FAILED" not in exported.stdout and (tmp_path / "out/serving.json").is_file()
    # serve.py reads raw texts with the checkpoint's tokenizer: predict's answers, to 1e-5.
    with background_server("--ckpt_path", str(checkpoint), cwd=tmp_path) as url:
        texts = [row["input"] for row in rows]
        _assert_predict_s(requests.post(f"{url}/predict", json={"texts": texts}, timeout=30), rows)
        empty = requests.post(f"{url}/predict", json={"texts": ["ok", "   "]}, timeout=30)
        assert empty.status_code == 400 and "input 1: empty text" in empty.json()["detail"]
        assert requests.post(f"{url}/predict", json={"text": texts[0]}, timeout=30).status_code == 200
