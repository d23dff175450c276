"""An encoder-only transformer classifier, written out, for text tokens or image patches.

    inputs -> adapter (token or patch embedding) -> [CLS] + positions -> pre-norm blocks -> pool -> head

One encoder serves both kinds of input; the adapter is chosen by the arguments the
datamodule links in: `vocab_size` (text) or `input_shape` (images, split into patches).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from lightning_template.engine.errors import ConfigError
from lightning_template.tasks.classification.models.base import ClassificationModule, one_sequence
from lightning_template.tasks.classification.models.seam import ClassifierNet


class MultiHeadSelfAttention(nn.Module):
    """Self-attention with a key padding mask, or causal (each token attends to itself and the tokens before it,
    for a decoder). Same parameters and math as `nn.MultiheadAttention`."""

    def __init__(
        self, dim: int, num_heads: int, dropout: float = 0.0, use_sdpa: bool = True, causal: bool = False
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ConfigError(f"dim={dim} must be divisible by num_heads={num_heads}.")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.dropout = dropout
        self.use_sdpa = use_sdpa
        self.causal = causal
        self.qkv = nn.Linear(dim, 3 * dim)  # queries, keys and values in one matmul
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: [batch, tokens, dim]; padding_mask: [batch, tokens], True where the token is padding."""
        batch, tokens, dim = x.shape
        # [batch, tokens, 3 * dim] -> three [batch, heads, tokens, head_dim]
        q, k, v = self.qkv(x).view(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        # Padding is masked as a *key*: no query may attend to it. Padding queries still
        # attend to real tokens (their outputs are ignored by pooling), so no row is
        # ever fully masked and softmax never sees only -inf.
        keep = None if padding_mask is None else ~padding_mask[:, None, None, :]  # [batch, 1, 1, tokens]
        if self.causal:  # token i sees tokens 0..i: the lower triangle, [tokens, tokens]
            causal = torch.ones(tokens, tokens, dtype=torch.bool, device=x.device).tril()
            keep = causal if keep is None else keep & causal
        dropout = self.dropout if self.training else 0.0
        if self.use_sdpa:  # fused kernel (flash / memory-efficient on GPU), same result
            if self.causal and padding_mask is None:  # the kernel's own causal path, without a mask tensor
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # [batch, heads, tokens, tokens]
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
            out = F.dropout(scores.softmax(dim=-1), dropout, self.training) @ v
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, dim))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, dropout: float, causal: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadSelfAttention(dim, num_heads, dropout, causal=causal)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm1(x), padding_mask))
        return x + self.dropout(self.mlp(self.norm2(x)))


class TokenEmbedding(nn.Module):
    """Token ids [batch, tokens] -> embeddings, and the padding mask from `pad_id`."""

    def __init__(self, vocab_size: int, dim: int, pad_id: int) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=pad_id)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.embed(tokens), tokens == self.pad_id


class PatchEmbedding(nn.Module):
    """Images [batch, channels, height, width] -> one embedding per non-overlapping patch (ViT)."""

    def __init__(self, input_shape: tuple[int, int, int], patch_size: int, dim: int) -> None:
        super().__init__()
        channels, height, width = input_shape
        if height % patch_size or width % patch_size:
            raise ConfigError(f"Image size {height}x{width} is not divisible by patch_size={patch_size}.")
        self.num_patches = (height // patch_size) * (width // patch_size)
        # A strided conv is a linear map of each flattened patch.
        self.proj = nn.Conv2d(channels, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.proj(images).flatten(2).transpose(1, 2), None


class TransformerNet(ClassifierNet):
    classifier_name = "head"
    first_conv = "adapter.proj"  # the patch embedding of image input

    def __init__(
        self,
        adapter: TokenEmbedding | PatchEmbedding,
        num_classes: int,
        max_tokens: int,
        dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        dropout: float,
        pooling: Literal["cls", "mean"],
    ) -> None:
        super().__init__()
        self.adapter = adapter
        self.pooling = pooling
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, max_tokens + 1, dim))  # learned, +1 for [CLS]
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, num_heads, mlp_ratio, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward_features(self, inputs: torch.Tensor) -> torch.Tensor:
        x, padding_mask = self.adapter(inputs)
        batch, tokens, _ = x.shape
        if tokens + 1 > self.pos_embed.shape[1]:
            raise ConfigError(f"{tokens} tokens exceed max_length={self.pos_embed.shape[1] - 1}; truncate the input.")
        x = torch.cat([self.cls_token.expand(batch, -1, -1), x], dim=1) + self.pos_embed[:, : tokens + 1]
        if padding_mask is not None:
            padding_mask = F.pad(padding_mask, (1, 0), value=False)  # [CLS] is never padding
        x = self.dropout(x)
        for block in self.blocks:
            x = block(x, padding_mask)
        x = self.norm(x)
        if self.pooling == "cls":
            return x[:, 0]
        if padding_mask is None:
            return x[:, 1:].mean(dim=1)
        keep = (~padding_mask[:, 1:]).unsqueeze(-1).to(x.dtype)
        return (x[:, 1:] * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return features if pre_logits else self.head(features)

    def no_weight_decay(self) -> set[str]:
        return {"cls_token", "pos_embed", "adapter.embed.weight"}


class TransformerClassifier(ClassificationModule):
    def __init__(
        self,
        num_classes: int = 10,
        vocab_size: int | None = None,
        pad_id: int = 0,
        max_length: int = 256,
        input_shape: tuple[int, int, int] | None = None,
        patch_size: int = 4,
        dim: int = 128,
        depth: int = 4,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        dropout: float = 0.1,
        pooling: Literal["cls", "mean"] = "cls",
        **kwargs: Any,
    ) -> None:
        """
        Args:
            num_classes: Number of output classes (linked from the datamodule).
            vocab_size: Text input: size of the token vocabulary (linked from a text datamodule).
            pad_id: Text input: id of the padding token (linked from a text datamodule).
            max_length: Text input: most tokens per sequence (linked from a text datamodule).
            input_shape: Image input: channels, height, width (linked from an image datamodule).
            patch_size: Image input: side of the square patches that become tokens.
            dim: Width of the token representations.
            depth: Number of transformer blocks.
            num_heads: Attention heads per block (dim must be divisible by it).
            mlp_ratio: Hidden width of each block's MLP, as a multiple of dim.
            dropout: Dropout on embeddings, attention weights and residual branches.
            pooling: `cls` uses the [CLS] token's output; `mean` averages the non-padding tokens.
            **kwargs: Optimizer, schedule and weights settings of `ClassificationModule`.
        """
        if vocab_size is not None:
            adapter: TokenEmbedding | PatchEmbedding = TokenEmbedding(vocab_size, dim, pad_id)
            max_tokens = max_length
        elif input_shape is not None:
            adapter = PatchEmbedding(tuple(input_shape), patch_size, dim)
            max_tokens = adapter.num_patches
        else:
            raise ConfigError("TransformerClassifier needs vocab_size (text) or input_shape (images) from the data.")
        net = TransformerNet(adapter, num_classes, max_tokens, dim, depth, num_heads, mlp_ratio, dropout, pooling)
        super().__init__(net, **kwargs)
        # One sample, for the summary's FLOPs and sizes: a text of max_length tokens, or an image.
        self.example_input_array = (
            one_sequence(max_length, pad_id) if vocab_size is not None else torch.zeros(1, *input_shape)
        )
