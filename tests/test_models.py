from __future__ import annotations

import itertools
import math

import pytest
import torch

from models import SimpleCNN
from models.schedule import lr_factor


@pytest.mark.parametrize("input_shape", [(1, 28, 28), (3, 32, 32), (3, 64, 48)])
def test_simple_cnn_adapts_to_input_shape(input_shape: tuple[int, int, int]) -> None:
    model = SimpleCNN(num_classes=7, input_shape=input_shape)
    logits = model(torch.randn(4, *input_shape))
    assert logits.shape == (4, 7)


def test_hyperparameters_include_base_and_model_arguments() -> None:
    model = SimpleCNN(num_classes=3, input_shape=(1, 28, 28), hidden=64, lr=0.01, schedule="step")
    assert model.hparams.hidden == 64 and model.hparams.lr == 0.01 and model.hparams.schedule == "step"
    assert model.hparams.num_classes == 3


def test_warmup_then_cosine() -> None:
    kwargs = dict(total_steps=110, warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    assert lr_factor(0, **kwargs) == pytest.approx(0.1)
    assert lr_factor(9, **kwargs) == pytest.approx(1.0)
    assert lr_factor(10, **kwargs) == pytest.approx(1.0)
    assert lr_factor(60, **kwargs) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(110, **kwargs) == pytest.approx(0.1)
    factors = [lr_factor(s, **kwargs) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(factors))


def test_step_schedule_drops_by_gamma() -> None:
    kwargs = dict(total_steps=100, warmup_steps=0, schedule="step", step_every=30, gamma=0.5)
    assert [lr_factor(s, **kwargs) for s in (0, 29, 30, 59, 60)] == [1.0, 1.0, 0.5, 0.5, 0.25]
    assert math.isclose(lr_factor(5, 100, 0, "constant"), 1.0)
