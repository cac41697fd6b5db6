"""A small causal transformer over the last k observations of an episode.

Input: a window [B, k, features + 1] (fedrl.client.training.obs_window), oldest
first, the current observation last; the extra last feature is 1 where the
step belongs to the episode and 0 on the padding before its first step.
Output: the features of the current (last) position. Only that position's
output is ever used, so the last block computes its query and MLP for the
last position alone (`encode` computes every position, for inspection).

Pre-norm blocks (Xiong et al. 2020: stable without learning-rate warm-up),
learned positional embeddings, and one attention mask that says both
"causal" (position i attends to j <= i only, so nothing from a later step
reaches an earlier one) and "this episode only" (padding is never attended
to). Every position may attend to itself, so no softmax row is all masked:
a fully masked row would be NaN, and NaN times a zero weight is still NaN.
Attention is written out rather than taken from nn.MultiheadAttention, so
it exports to ONNX as plain MatMul/Softmax and runs the same under bf16
autocast on any device.
"""

from __future__ import annotations

import math

import torch
from torch import nn

HEAD_WIDTH = 16
"""Channels per attention head: the head count follows from the width, so a model's tensor
shapes alone say its whole architecture (export and backtest rebuild it from them)."""


class CausalTransformer(nn.Module):
    """Flat windows [B, k·(features + 1)] to the current step's features [B, width]."""

    causal: torch.Tensor

    def __init__(self, *, obs_dim: int, context: int, width: int, layers: int) -> None:
        super().__init__()
        if width % HEAD_WIDTH:
            raise ValueError(f"width must be a multiple of {HEAD_WIDTH}, got {width}")
        self.context = context
        self.obs_dim = obs_dim
        self.embed = nn.Linear(obs_dim, width)
        # Small random start (as GPT-2): equal embeddings would hide the order at first.
        self.position = nn.Parameter(0.02 * torch.randn(context, width))
        self.blocks = nn.ModuleList(_Block(width) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        causal = torch.tril(torch.ones(context, context, dtype=torch.bool))
        self.register_buffer("causal", causal, persistent=False)

    def encode(self, window: torch.Tensor) -> torch.Tensor:
        """Features of every position [B, k, width]; position i depends on steps <= i only."""
        obs, valid = window[..., :-1], window[..., -1] > 0.5
        eye = torch.eye(self.context, dtype=torch.bool, device=window.device)
        # allowed[b, i, j]: query i may read key j.
        allowed = self.causal & (valid[:, None, :] | eye)
        x = self.embed(obs) + self.position
        for block in self.blocks:
            x = block(x, allowed[:, None])
        out: torch.Tensor = self.norm(x)
        return out

    def forward(self, flat: torch.Tensor) -> torch.Tensor:
        window = flat.reshape(-1, self.context, self.obs_dim + 1)
        obs, valid = window[..., :-1], window[..., -1] > 0.5
        eye = torch.eye(self.context, dtype=torch.bool, device=window.device)
        allowed = (self.causal & (valid[:, None, :] | eye))[:, None]
        x = self.embed(obs) + self.position
        *lower, last = self.blocks
        for block in lower:
            x = block(x, allowed)
        out: torch.Tensor = self.norm(last(x, allowed, last_only=True)[:, -1])
        return out


class _Block(nn.Module):
    """x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.heads = width // HEAD_WIDTH
        self.attention_norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(
        self, x: torch.Tensor, allowed: torch.Tensor, *, last_only: bool = False
    ) -> torch.Tensor:
        """[B, k, width] to [B, k, width], or to [B, 1, width] for the last position alone."""
        batch, steps, width = x.shape
        q, k, v = (
            part.reshape(batch, steps, self.heads, HEAD_WIDTH).transpose(1, 2)  # [B, heads, k, 16]
            for part in self.qkv(self.attention_norm(x)).chunk(3, dim=-1)
        )
        if last_only:
            x, q, allowed = x[:, -1:], q[:, :, -1:], allowed[:, :, -1:]
        scores = q @ k.transpose(-2, -1) / math.sqrt(HEAD_WIDTH)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        attended = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, -1, width)
        x = x + self.out(attended)
        out: torch.Tensor = x + self.mlp(self.mlp_norm(x))
        return out
