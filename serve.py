"""Serve a trained model over HTTP with LitServe: `POST /predict`, `GET /health`, `GET /info`.

    python serve.py --ckpt_path logs/simple_cnn/version_0/checkpoints/last.ckpt
    python serve.py --onnx_path exports/simplecnn/net.onnx          # onnxruntime, no torch
    curl -F file=@shoe.png http://127.0.0.1:8000/predict

The checkpoint carries what the model needs to read raw inputs (image size, resize/crop,
normalization, or the tokenizer; see lightning_template/serving/preprocess.py), so no data or config is needed.
Request and answer formats: lightning_template/serving/api.py.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
from pathlib import Path
from types import FrameType

import litserve as ls
from jsonargparse import ArgumentParser, Namespace

from lightning_template.engine.errors import ProjectError
from lightning_template.script_args import script_parser
from lightning_template.serving.api import ClassifierAPI, predict_openapi
from lightning_template.serving.backends import load_backend
from lightning_template.serving.middleware import CheckRequestBody
from lightning_template.serving.preprocess import preprocessor


def parser() -> ArgumentParser:
    parser = script_parser(__doc__)
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--ckpt_path", help="A checkpoint written by train.py (torch backend).")
    model.add_argument("--onnx_path", help="A net.onnx written by export.py, with its serving.json (onnxruntime).")
    parser.add_argument("--host", default="127.0.0.1", help="Interface to listen on; 0.0.0.0 in a container.")
    parser.add_argument("--port", type=int, default=8000, help="Port to listen on.")
    parser.add_argument(
        "--accelerator", default="auto", choices=["auto", "cpu", "cuda", "mps"], help="Where the model runs."
    )
    parser.add_argument("--devices", default="auto", help="Number of devices, or auto.")
    parser.add_argument("--workers_per_device", type=int, default=1, help="Model copies per device.")
    parser.add_argument("--max_batch_size", type=int, default=16, help="Requests gathered into one forward pass.")
    parser.add_argument("--batch_timeout", type=float, default=0.005, help="Seconds to wait for a batch to fill.")
    parser.add_argument("--max_inputs", type=int, default=64, help="Inputs allowed in one request.")
    parser.add_argument("--max_payload_mb", type=float, default=10.0, help="Largest request body (413 above).")
    parser.add_argument("--timeout", type=float, default=30.0, help="Seconds a request may wait (504 after).")
    return parser


def onnx_accelerator(requested: str) -> str:
    """`auto` for onnxruntime: CUDA if a GPU is listed and onnxruntime has CUDA, else CPU. LitServe's own `auto`
    imports torch (to look for Apple's MPS) when no NVIDIA GPU is listed, and the ONNX server never needs it."""
    if requested != "auto":
        return requested
    import onnxruntime
    from litserve.connector import check_cuda_with_nvidia_smi  # `nvidia-smi -L`, as LitServe counts GPUs

    cuda = check_cuda_with_nvidia_smi() > 0 and "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    return "cuda" if cuda else "cpu"


def build_server(args: Namespace) -> ls.LitServer:
    model_path = args.ckpt_path or args.onnx_path
    spec = load_backend(model_path).spec  # fails here, before any worker starts, if the file is unusable
    field = preprocessor(spec).field  # so does a spec the server cannot read inputs by
    api = ClassifierAPI(
        model_path, max_inputs=args.max_inputs, max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout
    )
    devices = args.devices if args.devices == "auto" else int(args.devices)
    server = ls.LitServer(
        api,
        accelerator=onnx_accelerator(args.accelerator) if args.onnx_path else args.accelerator,
        devices=devices,
        workers_per_device=args.workers_per_device,
        timeout=args.timeout,
        max_payload_size=int(args.max_payload_mb * 1024 * 1024),
        middlewares=[CheckRequestBody],
        model_metadata={
            "model": Path(model_path).name,
            "backend": "onnxruntime" if args.onnx_path else "torch",
            "input": spec["kind"],
            "class_names": list(spec["class_names"]),
        },
    )
    for route in server.app.routes:
        if getattr(route, "path", None) == "/predict":
            route.openapi_extra = predict_openapi(field, args.max_inputs)
    return server


def interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as Ctrl-C. LitServe stops its API server and worker processes on KeyboardInterrupt only; `kill`,
    `docker stop` and Kubernetes send SIGTERM to this process alone, which by default would die and leave them
    serving (or, as a container's PID 1, ignore it)."""
    if multiprocessing.parent_process() is not None:  # a process LitServe forked, which inherited this handler
        sys.exit(128 + signum)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        server = build_server(args)
    except (FileNotFoundError, ValueError, ProjectError) as err:
        sys.exit(f"serve.py: {err}")
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        server.run(host=args.host, port=args.port, generate_client_file=False, num_api_servers=1)
    except KeyboardInterrupt:
        pass  # stopped while starting: LitServe's shutdown does not run then, the loop below stops its processes
    finally:
        signal.signal(signal.SIGTERM, previous)
        for child in multiprocessing.active_children():
            child.terminate()
            child.join(timeout=10)
            if child.is_alive():
                child.kill()


if __name__ == "__main__":
    main()
