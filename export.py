"""Export a checkpoint for serving without Lightning, and verify every file by running it.

    python export.py --config configs/simple_cnn.yaml --ckpt_path <checkpoint> [--out exports/simple_cnn]

Writes, each checked against the LightningModule on a real validation batch and on a
batch of another size (the batch axis is dynamic; for token ids, of another length too):
- net.ts           TorchScript (torch.jit.load; no Python class needed)
- net.onnx         ONNX, run with onnxruntime (`uv sync --inexact --extra export` for onnx/onnxruntime)
                   (a network trained through adapters has them merged into its weights in both)
- net_state_dict.pt  the bare network's state dict, loadable with torch.load(weights_only=True)
                   into `<Model>(**hparams).net` (hparams in net_hparams.json), adapters unmerged
- serving.json     how raw inputs become the network's input, for `serve.py --onnx_path <out>/net.onnx`
"""

from __future__ import annotations

import copy
import importlib.util
import json
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.cli import LightningArgumentParser

from lightning_template.engine.cli import ProjectCLI, exit_on_error
from lightning_template.serving.backends import SPEC_FILE
from lightning_template.tasks.classification.input_spec import SPEC_KEY


class ExportCLI(ProjectCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.add_argument("--ckpt_path", type=str, required=True, help="Checkpoint to export.")
        parser.add_argument("--out", type=str, default=None, help="Output folder (default exports/<model>).")
        parser.add_argument("--atol", type=float, default=1e-4, help="Largest accepted difference in logits.")


def real_batches(datamodule: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A normalized validation batch, and 3 samples as a batch of another size: its first 3, or for token ids (whose
    length is dynamic too) the first 3 of the first later batch of another length, where there is one."""
    datamodule.prepare_data()
    datamodule.setup("validate")
    batches = (datamodule.on_after_batch_transfer(batch, 0)[0] for batch in datamodule.val_dataloader())
    inputs = other = next(batches)
    if inputs.dim() == 2:  # token ids [batch, length]
        other = next((batch for batch in batches if batch.shape[1] != inputs.shape[1]), inputs)
    return inputs, other[:3]


def report(name: str, path: Path, difference: float, atol: float) -> bool:
    ok = difference <= atol
    print(f"{name:<11} {path}  max |logit difference| = {difference:.2e}  ({'ok' if ok else 'FAILED'}, atol {atol:g})")
    return ok


def main() -> None:
    cli = ExportCLI(run=False, save_config_callback=None)
    config = cli.config
    model, datamodule = cli.model, cli.datamodule
    checkpoint = torch.load(config.ckpt_path, map_location="cpu", weights_only=True)
    model.load_state_dict(checkpoint["state_dict"])
    net = model.net.eval()
    deployed = net.merged().eval()  # adapters merged into the weights they adapt; the state dict keeps them
    out = Path(config.out or f"exports/{type(model).__name__.lower()}")
    out.mkdir(parents=True, exist_ok=True)
    inputs, other = real_batches(datamodule)
    with torch.no_grad():
        expected, expected_other = model.eval()(inputs), model(other)

    def difference(run) -> float:
        with torch.no_grad():
            return max((run(inputs) - expected).abs().max().item(), (run(other) - expected_other).abs().max().item())

    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer/exporter chatter about constants
        traced = torch.jit.trace(deployed, inputs)
        torch.jit.save(traced, out / "net.ts")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated in favour of torch.export, still the portable format
        loaded = torch.jit.load(out / "net.ts")
    results.append(report("torchscript", out / "net.ts", difference(loaded), config.atol))

    if importlib.util.find_spec("onnx") and importlib.util.find_spec("onnxruntime"):
        import onnxruntime

        axes = {0: "batch", 1: "tokens"} if inputs.dim() == 2 else {0: "batch"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                deployed, (inputs,), out / "net.onnx", dynamo=False, input_names=["input"], output_names=["logits"],
                dynamic_axes={"input": axes, "logits": {0: "batch"}},
            )  # fmt: skip
        session = onnxruntime.InferenceSession(str(out / "net.onnx"), providers=["CPUExecutionProvider"])
        run_onnx = lambda x: torch.from_numpy(session.run(None, {"input": x.numpy()})[0])  # noqa: E731
        results.append(report("onnx", out / "net.onnx", difference(run_onnx), config.atol))
    else:
        print("onnx        skipped: uv sync --inexact --extra export (onnx, onnxruntime)")

    spec = checkpoint.get(SPEC_KEY) or datamodule.serving_spec()
    (out / SPEC_FILE).write_text(json.dumps(spec))
    torch.save(net.state_dict(), out / "net_state_dict.pt")
    hparams = {k: v for k, v in model.hparams.items() if not k.startswith("_")}  # not the CLI's bookkeeping
    (out / "net_hparams.json").write_text(json.dumps({"class": type(model).__name__, **hparams}, indent=2))
    bare = copy.deepcopy(net)
    for tensor in bare.state_dict().values():
        tensor.zero_()  # prove the file, not the copy, restores the weights
    bare.load_state_dict(torch.load(out / "net_state_dict.pt", weights_only=True))
    results.append(report("state_dict", out / "net_state_dict.pt", difference(bare), 0.0))
    if not all(results):
        raise SystemExit(1)


if __name__ == "__main__":
    exit_on_error(main)
