"""The one generator of test inputs: every check, test and benchmark draws x, gamma and dy from here."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def make_inputs(
    shape: Sequence[int],
    dtype: torch.dtype,
    device: str | torch.device,
    gamma_dtype: torch.dtype | None = None,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x ~ N(0, 1), gamma = 1 + 0.5 * N(0, 1) (never all ones) and dy ~ N(0, 1).

    Drawn in float32 from one generator seeded with ``seed`` on ``device`` (so a GB of inputs is made
    where it is used), then cast: the same seed, device and shape give the same values in every dtype.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    shape = tuple(shape)
    x = torch.randn(shape, generator=g, device=device).to(dtype)
    gamma = (1.0 + 0.5 * torch.randn(shape[-1], generator=g, device=device)).to(gamma_dtype or dtype)
    dy = torch.randn(shape, generator=g, device=device).to(dtype)
    return x, gamma, dy
