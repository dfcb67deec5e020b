"""What the Triton path accepts, checked before anything is allocated or written.

Every rejection is a ``ContractError`` whose message names the argument, what it received and what is
accepted. Nothing here falls back to the reference: a caller who wants the reference asks for it.
"""

from __future__ import annotations

import math
import numbers

import torch

from .backend import backend, kernel_device_type

#: Largest row length. Rows up to kernels.ROW_LIMIT lanes are held whole in registers; longer ones are
#: walked in column chunks, and the dgamma scratch (partial rows * N * 4 bytes) is sized for this N.
MAX_N = 65536
#: The backward's float32 dgamma scratch: one row of N partial sums per persistent program (about two
#: per multiprocessor), whatever the number of rows of x.
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
    if not gamma.is_contiguous():
        _fail("gamma", f"is not contiguous (shape {tuple(gamma.shape)}, strides {tuple(gamma.stride())})", "a contiguous tensor")
    if x.dim() == 0:
        _fail("x", "is a 0-d tensor", "a tensor of shape (..., N)")
    n = x.shape[-1]
    if tuple(gamma.shape) != (n,):
        _fail("gamma", f"has shape {tuple(gamma.shape)}", f"shape ({n},), the last dimension of x")
    if x.numel() == 0:
        _fail("x", f"is empty (shape {tuple(x.shape)})", "at least one element")
    _check_row_layout(x, n)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps <= 0:
        _fail("eps", f"is {eps!r}", "a finite number > 0")
    if n > MAX_N:
        _fail("x", f"has rows of N = {n} elements", f"N <= {MAX_N}")


_LAYOUT_ACCEPTED = "a last dimension of stride 1 and rows at one uniform stride (a contiguous tensor, or a slice x[..., :N] of one)"


def _check_row_layout(x: torch.Tensor, n: int) -> None:
    """The kernels address element (row, j) as row * row_stride + j: the last dimension must be contiguous
    and the leading dimensions must flatten to one row index with a single stride, without a copy."""
    if n != 1 and x.stride(-1) != 1:
        _fail("x", f"has a last dimension of stride {x.stride(-1)} (shape {tuple(x.shape)}, strides {tuple(x.stride())})", _LAYOUT_ACCEPTED)
    if x.dim() > 2:
        try:
            x.view(-1, n)
        except RuntimeError:
            _fail(
                "x",
                f"has rows that no single row stride reaches (shape {tuple(x.shape)}, strides {tuple(x.stride())})",
                _LAYOUT_ACCEPTED,
            )


def dgamma_scratch_bytes(rows: int, n: int, device: torch.device | str | None = None) -> int:
    """Bytes of the float32 dgamma scratch the backward allocates for ``rows`` rows of ``n`` on ``device``."""
    from . import kernels  # late: kernels imports triton, which must come after backend

    device = torch.device(device) if device is not None else torch.device(kernel_device_type())
    return kernels.dgamma_scratch_rows(rows, n, device) * n * 4


def check_backward_scratch(x: torch.Tensor) -> None:
    """The backward's dgamma scratch (partial rows * N float32, bounded whatever the number of rows) must
    fit the budget."""
    n = x.shape[-1]
    rows = x.numel() // n
    if not (isinstance(n, int) and isinstance(rows, int)):
        return  # symbolic shapes while tracing: the backward op checks again with real ones
    need = dgamma_scratch_bytes(rows, n, x.device)
    if need > DGAMMA_SCRATCH_BUDGET_BYTES:
        _fail(
            "x",
            f"of shape {tuple(x.shape)} needs a dgamma scratch of {need / 2**20:.1f} MiB in the backward",
            f"partial rows * N * 4 bytes <= {DGAMMA_SCRATCH_BUDGET_BYTES / 2**20:g} MiB",
        )
