"""Reusing trained weights for every network here: everything but the classifier.

A weights file is a plain state dict (`torch.save(net.state_dict())`, torchvision's
`resnet18-f37072fd.pth`, an exported `net_state_dict.pt`) or a checkpoint of any run of
this project. Everything but the classifier is loaded strictly; the classifier keeps the
fresh initialization the model was built with for its own classes (what `reset_classifier`
gives an existing network). A first convolution trained on another number of
input channels is adapted (`adapt_input_conv`), so a grayscale checkpoint serves RGB data
and the reverse.
"""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

import torch
from torch import nn

from lightning_template.engine.errors import ConfigError

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


class WeightsError(ConfigError):
    """A weights file or name that cannot be used for this network."""


def reachable(url: str) -> bool:
    """Whether the Hub's host answers, in seconds (huggingface_hub's retries take a minute to give up offline)."""
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return True  # through a proxy: the download itself will tell
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port or 443), timeout=5).close()
    except OSError:
        return False
    return True


def adapt_input_conv(weight: torch.Tensor, in_channels: int) -> torch.Tensor:
    """A conv kernel [out, c, kh, kw] for `in_channels` inputs that answers a gray image the same way.

    RGB -> gray sums over the colour channels (R = G = B = gray gives the same response);
    otherwise the channels are repeated cyclically and rescaled by c / in_channels, so an
    input that repeats one image on every channel gives the same response (exactly when one
    channel count divides the other, e.g. gray -> RGB; approximately otherwise, e.g. RGB -> RGBA).
    """
    channels = weight.shape[1]
    if channels == in_channels:
        return weight
    if in_channels == 1:
        return weight.sum(dim=1, keepdim=True)
    repeats = math.ceil(in_channels / channels)
    return weight.repeat(1, repeats, 1, 1)[:, :in_channels] * (channels / in_channels)


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The network's tensors from a state dict or from a checkpoint of this project (keys `net.*`)."""
    if not path.is_file():
        raise WeightsError(f"--model.weights {path}: file not found. Give a state dict (.pth, .pt) or a checkpoint.")
    try:
        # weights_only: a file from elsewhere must not be able to run code when loaded.
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        reason = str(err).strip().splitlines()[0][:200]
        raise WeightsError(
            f"--model.weights {path}: not a readable torch file ({type(err).__name__}: {reason})."
            " Give a state dict saved with torch.save(net.state_dict()) or a .ckpt checkpoint."
        ) from err
    if isinstance(data, dict) and "state_dict" in data:  # a Lightning checkpoint
        return {k.removeprefix("net."): v for k, v in data["state_dict"].items() if k.startswith("net.")}
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise WeightsError(f"--model.weights {path}: expected a state dict (name -> tensor) or a checkpoint.")
    return {k.removeprefix("module."): v for k, v in data.items()}


def load_pretrained(net: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load everything but the classifier of `net` (see `models/seam.py`'s `ClassifierNet`), strictly."""
    classifier = {f"{net.classifier_name}.{k}" for k in net.get_classifier().state_dict()}
    first_conv = f"{net.first_conv}.weight"
    expected = {k: v for k, v in net.state_dict().items() if k not in classifier}
    state = {k: v for k, v in state.items() if not k.startswith(f"{net.classifier_name}.")}
    if first_conv in state and first_conv in expected:
        state[first_conv] = adapt_input_conv(state[first_conv], expected[first_conv].shape[1])
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    mismatched = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or unexpected or mismatched:
        details = [f"missing keys: {missing[:10]}"] if missing else []
        details += [f"unexpected keys: {unexpected[:10]}"] if unexpected else []
        details += [f"shape mismatches: {mismatched[:10]}"] if mismatched else []
        raise WeightsError(
            f"--model.weights {source} does not fit this network ({len(missing)} missing, {len(unexpected)}"
            f" unexpected, {len(mismatched)} mismatched).\n  " + "\n  ".join(details) + "\n"
            "Check that the model class and its size arguments (e.g. --model.arch) match the run that wrote the file."
        )
    net.load_state_dict(state, strict=False)  # the classifier keeps its fresh initialization
