"""Building a timm network from trained weights: a local file, or timm's own from the Hugging Face Hub.

Every source is loaded the same way, strictly: timm builds the network for the file's own classes from the file's
tensors, through the family's checkpoint filter (which resamples a ViT's position embeddings to another image size
and its patch embedding to another patch size), then the classifier is replaced for the data's classes. A file that
does not fit the backbone fails, naming the keys; no layer is left at its random initialization without a word
(timm's `pretrained=True` alone loads non-strictly once the class count differs).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightning_template.engine.errors import ConfigError, MissingPackageError
from lightning_template.tasks.classification.models.pretrained import WeightsError, adapt_input_conv, reachable

try:
    import timm
    from huggingface_hub import constants, try_to_load_from_cache
    from timm.models import get_pretrained_cfg, load_state_dict, load_state_dict_from_hf
except ImportError as err:
    raise MissingPackageError(
        "TimmClassifier needs timm: uv sync --inexact --extra timm (make train CONFIG=configs/timm_finetune.yaml does)."
    ) from err

HUB_TAGS = ("timm", "pretrained")  # --model.weights values meaning timm's own weights of the backbone
HUB_FILES = ("model.safetensors", "pytorch_model.bin")  # what timm's Hub repositories hold, the preferred first


def check_backbone(backbone: str) -> None:
    if not timm.is_model(backbone):
        close = difflib.get_close_matches(backbone, timm.list_models(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"--model.backbone {backbone}: not a timm model.{hint} timm.list_models('convnext*') lists a family."
        )


def fixed_input_size(backbone: str) -> bool:
    """Whether the family is built for one input size (ViT, Swin: timm's `img_size` argument)."""
    cfg = get_pretrained_cfg(backbone)
    return bool(cfg and cfg.fixed_input_size)


def create(backbone: str, **kwargs: Any) -> nn.Module:
    try:
        return timm.create_model(backbone, **kwargs)
    except TypeError as err:  # an argument this family does not take
        raise ConfigError(f"--model.backbone {backbone}: timm.create_model refused its arguments ({err}).") from err


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a weights file under timm's names: timm's .safetensors or .pth (of its training checkpoints,
    the moving average first), a folder timm's `save_for_hf` wrote, a checkpoint of a run of this project or its
    network's state dict (`net.model.` or `model.` before timm's names; a ResNetClassifier's are timm's ResNet's)."""
    if path.is_dir():
        path = next((path / name for name in HUB_FILES if (path / name).is_file()), path / HUB_FILES[0])
    if not path.is_file():
        raise WeightsError(
            f"--model.weights {path}: no such file, nor {' or '.join(HUB_TAGS)} (timm's weights from the Hugging Face"
            " Hub). Give timm's .safetensors or .pth file, the folder save_for_hf wrote, or a .ckpt of an earlier run."
        )
    try:
        # weights_only (timm's default here): a file from elsewhere must not be able to run code when loaded.
        state = load_state_dict(str(path))
    except Exception as err:
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise WeightsError(
            f"--model.weights {path}: not a readable weights file ({type(err).__name__}: {reason})."
        ) from err
    if any(key.startswith("net.") for key in state):  # a checkpoint of a run of this project: its network
        state = {k.removeprefix("net."): v for k, v in state.items() if k.startswith("net.")}
    if state and all(key.startswith("model.") for key in state):  # a TimmNet's names: timm's after `model.`
        state = {k.removeprefix("model."): v for k, v in state.items()}
    if not state or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise WeightsError(f"--model.weights {path}: expected tensors by name (a state dict) or a checkpoint.")
    return state


def hub_weights(backbone: str, tag: str) -> dict[str, torch.Tensor]:
    """timm's pretrained weights of `backbone` (its default tag, or the one the name carries): from the Hugging Face
    cache, else downloaded into it."""
    cfg = get_pretrained_cfg(backbone)
    if cfg is None or not cfg.hf_hub_id:
        raise WeightsError(
            f"--model.weights {tag}: timm has no pretrained weights of {backbone} on the Hugging Face Hub;"
            " give a weights file (--model.weights path/to/model.safetensors)."
        )
    repo, _, revision = cfg.hf_hub_id.partition("@")
    for name in HUB_FILES:
        cached = try_to_load_from_cache(repo, name, revision=revision or None)
        if isinstance(cached, str):
            return read_weights(Path(cached))
    url = f"{constants.ENDPOINT}/{repo}/resolve/{revision or 'main'}/{HUB_FILES[0]}"
    fix = f"Download {url} where there is a network and pass the file: --model.weights path/to/{HUB_FILES[0]}"
    if constants.HF_HUB_OFFLINE or not reachable(constants.ENDPOINT):
        raise WeightsError(
            f"--model.weights {tag}: timm's weights of {backbone} ({repo}) are not in the Hugging Face cache"
            f" ({constants.HF_HUB_CACHE}) and the Hub cannot be reached (offline?). {fix}"
        )
    try:
        return load_state_dict_from_hf(cfg.hf_hub_id)
    except Exception as err:  # a network error, a repository that moved, ...
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise WeightsError(
            f"--model.weights {tag}: downloading {repo} failed ({type(err).__name__}: {reason}). {fix}"
        ) from err


def build(backbone: str, weights: str | None, num_classes: int, in_chans: int, **kwargs: Any) -> nn.Module:
    """timm's `backbone` for `num_classes` classes and `in_chans` input channels, from `weights` if given (everything
    but the classifier, which is new), else randomly initialized. `kwargs` go to timm.create_model."""
    if weights is None:
        return create(backbone, num_classes=num_classes, in_chans=in_chans, **kwargs)
    is_tag = weights in HUB_TAGS and not Path(weights).exists()
    state = hub_weights(backbone, weights) if is_tag else read_weights(Path(weights))
    cfg = get_pretrained_cfg(backbone)
    classifier, first_conv = (cfg.classifier, cfg.first_conv) if cfg else (None, None)
    if isinstance(first_conv, str) and state.get(f"{first_conv}.weight", torch.empty(0)).ndim == 4:
        # This project's rule for another channel count (models/pretrained.py), before timm sees the file.
        state[f"{first_conv}.weight"] = adapt_input_conv(state[f"{first_conv}.weight"], in_chans)
    head = state.get(f"{classifier}.weight") if isinstance(classifier, str) else None
    file_classes = 0 if head is None else head.shape[0]  # 0: a file without classifier (timm's num_classes=0)
    input_size = (in_chans, *(cfg.input_size[1:] if cfg else (224, 224)))
    overlay = dict(state_dict=state, source=None, num_classes=file_classes, input_size=input_size, label_offset=0)
    try:
        # Built for the file's own classes, timm loads it strictly (all keys, all shapes) through its filter.
        model = create(
            backbone, pretrained=True, pretrained_cfg_overlay=overlay, num_classes=file_classes, in_chans=in_chans,
            **kwargs,
        )  # fmt: skip
    except RuntimeError as err:  # load_state_dict's missing, unexpected and mis-shaped keys
        details = "; ".join(line.strip() for line in str(err).splitlines()[1:] if line.strip())
        raise WeightsError(
            f"--model.weights {weights} does not fit timm's {backbone} ({details[:600]}). Check that --model.backbone"
            " names the architecture and size that wrote the file."
        ) from err
    model.reset_classifier(num_classes)
    return model
