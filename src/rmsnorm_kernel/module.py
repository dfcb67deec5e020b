"""``RMSNorm``: an ``nn.Module`` with a learnable scale that runs either the Triton path or the reference."""

from __future__ import annotations

import torch
from torch import nn

from .op import rmsnorm
from .reference import DEFAULT_EPS, rmsnorm_reference

IMPLS = ("triton", "reference")


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, ``y = x * rsqrt(mean(x^2) + eps) * weight``.

    ``impl`` picks the computation only: both paths create the same parameter the same way and draw
    nothing from the random generator, so swapping paths never changes the initial weights.
    """

    def __init__(self, normalized_shape, eps: float = DEFAULT_EPS, impl: str = "triton", device=None, dtype=None):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"RMSNorm: impl is {impl!r}; accepted: {', '.join(map(repr, IMPLS))}")
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        normalized_shape = tuple(normalized_shape)
        if len(normalized_shape) != 1 or not isinstance(normalized_shape[0], int) or normalized_shape[0] < 1:
            raise ValueError(
                f"RMSNorm: normalized_shape is {normalized_shape!r}; accepted: one positive int N (the last dimension)"
            )
        self.normalized_shape = normalized_shape
        self.eps = eps
        self.impl = impl
        self.weight = nn.Parameter(torch.ones(normalized_shape, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "triton":
            return rmsnorm(x, self.weight, self.eps)
        return rmsnorm_reference(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape[0]}, eps={self.eps}, impl={self.impl!r}"
