"""MuonAdamW: one optimizer that steps its marked groups as torch's Muon and the others as torch's AdamW, under a
learning-rate schedule, and resumes from its state_dict as if never stopped."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from lightning_template.engine.cli import ProjectCLI
from lightning_template.engine.errors import ConfigError
from lightning_template.tasks.language_model.model import LanguageModel
from lightning_template.tasks.language_model.muon import MuonAdamW

from tests.conftest import ROOT

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


def test_a_copy_or_a_pickle_steps_as_the_original() -> None:
    net = network()
    optimizer = MuonAdamW(groups(net), **SETTINGS)
    train(net, optimizer, LambdaLR(optimizer, halving), 2)
    copied_net, copied = copy.deepcopy((net, optimizer))  # as Lightning's or a user's copy of the module and optimizer
    pickled_net, pickled = pickle.loads(pickle.dumps((net, optimizer)))
    for model, opt in ((net, optimizer), (copied_net, copied), (pickled_net, pickled)):
        train(model, opt, LambdaLR(opt, halving), 2)
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), copied_net.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), pickled_net.parameters(), strict=True))
    for opt in (copied, pickled):  # Muon's settings travel with it, for a group added later
        opt.add_param_group({"params": [nn.Parameter(torch.ones(3, 3))], "muon": True})
        assert (opt.param_groups[-1]["lr"], opt.param_groups[-1]["weight_decay"]) == (0.02, 0.2)


def test_the_step_evaluates_the_closure_once_and_returns_its_loss() -> None:
    net = network()
    optimizer = MuonAdamW(groups(net), **SETTINGS)
    calls = []

    def closure() -> torch.Tensor:  # what Lightning's automatic optimization hands to `step`
        calls.append(1)
        optimizer.zero_grad()
        loss = net(INPUTS).square().mean()
        loss.backward()
        return loss

    before = [p.detach().clone() for p in net.parameters()]
    assert optimizer.step(closure) is not None and calls == [1]
    assert not any(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))


def test_a_group_added_later_gets_its_optimizers_settings_and_a_refused_one_changes_nothing() -> None:
    net = network()
    hidden, decay, no_decay = groups(net)
    optimizer = MuonAdamW([decay], **SETTINGS)
    with pytest.raises(ConfigError, match=r"marked \"muon\" holds parameters of shapes \[\(16,\)\]; Muon trains 2-D"):
        optimizer.add_param_group({"params": [net[1].bias], "muon": True, "name": "bias"})
    assert len(optimizer.param_groups) == 1
    # As a fine-tuning callback unfreezes a part of the network: Muon's settings for Muon's group, AdamW's for the other
    optimizer.add_param_group({"params": hidden["params"], "muon": True, "name": "hidden"})
    optimizer.add_param_group(no_decay)
    assert [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups] == [(0.01, 0.1), (0.02, 0.2), (0.01, 0.0)]
    frozen_until_now = [p.detach().clone() for p in [*hidden["params"], *no_decay["params"]]]
    train(net, optimizer, LambdaLR(optimizer, halving), 1)
    now = [*hidden["params"], *no_decay["params"]]
    assert not any(torch.equal(a, b) for a, b in zip(frozen_until_now, now, strict=True))


def test_the_language_model_gives_muon_the_blocks_weight_matrices_and_any_other_optimizer_its_groups_as_before() -> (
    None
):
    model = LanguageModel(vocab_size=16, max_length=8, dim=8, depth=2, num_heads=2, optimizer=MuonAdamW)
    names = {id(p): name for name, p in model.named_parameters()}
    grouped = {group["name"]: [names[id(p)] for p in group["params"]] for group in model.parameter_groups()}
    linear = ("attn.qkv", "attn.proj", "mlp.0", "mlp.3")
    hidden = [f"net.blocks.{b}.{layer}.weight" for b in range(2) for layer in linear]
    assert grouped["hidden"] == hidden and grouped["decay"] == ["net.embed.weight"]  # the output layer's too (tied)
    assert sorted(name for group in grouped.values() for name in group) == sorted(names.values())  # each once
    optimizer = model.make_optimizer(model.parameter_groups())
    assert [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups] == [(0.02, 0.1), (1e-3, 0.01), (1e-3, 0.0)]
    # Under AdamW the matrices are one group, in the model's order: the checkpoints of AdamW runs resume.
    model = LanguageModel(vocab_size=16, max_length=8, dim=8, depth=2, num_heads=2, optimizer=torch.optim.AdamW)
    names = {id(p): name for name, p in model.named_parameters()}
    grouped = {group["name"]: [names[id(p)] for p in group["params"]] for group in model.parameter_groups()}
    assert list(grouped) == ["decay", "no_decay"] and grouped["decay"] == ["net.embed.weight", *hidden]


@pytest.mark.slow
def test_the_shipped_job_gives_muon_its_group() -> None:
    """Through the CLI, which hands the model its optimizer as a partial of its own, not of the class."""
    cli = ProjectCLI(args=[f"--config={ROOT / 'configs/language_model.yaml'}"], run=False)
    assert [g["name"] for g in cli.model.parameter_groups()] == ["hidden", "decay", "no_decay"]
