"""The Triton path as a PyTorch operator: ``torch.ops.rmsnorm_kernel.rmsnorm(x, gamma, eps)``.

Registered with ``torch.library.custom_op`` so that ``torch.compile`` treats it as one opaque call (no
graph break), with a fake implementation for tracing and an autograd formula that calls a second
custom op, ``rmsnorm_kernel::rmsnorm_backward``, for dx and dgamma.

``rmsnorm()`` takes that op only while ``torch.compile`` traces. In eager code it checks the contract
once and then, on the GPU, replays the kernels from C++ with a C++ autograd node (``native.py``) when it
can; otherwise it calls the launchers directly, through a plain ``torch.autograd.Function`` when a
gradient is needed. The custom op's Python dispatch (autograd wrapper, fake-tensor bookkeeping, a second
contract check) costs tens of microseconds per call, which is most of the time of a small RMSNorm on a
GPU. All routes run the same kernels and count the same calls.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import kernels, native
from .contract import check_backward_scratch, check_forward
from .reference import DEFAULT_EPS

# How many times the forward and backward wrappers ran, as in Triton's tutorial: a training run that
# silently stayed on the reference path shows zeros here.
_CALLS = {"forward": 0, "backward": 0}


def call_counts() -> dict[str, int]:
    """Calls of the Triton path since import or the last ``reset_call_counts()``: ``{"forward", "backward"}``,
    whichever route (Python or C++) made them."""
    forward, backward = native.call_counts()
    return {"forward": _CALLS["forward"] + forward, "backward": _CALLS["backward"] + backward}


def reset_call_counts() -> None:
    for key in _CALLS:
        _CALLS[key] = 0
    native.reset_call_counts()


@torch.library.custom_op("rmsnorm_kernel::rmsnorm", mutates_args=())
def _rmsnorm_op(x: Tensor, gamma: Tensor, eps: float) -> Tensor:
    check_forward(x, gamma, eps)
    _CALLS["forward"] += 1
    return kernels.rmsnorm_forward(x, gamma, eps)


@_rmsnorm_op.register_fake
def _rmsnorm_fake(x: Tensor, gamma: Tensor, eps: float) -> Tensor:
    check_forward(x, gamma, eps)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, as the kernel writes it


@torch.library.custom_op("rmsnorm_kernel::rmsnorm_backward", mutates_args=())
def _rmsnorm_backward_op(dy: Tensor, x: Tensor, gamma: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    check_backward_scratch(x)
    _CALLS["backward"] += 1
    # Autograd may hand over any layout of dy, e.g. a broadcast (stride-0) gradient from y.sum(); the
    # launcher reads it through its row stride and copies it only when no (rows, N) view exists.
    return kernels.rmsnorm_backward(dy, x, gamma, eps)


@_rmsnorm_backward_op.register_fake
def _rmsnorm_backward_fake(dy: Tensor, x: Tensor, gamma: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty_like(gamma)


def _setup_context(ctx, inputs, output) -> None:
    x, gamma, eps = inputs
    # Runs only when a gradient is needed: refuse a backward that could not run now, not later.
    # (``rmsnorm()`` checks this before the forward; this covers direct calls of the op.)
    check_backward_scratch(x)
    ctx.save_for_backward(x, gamma)
    ctx.eps = eps


def _backward(ctx, dy: Tensor):
    x, gamma = ctx.saved_tensors
    dx, dgamma = torch.ops.rmsnorm_kernel.rmsnorm_backward(dy, x, gamma, ctx.eps)
    return dx, dgamma, None


_rmsnorm_op.register_autograd(_backward, setup_context=_setup_context)


def _refuse_double_backward(ctx, ddx, ddgamma):
    raise NotImplementedError(
        "rmsnorm (triton): gradients of gradients (double backward) are not implemented; accepted: "
        "first-order gradients, or RMSNorm(impl='reference') / rmsnorm_reference for higher orders"
    )


# Without a formula here, a gradient computed with create_graph=True would come back silently
# detached, and a penalty built on it would add nothing to the next backward. Registering one that
# refuses makes that second backward fail with a message instead.
_rmsnorm_backward_op.register_autograd(_refuse_double_backward, setup_context=lambda ctx, inputs, output: None)


class _RMSNormFunction(torch.autograd.Function):
    """The eager route: the same kernels as the custom op, without its dispatch overhead."""

    @staticmethod
    def forward(ctx, x: Tensor, gamma: Tensor, eps: float) -> Tensor:
        _CALLS["forward"] += 1
        ctx.save_for_backward(x, gamma)
        ctx.eps = eps
        return kernels.rmsnorm_forward(x, gamma, eps)

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, gamma = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True: through the backward op, whose own backward refuses with a message
            # (called directly, the kernels would return silently detached gradients).
            dx, dgamma = torch.ops.rmsnorm_kernel.rmsnorm_backward(dy, x, gamma, ctx.eps)
            return dx, dgamma, None
        _CALLS["backward"] += 1
        dx, dgamma = kernels.rmsnorm_backward(dy, x, gamma, ctx.eps)
        return dx, dgamma, None


def rmsnorm(x: Tensor, gamma: Tensor, eps: float = DEFAULT_EPS) -> Tensor:
    """RMSNorm over the last dimension through the Triton kernels; differentiable in x and gamma.

    Raises ``ContractError`` for inputs the kernels cannot handle (see ``contract.py``), before any
    kernel runs. Under ``torch.compile`` it calls the custom op ``torch.ops.rmsnorm_kernel.rmsnorm``
    (one opaque node, no graph break), which checks again for its direct callers; checking here first
    also catches arguments the dispatcher would convert or refuse in its own words (``eps=True``).
    """
    check_forward(x, gamma, eps)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or gamma.requires_grad)
    if needs_grad:
        check_backward_scratch(x)
    if torch.compiler.is_compiling() or type(x) is not Tensor or type(gamma) not in _PLAIN:
        # Tracing, fake tensors and tensor subclasses go through the registered op.
        return torch.ops.rmsnorm_kernel.rmsnorm(x, gamma, eps)
    y = native.apply(x, gamma, eps)  # the C++ route on the GPU; None when it cannot take these arguments
    if y is not None:
        return y
    if needs_grad:
        return _RMSNormFunction.apply(x, gamma, eps)
    _CALLS["forward"] += 1
    return kernels.rmsnorm_forward(x, gamma, eps)


_PLAIN = (Tensor, torch.nn.Parameter)
