"""Request inputs -> model inputs, from the checkpoint's input spec, with numpy and PIL only.

The spec is written into every checkpoint at training time by the datamodule that trained
it (`serving_spec()`, saved by `ClassificationModule.on_save_checkpoint`) and next to an exported
ONNX file as `serving.json`. It states what the evaluation pipeline did (size, resize/crop, normalization,
the tokenizer's vocabulary and rules), so a served model sees its inputs exactly as `predict`
did, without the training data and without torch: the ONNX backend never imports it.

Anything a client can get wrong raises `BadInput`, which the server answers with a 4xx.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from lightning_template.engine.errors import ConfigError, ProjectError
from lightning_template.tasks.classification.input_spec import (
    center_crop,
    eight_bit,
    normalization,
    resized_size,
    split_words,
)

MAX_PIXELS = 40_000_000  # refuse larger images before decoding them (PIL's own bomb guard is at 179 MP)
# Resizing the short side keeps the aspect ratio: a 1x3000 image would become 256x768,000 (800 MB, seconds of
# one worker). Only the central crop is used, so a resized image past this is refused from its header.
MAX_RESIZED_PIXELS = 4_000_000
EIGHT_BIT_MODES = ("L", "LA", "RGB", "RGBA")


class BadInput(ProjectError, ValueError):
    """A request the server refuses, with the HTTP status and a message for the client."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class ImagePreprocessor:
    """Image file bytes -> float32 [N, C, H, W], normalized as the datamodule's evaluation pipeline."""

    field = "images"

    def __init__(self, spec: dict[str, Any]) -> None:
        self.channels = spec["channels"]
        self.convert: str | None = spec.get("convert")  # a mode every image is converted to (file datasets)
        self.size: tuple[int, int] | None = tuple(spec["size"]) if spec.get("size") else None  # required H, W
        self.resize: int | None = spec.get("resize")  # short side, before a center crop of `crop`
        self.crop: int | None = spec.get("crop")
        # uint8 -> (x / 255 - mean) / std as one multiply-add, as the in-memory datamodules do on the device.
        scale, shift = normalization(spec["mean"], spec["std"])
        self.scale, self.shift = scale[0], shift[0]

    def describe(self) -> str:
        channels = {1: "grayscale (1-channel)", 3: "RGB"}.get(self.channels, f"{self.channels}-channel")
        if self.size:
            return f"{channels} images of {self.size[1]}x{self.size[0]} pixels, as image files (PNG, JPEG, ...)"
        return "image files (PNG, JPEG, ...) of any size"

    def decode(self, data: bytes, index: int) -> np.ndarray:
        try:
            with Image.open(io.BytesIO(data)) as opened:
                self._check_size(opened.size, index)  # from the header, before decoding any pixel
                image = self._to_model_mode(opened, index)
        except BadInput:
            raise
        except Exception as err:  # PIL raises many types for bad files
            raise BadInput(f"input {index}: not an image file PIL can decode ({type(err).__name__}).") from None
        channels = len(image.getbands())
        if channels != self.channels:
            raise BadInput(
                f"input {index}: {image.mode} image with {channels} channel(s); this model takes {self.describe()}."
            )
        if self.resize:
            image = image.resize(resized_size(image.size, self.resize), Image.Resampling.BILINEAR)
        if self.crop:
            image = center_crop(image, self.crop)
        array = np.asarray(image, dtype=np.uint8)
        array = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
        return array.astype(np.float32) * self.scale + self.shift

    def _check_size(self, size: tuple[int, int], index: int) -> None:
        width, height = size
        if self.size and (height, width) != self.size:
            raise BadInput(
                f"input {index}: {width}x{height} pixels; this model takes {self.describe()}."
                " Resize it as the training data was."
            )
        if width * height > MAX_PIXELS:
            raise BadInput(f"input {index}: {width}x{height} pixels, more than {MAX_PIXELS:,}.", status=413)
        if self.resize:
            new_width, new_height = resized_size(size, self.resize)
            if new_width * new_height > MAX_RESIZED_PIXELS:
                raise BadInput(
                    f"input {index}: {width}x{height} pixels would be resized to {new_width}x{new_height}, more than"
                    f" {MAX_RESIZED_PIXELS:,} pixels; crop it to a less elongated shape.",
                    status=413,
                )

    def _to_model_mode(self, image: Image.Image, index: int) -> Image.Image:
        """The image as training read it: converted to `convert` (file datasets convert every file), else an
        8-bit image of the model's channel count, palette and 1-bit images expanded, equal RGB bands as gray."""
        if self.convert:
            try:
                return eight_bit(image).convert(self.convert)
            except ValueError as err:
                raise BadInput(f"input {index}: {err}.") from None
        if image.mode in ("1", "P"):
            image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        if image.mode not in EIGHT_BIT_MODES:
            raise BadInput(f"input {index}: {image.mode} pixels (16-bit, 32-bit or float); send an 8-bit image.")
        if self.channels == 1 and image.mode == "RGB":
            pixels = np.asarray(image)
            if (pixels == pixels[..., :1]).all():  # a grayscale picture saved as RGB
                return Image.fromarray(np.ascontiguousarray(pixels[..., 0]))
        return image.copy()

    def collate(self, inputs: Sequence[np.ndarray]) -> np.ndarray:
        return np.stack(inputs)

    def from_json(self, value: Any, index: int) -> np.ndarray:
        if not isinstance(value, str):
            raise BadInput(f"input {index}: expected a base64-encoded image file as a string.")
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise BadInput(f"input {index}: not valid base64.") from None
        return self.decode(data, index)

    def from_upload(self, data: bytes, index: int) -> np.ndarray:
        return self.decode(data, index)


class TextPreprocessor:
    """Texts -> int64 token ids [N, longest], padded: the checkpoint's word tokenizer."""

    field = "texts"

    def __init__(self, spec: dict[str, Any]) -> None:
        self.ids = {word: i for i, word in enumerate(spec["vocab"])}
        self.pattern = re.compile(spec["token_pattern"])
        self.lowercase = spec["lowercase"]
        self.max_length, self.pad_id, self.unk_id = spec["max_length"], spec["pad_id"], spec["unk_id"]
        self.max_chars = spec.get("max_chars", 100_000)

    def describe(self) -> str:
        return "texts (non-empty strings)"

    def from_json(self, value: Any, index: int) -> list[int]:
        if not isinstance(value, str):
            raise BadInput(f"input {index}: expected a string, got {type(value).__name__}.")
        if not value.strip():
            raise BadInput(f"input {index}: empty text.")
        if len(value) > self.max_chars:
            raise BadInput(f"input {index}: {len(value)} characters, more than {self.max_chars}.", status=413)
        return self.encode(value)

    def encode(self, text: str) -> list[int]:
        words = split_words(text, self.pattern, self.lowercase)
        return [self.ids.get(word, self.unk_id) for word in words][: self.max_length] or [self.unk_id]

    def from_upload(self, data: bytes, index: int) -> list[int]:
        try:
            return self.from_json(data.decode("utf-8"), index)
        except UnicodeDecodeError:
            raise BadInput(f"input {index}: not UTF-8 text.") from None

    def collate(self, inputs: Sequence[list[int]]) -> np.ndarray:
        tokens = np.full((len(inputs), max(map(len, inputs))), self.pad_id, dtype=np.int64)
        for row, ids in enumerate(inputs):
            tokens[row, : len(ids)] = ids
        return tokens


Preprocessor = ImagePreprocessor | TextPreprocessor
KINDS: dict[str, type[Preprocessor]] = {"image": ImagePreprocessor, "text": TextPreprocessor}
# extra:hf


class HFTextPreprocessor(TextPreprocessor):
    """Texts -> int64 token ids [N, longest], padded: a Hugging Face encoder's own tokenizer (its tokenizer.json,
    which the checkpoint carries), special tokens included and truncated to max_length, as training encoded them;
    run by the `tokenizers` library, without transformers or torch."""

    def __init__(self, spec: dict[str, Any]) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            # imported here: the other kinds never need it
            from lightning_template.engine.errors import MissingPackageError

            raise MissingPackageError(
                "serving a Hugging Face encoder needs its tokenizer's library: uv sync --inexact --extra hf"
            ) from None
        if "tokenizer" not in spec:
            raise ConfigError(
                "the serving spec of kind hf_text has no 'tokenizer' (the encoder's tokenizer.json): save the"
                " checkpoint again with train.py, whose HFTextDataModule writes it."
            )
        self.tokenizer = Tokenizer.from_str(spec["tokenizer"])
        self.tokenizer.no_padding()  # padding is collate's, to the batch's longest text
        self.tokenizer.enable_truncation(spec["max_length"], direction=spec["truncation_side"])
        self.pad_id, self.max_chars = spec["pad_id"], spec.get("max_chars", 100_000)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids


KINDS["hf_text"] = HFTextPreprocessor
# /extra:hf


def preprocessor(spec: dict[str, Any]) -> Preprocessor:
    if spec.get("kind") not in KINDS:
        raise ConfigError(
            f"unknown input kind {spec.get('kind')!r} in the serving spec; expected one of {list(KINDS)}."
        )
    return KINDS[spec["kind"]](spec)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)
