"""``RMSNorm``: an ``nn.Module`` with a learnable scale that runs the Triton path, the reference or ``F.rms_norm``."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from .contract import ContractError, check_forward
from .impls import FALLBACKS, IMPLS
from .op import rmsnorm
from .reference import DEFAULT_EPS, rmsnorm_reference

log = logging.getLogger("rmsnorm_kernel")


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, ``y = x * rsqrt(mean(x^2) + eps) * weight``.

    ``impl`` picks the computation only (``impls.IMPLS``): ``"triton"`` (the kernels), ``"reference"``
    (the oracle) or ``"native"`` (``torch.nn.functional.rms_norm``). Every path creates the same
    parameter the same way and draws nothing from the random generator, so swapping paths never
    changes the initial weights.

    ``fallback="reference"`` (off by default) sends inputs that the Triton path's contract refuses to
    the reference instead of raising ``ContractError``. Each such call is counted in
    ``fallback_count``, and the first one logs its reason as a warning.
    """

    def __init__(
        self,
        normalized_shape,
        eps: float = DEFAULT_EPS,
        impl: str = "triton",
        fallback: str | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"RMSNorm: impl is {impl!r}; accepted: {', '.join(map(repr, IMPLS))}")
        if fallback not in FALLBACKS:
            raise ValueError(f"RMSNorm: fallback is {fallback!r}; accepted: None or 'reference'")
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
        self.fallback = fallback
        self.fallback_count = 0
        self.weight = nn.Parameter(torch.ones(normalized_shape, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "reference":
            return rmsnorm_reference(x, self.weight, self.eps)
        if self.impl == "native":
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        if self.fallback == "reference":
            reason = self._refusal(x)
            if reason is not None:
                if self.fallback_count == 0:
                    log.warning(
                        "RMSNorm: %s; using the reference path (fallback='reference'), counted from now on", reason
                    )
                self.fallback_count += 1
                return rmsnorm_reference(x, self.weight, self.eps)
        return rmsnorm(x, self.weight, self.eps)

    def _refusal(self, x: torch.Tensor) -> str | None:
        """Why the Triton path would refuse this call, or None if it accepts it."""
        try:
            check_forward(x, self.weight, self.eps)
        except ContractError as e:
            return str(e)
        return None

    def extra_repr(self) -> str:
        fallback = f", fallback={self.fallback!r}" if self.fallback else ""
        return f"{self.normalized_shape[0]}, eps={self.eps}, impl={self.impl!r}{fallback}"
