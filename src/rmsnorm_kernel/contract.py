"""What the Triton path accepts, checked before anything is allocated or written.

Every rejection is a ``ContractError`` whose message names the argument, what it received and what is
accepted. Nothing here falls back to the reference: a caller who wants the reference asks for it.
"""

from __future__ import annotations

import math
import numbers

import torch

from .backend import backend, kernel_device_type

#: Largest row length: a whole row is held in one program's registers (BLOCK = next_power_of_2(N)).
MAX_N = 4096
#: The backward writes one float32 dgamma contribution per element of x before summing it per column.
DGAMMA_SCRATCH_BUDGET_BYTES = 64 * 2**20
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Mixed precision as autocast and Lightning's "16-mixed"/"bf16-mixed" produce it: half x, float32 gamma.
MIXED_PAIRS = ((torch.float16, torch.float32), (torch.bfloat16, torch.float32))

_DTYPE_NAMES = "float32, float16 or bfloat16"


class ContractError(ValueError):
    """The Triton RMSNorm path was given something it cannot compute."""


def _fail(name: str, got: str, accepted: str) -> None:
    raise ContractError(f"rmsnorm (triton): {name} {got}; accepted: {accepted}")


def check_forward(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> None:
    """Validate the arguments of ``rmsnorm(x, gamma, eps)``; raise ``ContractError`` on the first problem."""
    for name, t in (("x", x), ("gamma", gamma)):
        if not isinstance(t, torch.Tensor):
            _fail(name, f"is a {type(t).__name__}", "a torch.Tensor")
    for name, t in (("x", x), ("gamma", gamma)):
        if t.dtype not in SUPPORTED_DTYPES:
            _fail(name, f"has dtype {t.dtype}", _DTYPE_NAMES)
    if x.dtype != gamma.dtype and (x.dtype, gamma.dtype) not in MIXED_PAIRS:
        _fail(
            "x and gamma",
            f"have dtypes {x.dtype} and {gamma.dtype}",
            "the same dtype, or x float16/bfloat16 with gamma float32 (mixed precision)",
        )
    if x.device != gamma.device:
        _fail("x and gamma", f"are on {x.device} and {gamma.device}", "both on the same device")
    if x.device.type != kernel_device_type():
        _fail("x", f"is on {x.device}", f"{kernel_device_type()} tensors (the kernels run on the {backend()} backend)")
    for name, t in (("x", x), ("gamma", gamma)):
        if not t.is_contiguous():
            _fail(name, f"is not contiguous (shape {tuple(t.shape)}, strides {tuple(t.stride())})", "a contiguous tensor")
    if x.dim() == 0:
        _fail("x", "is a 0-d tensor", "a tensor of shape (..., N)")
    n = x.shape[-1]
    if tuple(gamma.shape) != (n,):
        _fail("gamma", f"has shape {tuple(gamma.shape)}", f"shape ({n},), the last dimension of x")
    if x.numel() == 0:
        _fail("x", f"is empty (shape {tuple(x.shape)})", "at least one element")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps <= 0:
        _fail("eps", f"is {eps!r}", "a finite number > 0")
    if n > MAX_N:
        _fail("x", f"has rows of N = {n} elements", f"N <= {MAX_N}")


def dgamma_scratch_bytes(rows: int, n: int) -> int:
    return rows * n * 4


def check_backward_scratch(x: torch.Tensor) -> None:
    """The backward needs one float32 per element of x for dgamma's per-row contributions."""
    n = x.shape[-1]
    rows = x.numel() // n
    need = dgamma_scratch_bytes(rows, n)
    if need > DGAMMA_SCRATCH_BUDGET_BYTES:
        _fail(
            "x",
            f"of shape {tuple(x.shape)} needs a dgamma scratch of {need / 2**20:.1f} MiB in the backward",
            f"rows * N * 4 bytes <= {DGAMMA_SCRATCH_BUDGET_BYTES // 2**20} MiB",
        )
