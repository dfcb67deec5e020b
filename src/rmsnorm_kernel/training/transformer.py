"""A small Llama-style decoder in plain PyTorch, every RMSNorm of it on one path (``norm_impl``).

Token embedding, then ``layers`` pre-norm blocks, then a final norm and an LM head tied to the embedding.
A block is

    normed, residual = attn_norm(hidden, residual)     # residual += hidden; normed = rmsnorm(residual)
    hidden = attention(normed)                         # causal, rotary positions, optional q/k norm
    normed, residual = mlp_norm(hidden, residual)
    hidden = swiglu_mlp(normed)

so each norm after the first is the fused residual add and norm (``RMSNorm.forward(x, residual)``); the
first block's first norm has no residual yet, and the final norm adds the last block's output. With
``qk_norm`` the queries and keys are normalized per head over the head dimension before the rotary
embedding, as Qwen3 and OLMo 2 do. ``rmsnorm_calls`` is how many norm calls one forward makes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.module import RMSNorm


def rmsnorm_calls(layers: int, qk_norm: bool) -> int:
    """Norm calls in one forward: two per block, the final one, and with q/k norm two more per block."""
    return 2 * layers + 1 + (2 * layers if qk_norm else 0)


def rotary_tables(seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of shape (seq_len, head_dim / 2): the rotation angles of each position and pair."""
    freqs = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.arange(seq_len, dtype=torch.float32)[:, None] * freqs[None, :]
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (batch, heads, seq, head_dim): each pair (x1, x2) of its halves rotated by its
    position's angle."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[: x.shape[-2]].to(x.dtype), sin[: x.shape[-2]].to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, qk_norm: bool, norm_impl: str, eps: float, fallback: str | None = None):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        norm = dict(impl=norm_impl, fallback=fallback)
        self.q_norm = RMSNorm(self.head_dim, eps, **norm) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps, **norm) if qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, dim = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).unbind(2)  # each (b, t, heads, head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, dim))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(
        self, dim: int, heads: int, mlp_hidden: int, qk_norm: bool, norm_impl: str, eps: float, fallback: str | None
    ):
        super().__init__()
        self.attn_norm = RMSNorm(dim, eps, impl=norm_impl, fallback=fallback)
        self.attn = Attention(dim, heads, qk_norm, norm_impl, eps, fallback)
        self.mlp_norm = RMSNorm(dim, eps, impl=norm_impl, fallback=fallback)
        self.mlp = SwiGLU(dim, mlp_hidden)

    def forward(self, hidden, residual, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:  # the first block: the embedding is the residual stream
            normed, residual = self.attn_norm(hidden), hidden
        else:
            normed, residual = self.attn_norm(hidden, residual)
        hidden = self.attn(normed, cos, sin)
        normed, residual = self.mlp_norm(hidden, residual)
        return self.mlp(normed), residual


class Transformer(nn.Module):
    """The decoder of the module's doc: ``forward(tokens)`` gives logits (batch, seq, vocab_size)."""

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        layers: int,
        heads: int,
        mlp_hidden: int,
        max_seq_len: int,
        norm_impl: str,
        eps: float = 1e-6,
        qk_norm: bool = False,
        norm_fallback: str | None = None,
    ):
        super().__init__()
        if dim % heads or (dim // heads) % 2:
            raise ValueError(f"Transformer: dim = {dim} over heads = {heads}; accepted: an even head size")
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(
            Block(dim, heads, mlp_hidden, qk_norm, norm_impl, eps, norm_fallback) for _ in range(layers)
        )
        self.final_norm = RMSNorm(dim, eps, impl=norm_impl, fallback=norm_fallback)
        cos, sin = rotary_tables(max_seq_len, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights drawn from N(0, 0.02), the output projections scaled down by the depth (GPT-2's rule),
        norms at ones."""
        depth_scale = 1 / math.sqrt(2 * len(self.blocks))
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue  # norm weights: set by their own modules
            std = 0.02 * (depth_scale if name.endswith(("out.weight", "down.weight")) else 1.0)
            nn.init.normal_(p, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed(tokens), None
        for block in self.blocks:
            hidden, residual = block(hidden, residual, self.cos, self.sin)
        normed, _ = self.final_norm(hidden, residual)
        return normed @ self.embed.weight.T
