"""What a datamodule of this project exposes, and what train.py links from it into the model.

Every datamodule is a `ClassificationData`; image datamodules add `input_shape`, text
datamodules `vocab_size`, `pad_id` and `max_length`. Each of these is available right after
`__init__` and is passed to the model argument of the same name, if the model has one
(the datamodule's `model_facts`): facts about the data are stated once, by the data.

A datamodule that learns something from its training files at construction (a vocabulary)
takes `state_from_checkpoint`: train.py sets it to `--ckpt_path`, so evaluating or predicting
uses what the checkpoint was trained with, and needs no training files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

CHECKPOINT_STATE_ARG = "state_from_checkpoint"


@runtime_checkable
class ClassificationData(Protocol):
    @property
    def num_classes(self) -> int: ...

    @property
    def class_names(self) -> Sequence[str]: ...

    def predict_inputs(self, indices: Sequence[int]) -> list[str]:
        """A name for each predicted sample (a file path, the text itself), for the predictions CSV."""
        ...


@runtime_checkable
class ImageData(ClassificationData, Protocol):
    @property
    def input_shape(self) -> tuple[int, int, int]: ...


@runtime_checkable
class TextData(ClassificationData, Protocol):
    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def max_length(self) -> int: ...


@runtime_checkable
class ServableData(ClassificationData, Protocol):
    def serving_spec(self) -> dict[str, Any]:
        """How to turn a raw input (an image file, a text) into the model's input, as evaluation does:
        a JSON-able dict, stored in every checkpoint (ClassificationModule.on_save_checkpoint) for whatever
        serves the model without its training data."""
        ...
