"""What the Triton path accepts, checked before anything is allocated or written.

Every rejection is a ``ContractError`` whose message names the argument, what it received and what is
accepted. Nothing here falls back to the reference: a caller who wants the reference asks for it.

Any strides are accepted, as ``F.rms_norm`` accepts them: ``rmsnorm()`` reads x in place when its rows sit
at one row stride with a contiguous last dimension (``launchers.rows_at_one_stride``) and copies it once
otherwise, and copies a gamma that is not contiguous. An x with no rows (a zero anywhere in its leading
dimensions, as an empty expert of a mixture of experts gives) is accepted, as ``F.rms_norm`` accepts it.
Rows of zero elements (N = 0) are refused: there is no mean over no elements.
"""

from __future__ import annotations

import math
import numbers

import torch

from .backend import backend, kernel_device_type
from .reference import ACTIVATIONS, MODES

#: Largest row length the kernels take (``launch.py`` plans how each length is walked).
MAX_N = 65536
#: The dtypes of x, gamma and a residual, in any combination (as ``F.rms_norm`` takes them). float64 x is
#: computed in float64 (so that gradcheck runs on the kernels), the others in float32.
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

_DTYPE_NAMES = "float32, float16, bfloat16 or float64"


class ContractError(ValueError):
    """The Triton RMSNorm path was given something it cannot compute."""


def _fail(name: str, got: str, accepted: str) -> None:
    raise ContractError(f"rmsnorm (triton): {name} {got}; accepted: {accepted}")


_SUPPORTED = frozenset(SUPPORTED_DTYPES)
_KERNEL_DEVICE_TYPE = kernel_device_type()


def check_forward(
    x: torch.Tensor, gamma: torch.Tensor, eps: float, activation: str | None = None, mode: str = "torch"
) -> None:
    """Validate the arguments of ``rmsnorm(x, gamma, eps, activation, mode)``; raise ``ContractError`` on the
    first problem.

    Runs on every call, so the common case takes the fewest attribute reads; the order of the checks
    (and so which problem is reported first) is the documented one: x and gamma are tensors; their
    dtypes; their devices; x not 0-d; N >= 1; gamma of shape (N,); eps; activation; mode;
    N <= MAX_N.
    """
    for name, t in (("x", x), ("gamma", gamma)):
        if not isinstance(t, torch.Tensor):
            _fail(name, f"is a {type(t).__name__}", "a torch.Tensor")
    for name, dt in (("x", x.dtype), ("gamma", gamma.dtype)):
        if dt not in _SUPPORTED:
            _fail(name, f"has dtype {dt}", _DTYPE_NAMES)
    x_device = x.device
    if x_device != gamma.device:
        _fail("x and gamma", f"are on {x_device} and {gamma.device}", "both on the same device")
    if x_device.type != _KERNEL_DEVICE_TYPE:
        _fail("x", f"is on {x_device}", f"{_KERNEL_DEVICE_TYPE} tensors (the kernels run on the {backend()} backend)")
    shape = x.shape
    if not shape:
        _fail("x", "is a 0-d tensor", "a tensor of shape (..., N)")
    n = shape[-1]
    if n == 0:
        _fail(
            "x",
            f"has rows of N = 0 elements (shape {tuple(shape)})",
            f"1 <= N <= {MAX_N} (x may have zero rows, but not rows of zero elements)",
        )
    if gamma.shape != (n,):
        _fail("gamma", f"has shape {tuple(gamma.shape)}", f"shape ({n},), the last dimension of x")
    if type(eps) is not float or not 0.0 < eps < math.inf:  # the fast test first: a positive finite float
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps <= 0:
            _fail("eps", f"is {eps!r}", "a finite number > 0")
    if activation is not None and activation not in ACTIVATIONS:
        _fail("activation", f"is {activation!r}", " or ".join(map(repr, ACTIVATIONS)))
    if mode != "torch" and mode not in MODES:
        _fail("mode", f"is {mode!r}", " or ".join(map(repr, MODES)))
    if n > MAX_N:
        _fail("x", f"has rows of N = {n} elements", f"N <= {MAX_N}")


def check_dtensor(x, gamma, residual=None) -> None:
    """Validate DTensor arguments (one of them is a DTensor, all passed ``check_forward`` and
    ``check_residual``): the kernels normalize each process's own rows, so x must be a DTensor whose
    placements shard leading dimensions (rows: sequence or data parallel) or replicate, a residual a
    DTensor placed as x, and gamma replicated (or a plain tensor)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(x, DTensor):
        _fail("x", "is a plain tensor while gamma is a DTensor", "x a DTensor too, or neither a DTensor")
    for p in x.placements:
        if isinstance(p, Shard) and p.dim % x.dim() == x.dim() - 1:
            _fail(
                "x",
                f"is sharded along its last dimension, the one normalized ({x.placements})",
                "a DTensor sharded along leading dimensions (rows), or replicated",
            )
        if not isinstance(p, (Shard, Replicate)):
            _fail("x", f"has placements {x.placements}", "Shard of a leading dimension, or Replicate")
    if isinstance(gamma, DTensor) and any(not isinstance(p, Replicate) for p in gamma.placements):
        _fail("gamma", f"has placements {gamma.placements}", "Replicate on every mesh dimension")
    if residual is not None and (not isinstance(residual, DTensor) or residual.placements != x.placements):
        got = f"has placements {residual.placements}" if isinstance(residual, DTensor) else "is a plain tensor"
        _fail("residual", got, f"a DTensor placed as x, {x.placements}")


def residual_problem(x: torch.Tensor, residual, residual_in_fp32, kernels: bool = True) -> tuple[str, str, str] | None:
    """(argument, what it got, what is accepted) for the first problem with the residual arguments of
    ``rmsnorm`` or ``RMSNorm.forward``, or None: the residual None or a tensor of x's shape on x's device (any
    strides, as x), in a dtype the kernels take when ``kernels``; ``residual_in_fp32`` a bool, True only
    with a residual. Every path checks these; the other paths take any dtype torch adds."""
    if residual is None:
        if residual_in_fp32 is not False:
            return "residual_in_fp32", f"is {residual_in_fp32!r} without a residual", "False, or a residual tensor"
        return None
    if not isinstance(residual, torch.Tensor):
        return "residual", f"is a {type(residual).__name__}", "a torch.Tensor of x's shape"
    if kernels and residual.dtype not in _SUPPORTED:
        return "residual", f"has dtype {residual.dtype}", _DTYPE_NAMES
    if residual.device != x.device:
        return "residual", f"is on {residual.device}", f"x's device, {x.device}"
    if residual.shape != x.shape:
        return "residual", f"has shape {tuple(residual.shape)}", f"x's shape, {tuple(x.shape)}"
    if type(residual_in_fp32) is not bool:
        return "residual_in_fp32", f"is {residual_in_fp32!r}", "True or False"
    return None


def check_residual(x: torch.Tensor, residual: torch.Tensor | None, residual_in_fp32: bool) -> None:
    """Raise ``ContractError`` for the first ``residual_problem`` of the Triton path's residual arguments."""
    problem = residual_problem(x, residual, residual_in_fp32)
    if problem is not None:
        _fail(*problem)
