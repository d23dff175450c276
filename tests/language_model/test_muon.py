"""MuonAdamW: one optimizer that steps its marked groups as torch's Muon and the others as torch's AdamW, under a
learning-rate schedule, and resumes from its state_dict as if never stopped."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from lightning_template.tasks.language_model.model import LanguageModel
from lightning_template.tasks.language_model.muon import MuonAdamW

INPUTS = torch.randint(0, 10, (4, 5), generator=torch.Generator().manual_seed(0))
SETTINGS = {"lr": 0.01, "weight_decay": 0.1, "betas": (0.9, 0.99), "muon_lr": 0.02, "muon_weight_decay": 0.2}


def network() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 10))


def groups(net: nn.Sequential) -> list[dict]:
    return [
        {"params": [net[1].weight, net[4].weight], "muon": True, "name": "hidden"},
        {"params": [net[0].weight], "name": "decay"},
        {"params": [net[1].bias, net[2].weight, net[2].bias, net[4].bias], "weight_decay": 0.0, "name": "no_decay"},
    ]


def halving(step: int) -> float:
    return 0.5**step


def train(net: nn.Module, optimizer: torch.optim.Optimizer, schedule: LambdaLR, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        net(INPUTS).square().mean().backward()
        optimizer.step()
        schedule.step()


def test_marked_groups_step_as_torchs_muon_and_the_others_as_torchs_adamw_under_one_schedule() -> None:
    mixed, apart = network(), network()
    optimizer = MuonAdamW(groups(mixed), **SETTINGS)
    schedule = LambdaLR(optimizer, halving)
    muon = torch.optim.Muon([apart[1].weight, apart[4].weight], lr=0.02, weight_decay=0.2)
    adamw = torch.optim.AdamW(
        [{"params": [apart[0].weight]}, {"params": groups(apart)[2]["params"], "weight_decay": 0.0}],
        lr=0.01, weight_decay=0.1, betas=(0.9, 0.99),
    )  # fmt: skip
    schedules = [LambdaLR(muon, halving), LambdaLR(adamw, halving)]
    for _ in range(3):
        train(mixed, optimizer, schedule, 1)
        muon.zero_grad(), adamw.zero_grad()
        apart(INPUTS).square().mean().backward()
        muon.step(), adamw.step(), [s.step() for s in schedules]
    assert [group["lr"] for group in optimizer.param_groups] == [0.02 / 8, 0.01 / 8, 0.01 / 8]
    assert all(torch.equal(a, b) for a, b in zip(mixed.parameters(), apart.parameters(), strict=True))


def test_a_fresh_optimizer_loaded_from_the_state_dict_continues_as_the_one_never_stopped() -> None:
    never_stopped = network()
    optimizer = MuonAdamW(groups(never_stopped), **SETTINGS)
    schedule = LambdaLR(optimizer, lambda step: 1 / (1 + step))
    train(never_stopped, optimizer, schedule, 3)
    saved = copy.deepcopy(
        {"net": never_stopped.state_dict(), "opt": optimizer.state_dict(), "lr": schedule.state_dict()}
    )
    train(never_stopped, optimizer, schedule, 3)

    resumed = network()
    resumed.load_state_dict(saved["net"])
    fresh = MuonAdamW(groups(resumed))  # other settings: the state dict's are the ones that count
    fresh_schedule = LambdaLR(fresh, lambda step: 1 / (1 + step))
    fresh.load_state_dict(saved["opt"])
    fresh_schedule.load_state_dict(saved["lr"])
    train(resumed, fresh, fresh_schedule, 3)
    assert all(torch.equal(a, b) for a, b in zip(never_stopped.parameters(), resumed.parameters(), strict=True))


def test_a_group_added_later_is_stepped_and_only_matrices_can_be_muons() -> None:
    net = network()
    optimizer = MuonAdamW(groups(net)[:2], **SETTINGS)
    frozen_until_now = [p.detach().clone() for p in groups(net)[2]["params"]]
    optimizer.add_param_group(groups(net)[2])  # as a fine-tuning callback unfreezes a part of the network
    train(net, optimizer, LambdaLR(optimizer, halving), 1)
    assert not any(torch.equal(a, b) for a, b in zip(frozen_until_now, groups(net)[2]["params"], strict=True))
    with pytest.raises(ValueError, match="2D parameters"):
        MuonAdamW([{"params": [net[1].bias], "muon": True}])


def test_the_language_model_gives_muon_the_blocks_weight_matrices_and_adamw_the_rest() -> None:
    model = LanguageModel(vocab_size=16, max_length=8, dim=8, depth=2, num_heads=2, optimizer=MuonAdamW)
    names = {id(p): name for name, p in model.named_parameters()}
    grouped = {group["name"]: sorted(names[id(p)] for p in group["params"]) for group in model.parameter_groups()}
    linear = ("attn.qkv", "attn.proj", "mlp.0", "mlp.3")
    assert grouped["hidden"] == sorted(f"net.blocks.{b}.{layer}.weight" for b in range(2) for layer in linear)
    assert grouped["decay"] == ["net.embed.weight"]  # the output layer's too (tied)
    assert sorted(name for group in grouped.values() for name in group) == sorted(names.values())  # each once
    optimizer = model.make_optimizer(model.parameter_groups())
    assert [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups] == [(0.02, 0.1), (1e-3, 0.01), (1e-3, 0.0)]
