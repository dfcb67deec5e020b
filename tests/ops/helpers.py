"""What several test modules of ``tests/ops`` share: inputs without rows, and what their results must be."""

from __future__ import annotations

import torch

#: x without rows: a zero first dimension, and a zero among several leading ones.
NO_ROWS = [(0, 33), (2, 0, 33)]
#: (x dtype, gamma dtype): float32, bfloat16, and the mixed-precision pair (bfloat16 x, float32 gamma).
NO_ROWS_DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)]


def dtype_pair_id(pair) -> str:
    return "-".join(str(d).removeprefix("torch.") for d in pair)


def leaves_without_rows(shape, x_dtype, gamma_dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, gamma), both requiring grad: x of ``shape`` (no rows), gamma not all ones."""
    x = torch.randn(shape, device=device).to(x_dtype).requires_grad_()
    gamma = torch.linspace(0.5, 1.5, shape[-1], device=device).to(gamma_dtype).requires_grad_()
    return x, gamma


def assert_empty_y_empty_dx_zero_dgamma(y: torch.Tensor, x: torch.Tensor, gamma: torch.Tensor) -> None:
    """y and dx (x.grad) empty with x's shape and dtype; dgamma (gamma.grad) exactly zeros in gamma's
    shape and dtype: a sum over no rows, not whatever an uninitialised allocation held."""
    assert (y.shape, y.dtype, y.device) == (x.shape, x.dtype, x.device)
    assert x.grad is not None and (x.grad.shape, x.grad.dtype) == (x.shape, x.dtype)
    assert gamma.grad is not None and (gamma.grad.shape, gamma.grad.dtype) == (gamma.shape, gamma.dtype)
    assert torch.equal(gamma.grad, torch.zeros(gamma.shape, dtype=gamma.dtype, device=gamma.device))
