"""What runs the network: a Lightning checkpoint in torch, or an exported ONNX file in onnxruntime.

Both take the preprocessed numpy batch and return class probabilities as numpy, so the API
is the same for both. Nothing here imports torch at module level: the ONNX backend never does.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from lightning_template.engine.errors import ConfigError, MissingFileError
from lightning_template.serving.preprocess import softmax
from lightning_template.tasks.classification.input_spec import SPEC_KEY

SPEC_FILE = "serving.json"  # where export.py writes it next to net.onnx
# The packages whose LightningModules a checkpoint may name (imported when a checkpoint names them, not before).
MODEL_PACKAGES = ["lightning_template.tasks"]
# extra:hf
MODEL_PACKAGES.append("lightning_template.hf_models")  # HFClassifier: any Hugging Face encoder
# /extra:hf


class Backend(Protocol):
    spec: dict[str, Any]

    def __call__(self, inputs: np.ndarray) -> np.ndarray:
        """Probabilities [N, classes] for a preprocessed batch."""
        ...


class TorchBackend:
    """A checkpoint of this project: the LightningModule class named in it, its weights (the checkpoint's
    `state_dict`: an average's, where the run averaged its weights), in eval mode."""

    def __init__(self, ckpt_path: str | Path, device: str = "cpu") -> None:
        import torch
        from lightning import LightningModule

        self.torch, self.device = torch, torch.device(device)
        try:
            checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        except Exception as err:  # a truncated or foreign file: torch says why
            reason = str(err).strip().splitlines()[0][:200]
            raise ConfigError(
                f"{ckpt_path}: not a readable PyTorch checkpoint ({type(err).__name__}: {reason})."
            ) from None
        self.spec = checkpoint.get(SPEC_KEY)
        if self.spec is None:
            raise ConfigError(
                f"{ckpt_path} has no input spec ('{SPEC_KEY}'); it was written before serving existed or outside"
                " train.py. Retrain with train.py, or save the datamodule's serving_spec() there in your module's"
                " on_save_checkpoint, as ClassificationModule does."
            )
        hparams = dict(checkpoint.get("hyper_parameters", {}))
        class_path = str(hparams.pop("_class_path", ""))
        module_name, _, class_name = class_path.rpartition(".")
        # Only this project's models: the class path comes from the file, and a checkpoint must not be
        # able to make the server import or call anything else.
        if not any(f"{module_name}.".startswith(f"{package}.") for package in MODEL_PACKAGES):
            raise ConfigError(f"{ckpt_path}: the model class {class_path!r} is not of this project's models.")
        model_class = getattr(importlib.import_module(module_name), class_name, None)
        if not (isinstance(model_class, type) and issubclass(model_class, LightningModule)):
            raise ConfigError(f"{ckpt_path}: {class_path!r} is not a LightningModule of this project's models.")
        # Serving never trains: the optimizer is left at the model's default, so its class path (any module
        # the file names) is never imported.
        hparams = {k: v for k, v in hparams.items() if not k.startswith("_") and k != "optimizer"}
        if "weights" in hparams:
            hparams["weights"] = None  # the checkpoint's weights replace them: do not read the original file
        self.model = model_class(**hparams)
        self.model.load_state_dict(checkpoint["state_dict"])
        self.model.eval().to(self.device)

    def __call__(self, inputs: np.ndarray) -> np.ndarray:
        with self.torch.inference_mode():
            logits = self.model(self.torch.from_numpy(inputs).to(self.device))
            return logits.softmax(dim=-1).float().cpu().numpy()  # as the model's predict_step


class OnnxBackend:
    """An ONNX file written by export.py, with the `serving.json` next to it."""

    def __init__(self, onnx_path: str | Path, device: str = "cpu") -> None:
        import onnxruntime

        onnx_path = Path(onnx_path)
        spec_path = onnx_path.with_name(SPEC_FILE)
        if not spec_path.is_file():
            raise MissingFileError(f"{spec_path} not found: export.py writes it next to {onnx_path.name}.")
        self.spec = json.loads(spec_path.read_text())
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device.startswith("cuda") else None
        self.session = onnxruntime.InferenceSession(str(onnx_path), providers=providers or ["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def __call__(self, inputs: np.ndarray) -> np.ndarray:
        return softmax(self.session.run(None, {self.input_name: inputs})[0]).astype(np.float32)


def load_backend(model_path: str | Path, device: str = "cpu") -> Backend:
    """TorchBackend for a checkpoint (.ckpt), OnnxBackend for an .onnx file."""
    path = Path(model_path)
    if not path.is_file():
        raise MissingFileError(f"{path}: no such file. Give a checkpoint (.ckpt) or an exported net.onnx.")
    return OnnxBackend(path, device) if path.suffix == ".onnx" else TorchBackend(path, device)
