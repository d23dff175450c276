"""Muon for a network's hidden weight matrices, AdamW for everything else, as one optimizer.

Muon (torch.optim.Muon; https://kellerjordan.github.io/posts/muon/) replaces each matrix's momentum update by the
nearest orthogonal matrix, so every direction of the matrix learns at the same rate. It is meant for the weight
matrices inside the blocks only: embeddings, the output layer, norms and biases are trained by AdamW. Lightning's
automatic optimization steps one optimizer, so this one holds both kinds of groups and hands each to torch's own
Muon or AdamW; the states of both are this optimizer's (a checkpoint saves and restores them as any optimizer's).

A model marks the groups of its hidden matrices with `"muon": True` in `configure_optimizers` (a key that any
other optimizer ignores: under AdamW those groups are plain AdamW groups).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import AdamW, Muon, Optimizer

from lightning_template.engine.errors import ConfigError


class MuonAdamW(Optimizer):
    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        muon_lr: float = 0.02,
        muon_weight_decay: float = 0.1,
        momentum: float = 0.95,
    ) -> None:
        """
        Args:
            params: Parameter groups; those with `"muon": True` (2-D weight matrices only) are Muon's.
            lr: AdamW's learning rate (embeddings, output layer, norms, biases).
            weight_decay: AdamW's decoupled weight decay (a group may set its own, e.g. 0 for norms and biases).
            betas: AdamW's moment decay rates.
            muon_lr: Muon's learning rate (scaled by sqrt(rows / columns) for tall matrices, as torch's Muon does).
            muon_weight_decay: Muon's decoupled weight decay.
            momentum: Muon's Nesterov momentum.
        """
        # Muon's defaults, for its groups alone (also those added later): AdamW's are every group's `defaults`.
        self.muon_defaults = {"lr": muon_lr, "weight_decay": muon_weight_decay, "momentum": momentum}
        self._steppers: list[Optimizer] = []
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "betas": betas, "muon": False})

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if param_group.get("muon"):
            params = param_group["params"]
            param_group["params"] = params = [params] if isinstance(params, torch.Tensor) else list(params)
            shapes = [tuple(p.shape) for p in params if p.ndim != 2]
            if shapes:  # refused before the group is added: the optimizer stays as it was
                raise ConfigError(
                    f'MuonAdamW: the group {param_group.get("name", "")!r} marked "muon" holds parameters of shapes'
                    f" {shapes}; Muon trains 2-D weight matrices only: put them in a group without the mark."
                )
            for key, value in self.muon_defaults.items():
                param_group.setdefault(key, value)
        super().add_param_group(param_group)
        self._bind()

    def _bind(self) -> None:
        """torch's Muon and AdamW over this optimizer's own group dicts (a learning-rate schedule that sets a group's
        `lr` sets it for them) and its own state (what `state_dict` saves)."""
        muon = [group for group in self.param_groups if group["muon"]]
        adamw = [group for group in self.param_groups if not group["muon"]]
        self._steppers = [*([Muon(muon)] if muon else []), *([AdamW(adamw)] if adamw else [])]
        for stepper in self._steppers:
            stepper.state = self.state

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "muon_defaults": self.muon_defaults}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # After a copy, a pickle, or `load_state_dict` (new group dicts and a new state): bound again.
        super().__setstate__(state)
        self._bind()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for stepper in self._steppers:
            stepper.step()
        return loss
