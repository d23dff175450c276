"""How a raw input becomes a model input: the rules that training and a deployed model share, written once.

Torch-free (numpy and PIL), so a server can apply them without importing torch. A datamodule states
its rules as a JSON-able spec (its `serving_spec()`), which every checkpoint stores under `SPEC_KEY`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from PIL import Image

SPEC_KEY = "input_spec"  # where ClassificationModule stores its datamodule's spec in a checkpoint
TOKEN_PATTERN = re.compile(r"\w+|[^\w\s]")  # words and single punctuation marks


def split_words(text: str, pattern: re.Pattern[str] = TOKEN_PATTERN, lowercase: bool = True) -> list[str]:
    """The word tokenizer's rule: lower-cased words and punctuation marks."""
    return pattern.findall(text.lower() if lowercase else text)


def normalization(mean: Sequence[float], std: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(scale, shift) of shape [1, C, 1, 1], float32: uint8 pixels x -> (x / 255 - mean) / std as x * scale + shift,
    one multiply-add instead of a division and two subtractions."""
    mean_ = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    std_ = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    return (1 / (np.float32(255.0) * std_)).astype(np.float32), (-mean_ / std_).astype(np.float32)


def resized_size(size: tuple[int, int], short_side: int) -> tuple[int, int]:
    """(width, height) with the short side at `short_side`, as torchvision's Resize(int) computes it."""
    width, height = size
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = short_side, int(short_side * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def center_crop_box(width: int, height: int, side: int) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of the central `side` x `side` pixels, rounded as torchvision's CenterCrop."""
    top, left = round((height - side) / 2.0), round((width - side) / 2.0)
    return left, top, left + side, top + side


def center_crop(image: Image.Image, side: int) -> Image.Image:
    return image.crop(center_crop_box(image.width, image.height, side))


SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N")


def eight_bit(image: Image.Image) -> Image.Image:
    """`image` with 8-bit pixels, as training and a deployed model read every file: 16-bit grayscale scaled (0..65535 ->
    0..255; Pillow's own conversion would clip it at 255, an almost white image); ValueError for 32-bit or float
    pixels, whose range is unknown."""
    if image.mode in SIXTEEN_BIT_MODES or image.mode == "I":
        pixels = np.asarray(image)
        if image.mode == "I" and (pixels.min() < 0 or pixels.max() > 65535):
            raise ValueError(f"{image.mode} pixels outside 0..65535 (32-bit); save it as an 8- or 16-bit image")
        return Image.fromarray((pixels.astype(np.uint32) >> 8).astype(np.uint8), mode="L")
    if image.mode == "F":
        raise ValueError("float pixels, whose range is unknown; save it as an 8- or 16-bit image")
    return image
