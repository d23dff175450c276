"""A decoder-only transformer language model, written out: the classifier's attention, made causal.

    token ids [batch, tokens] -> embeddings + positions -> causal pre-norm blocks -> norm -> logits [.., vocab]

Each position predicts the next token from itself and the tokens before it (the causal mask of
`MultiHeadSelfAttention`); the loss is the cross-entropy of every next token. Validation logs it per token
(`val_loss`, nats) and in bits (`val_bpt`: bits per token, bits per character for a character vocabulary). The
output layer shares its weights with the token embedding (fewer parameters, and better at this size).
`predict` continues prompts: sampled with `temperature` and `top_k`, seeded per prompt, so the same seed and
checkpoint write the same texts.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning import LightningModule
from lightning.pytorch.cli import OptimizerCallable
from torch import nn
from torchmetrics import MeanMetric

from lightning_template.engine.errors import ConfigError
from lightning_template.engine.sampling import derive_seed, global_seed
from lightning_template.tasks.classification.models.transformer import Block
from lightning_template.tasks.language_model.data import Prompt
from lightning_template.tasks.language_model.muon import MuonAdamW
from lightning_template.tasks.optim import (
    WarmupSchedule,
    check_run_length,
    optimizer_from_spec,
    optimizer_spec,
    steps_per_epoch,
)

LN2 = math.log(2)


class DecoderNet(nn.Module):
    def __init__(self, vocab_size: int, max_length: int, dim: int, depth: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.max_length = max_length
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, max_length, dim))
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, num_heads, 4.0, dropout, causal=True) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied: the same vector reads and writes a token
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [batch, length <= max_length] -> next-token logits [batch, length, vocab]."""
        x = self.dropout(self.embed(tokens) + self.pos_embed[:, : tokens.shape[1]])
        for block in self.blocks:
            x = block(x, None)
        return self.head(self.norm(x))


class LanguageModel(LightningModule):
    def __init__(
        self,
        vocab_size: int = 128,
        max_length: int = 128,
        dim: int = 192,
        depth: int = 4,
        num_heads: int = 6,
        dropout: float = 0.1,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        warmup_epochs: float = 0.1,
        schedule: Literal["cosine", "constant"] = "cosine",
        min_lr_ratio: float = 0.1,
        temperature: float = 0.8,
        top_k: int | None = 40,
        max_new_tokens: int = 200,
    ) -> None:
        """
        Args:
            vocab_size: Tokens in the vocabulary (linked from the datamodule).
            max_length: Longest context, in tokens (linked from the datamodule's `context`).
            dim: Width of the token representations.
            depth: Number of transformer blocks.
            num_heads: Attention heads per block (dim must be divisible by it).
            dropout: Dropout on embeddings, attention weights and residual branches.
            optimizer: Any `torch.optim` optimizer, or `MuonAdamW` (Muon for the blocks' weight matrices); its
                `weight_decay` applies to weight matrices only (under MuonAdamW: to the token embedding, and
                `muon_weight_decay` to the blocks' matrices).
            warmup_epochs: Linear warmup length in epochs (fractions allowed).
            schedule: After warmup: `cosine` decay to `min_lr_ratio` x lr at the last step, or `constant`.
            min_lr_ratio: Final learning rate of the cosine schedule, as a fraction of `lr`.
            temperature: `predict`: divides the logits before sampling (lower: safer, more repetitive text); 0:
                greedy, always the likeliest next token.
            top_k: `predict`: sample among the k likeliest next tokens only (at least 1; null: all of them).
            max_new_tokens: `predict`: longest continuation (it also ends at the end of an entry).
        """
        super().__init__()
        if temperature < 0:
            raise ConfigError(f"--model.temperature {temperature}: at least 0 (0: greedy, the likeliest token).")
        if top_k is not None and top_k < 1:
            raise ConfigError(f"--model.top_k {top_k}: at least 1 (null: sample among all tokens).")
        if max_new_tokens < 1:
            raise ConfigError(
                f"--model.max_new_tokens {max_new_tokens}: at least 1 (a continuation also ends where its entry ends)."
            )
        # How to sample is a choice at `predict` time, not part of the trained model: a checkpoint does not fix it.
        self.save_hyperparameters(ignore=["temperature", "top_k", "max_new_tokens"])
        self.hparams["optimizer"] = optimizer_spec(self.hparams["optimizer"])  # data, not code, in checkpoints
        self.temperature, self.top_k, self.max_new_tokens = temperature, top_k, max_new_tokens
        self.net = DecoderNet(vocab_size, max_length, dim, depth, num_heads, dropout)
        self.make_optimizer = optimizer_from_spec(optimizer)
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.example_input_array = torch.zeros(1, max_length, dtype=torch.long)  # one context: the summary's FLOPs

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.net(tokens)

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        logits = self(inputs)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # mean over every predicted token

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> None:
        metric = getattr(self, f"{stage}_loss")
        metric(self._loss(batch), weight=batch[1].numel())  # per token over the split, synced across DDP ranks
        self.log(f"{stage}_loss", metric, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        self._log_bits("val")

    def on_test_epoch_end(self) -> None:
        self._log_bits("test")

    def _log_bits(self, split: str) -> None:
        """Bits per token, and per character where the datamodule counts them (the n-gram baseline's measure)."""
        bits = getattr(self, f"{split}_loss").compute() / LN2
        # The same in every DDP process (compute() syncs); sync_dist tells Lightning so, which a callback monitoring
        # it under DDP requires.
        self.log(f"{split}_bpt", bits, sync_dist=True)
        per_token = getattr(self.trainer.datamodule, "characters_per_token", None)
        if per_token is not None:
            self.log(f"{split}_bpc", bits / per_token(split), sync_dist=True)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, generator: torch.Generator, end_id: int | None = None) -> list[int]:
        """Continue `prompt` [tokens] by up to `max_new_tokens`, one sampled token at a time, until `end_id`."""
        tokens, new = prompt[None].to(self.device), []
        for _ in range(self.max_new_tokens):
            logits = self(tokens[:, -self.net.max_length :])[0, -1]
            if self.temperature == 0:
                next_id = int(logits.argmax())
            else:
                logits = logits / self.temperature
                if self.top_k is not None and self.top_k < logits.numel():
                    kth = torch.topk(logits, self.top_k).values[-1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_id = torch.multinomial(logits.softmax(-1).cpu(), 1, generator=generator).item()
            if next_id == end_id:
                break
            new.append(next_id)
            tokens = torch.cat([tokens, torch.tensor([[next_id]], device=self.device)], dim=1)
        return new

    def predict_step(self, batch: list[Prompt], batch_idx: int) -> list[tuple[str, list[int]]]:
        """(prompt text, generated ids) per prompt; each prompt's random numbers come from (seed, its position)."""
        end = getattr(getattr(self.trainer.datamodule, "vocabulary", None), "eos_id", None)
        return [
            (p.text, self.generate(p.ids, torch.Generator().manual_seed(derive_seed(global_seed(), p.index)), end))
            for p in batch
        ]

    def prediction_rows(self, outputs: list[tuple[str, list[int]]], indices: list[int]) -> list[dict[str, Any]]:
        """The predictions CSV (engine/predictions.py): the prompt as given and its continuation, as text."""
        vocabulary = self.trainer.datamodule.vocabulary
        return [{"prompt": text, "generated": vocabulary.decode(generated)} for text, generated in outputs]

    def parameter_groups(self) -> list[dict[str, Any]]:
        """The weight matrices (decayed), and what is not decayed: norms, biases, positions. Under MuonAdamW the
        blocks' matrices are a group of their own, marked for Muon; under any other optimizer they share the token
        embedding's group, as in the checkpoints of this model trained by one (their optimizer states resume)."""
        factory = optimizer_from_spec(self.hparams["optimizer"])  # a partial of its class, as checkpoints hold it
        optimizer_class = getattr(factory, "func", factory)
        muon = isinstance(optimizer_class, type) and issubclass(optimizer_class, MuonAdamW)
        groups: dict[str, list[nn.Parameter]] = {"hidden": [], "decay": [], "no_decay": []}
        for name, parameter in self.named_parameters():
            if parameter.ndim < 2 or parameter is self.net.pos_embed:
                groups["no_decay"].append(parameter)
            else:
                groups["hidden" if muon and name.startswith("net.blocks.") else "decay"].append(parameter)
        return [
            *([{"params": groups["hidden"], "name": "hidden", "muon": True}] if muon else []),
            {"params": groups["decay"], "name": "decay"},
            {"params": groups["no_decay"], "name": "no_decay", "weight_decay": 0.0},
        ]

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = self.make_optimizer(self.parameter_groups())
        hp = self.hparams
        check_run_length(hp.schedule, self.trainer.max_epochs, self.trainer.max_steps)
        scheduler = WarmupSchedule(
            optimizer,
            total_steps=int(min(self.trainer.estimated_stepping_batches, 2**62)),
            warmup_steps=round(hp.warmup_epochs * steps_per_epoch(self.trainer)),
            schedule=hp.schedule,
            min_lr_ratio=hp.min_lr_ratio,
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
