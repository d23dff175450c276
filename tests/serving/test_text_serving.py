"""A text classifier end to end: fit, predict, export, and serve.py answering raw texts."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import requests

from lightning_template.serving.launch import background_server

from tests.conftest import ROOT, run_cli


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
        answer = requests.post(f"{url}/predict", json={"texts": texts}, timeout=30)
        assert answer.status_code == 200, answer.text
        for served, row in zip(answer.json()["predictions"], rows, strict=True):
            assert served["label"] == row["prediction"]
            assert all(abs(served["probabilities"][c] - float(row[f"p_{c}"])) < 1e-5 for c in served["probabilities"])
        empty = requests.post(f"{url}/predict", json={"texts": ["ok", "   "]}, timeout=30)
        assert empty.status_code == 400 and "input 1: empty text" in empty.json()["detail"]
        assert requests.post(f"{url}/predict", json={"text": texts[0]}, timeout=30).status_code == 200
