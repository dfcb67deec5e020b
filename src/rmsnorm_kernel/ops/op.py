"""The Triton path as a PyTorch operator: ``torch.ops.rmsnorm_kernel.rmsnorm(x, gamma, eps)``.

Registered with ``torch.library.custom_op`` so that ``torch.compile`` keeps it as one opaque node (no
graph break, and ``mode="reduce-overhead"`` captures it in a CUDA graph), with a fake implementation for
tracing and an autograd formula that calls a second custom op, ``rmsnorm_kernel::rmsnorm_backward``.

``rmsnorm()`` takes that op while ``torch.compile`` traces, and for tensor subclasses. In eager code it
checks the contract once and calls the launchers directly, through a plain ``torch.autograd.Function``
when a gradient is needed: the custom op's dispatch (autograd wrapper, fake-tensor bookkeeping, a second
contract check) costs tens of microseconds a call, most of the time of a small RMSNorm on a GPU. Both
routes run the same kernels and give the same bits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import kernels
from .contract import check_forward
from .launch import Plan, plan_for
from .reference import DEFAULT_EPS

# How many times the Triton forward and backward ran, per device: one-element int32 counters that the
# kernels themselves increment (see kernels.py), so the count is true also where Python does not run,
# as when a CUDA graph replays a compiled step. A training run that silently stayed on the reference
# path shows zeros here.
_COUNTERS: dict[torch.device, tuple[Tensor, Tensor]] = {}


def _counters(device: torch.device) -> tuple[Tensor, Tensor]:
    c = _COUNTERS.get(device)
    if c is None:
        c = _COUNTERS[device] = (
            torch.zeros(1, dtype=torch.int32, device=device),
            torch.zeros(1, dtype=torch.int32, device=device),
        )
    return c


def call_counts() -> dict[str, int]:
    """How many times the Triton forward and backward ran since import or ``reset_call_counts()``,
    summed over devices: ``{"forward": ..., "backward": ...}``. Counted by the kernels on the device, so
    a call replayed from a CUDA graph counts once per replay. Reading waits for the GPU.

    A call whose x has no rows (shape (0, N), (2, 0, N), ...) launches no kernel and so is not counted:
    it returns an empty y, and its backward an empty dx and a dgamma of zeros, without running anything.
    The counts are those of the calls that computed something."""
    forward = sum(int(f.item()) for f, _ in _COUNTERS.values())
    backward = sum(int(b.item()) for _, b in _COUNTERS.values())
    return {"forward": forward, "backward": backward}


def reset_call_counts() -> None:
    for f, b in _COUNTERS.values():
        f.zero_()
        b.zero_()


def _forward(x: Tensor, gamma: Tensor, eps: float, plan: Plan | None = None) -> Tensor:
    return kernels.rmsnorm_forward(x, gamma, eps, _counters(x.device)[0], plan)


def _backward_kernels(
    dy: Tensor, x: Tensor, gamma: Tensor, eps: float, plan: Plan | None = None
) -> tuple[Tensor, Tensor]:
    return kernels.rmsnorm_backward(dy, x, gamma, eps, _counters(x.device)[1], plan)


@torch.library.custom_op("rmsnorm_kernel::rmsnorm", mutates_args=())
def _rmsnorm_op(x: Tensor, gamma: Tensor, eps: float) -> Tensor:
    check_forward(x, gamma, eps)
    return _forward(x, gamma, eps)


@_rmsnorm_op.register_fake
def _rmsnorm_fake(x: Tensor, gamma: Tensor, eps: float) -> Tensor:
    check_forward(x, gamma, eps)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, as the kernel writes it


@torch.library.custom_op("rmsnorm_kernel::rmsnorm_backward", mutates_args=())
def _rmsnorm_backward_op(dy: Tensor, x: Tensor, gamma: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return _backward_kernels(dy, x, gamma, eps)


@_rmsnorm_backward_op.register_fake
def _rmsnorm_backward_fake(dy: Tensor, x: Tensor, gamma: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty_like(gamma)


def _setup_context(ctx, inputs, output) -> None:
    x, gamma, eps = inputs
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
        ctx.save_for_backward(x, gamma)
        ctx.eps = eps
        # Made once, for both directions; none for an x with no rows, which launches nothing.
        ctx.plan = plan_for(kernels.as_rows(x, x.shape[-1]), gamma) if x.numel() else None
        return _forward(x, gamma, eps, ctx.plan)

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, gamma = ctx.saved_tensors
        if torch.is_grad_enabled():
            # create_graph=True: through the backward op, whose own backward refuses with a message
            # (called directly, the kernels would return silently detached gradients).
            dx, dgamma = torch.ops.rmsnorm_kernel.rmsnorm_backward(dy, x, gamma, ctx.eps)
        else:
            dx, dgamma = _backward_kernels(dy, x, gamma, ctx.eps, ctx.plan)
        return dx, dgamma, None


_PLAIN = (Tensor, torch.nn.Parameter)


def rmsnorm(x: Tensor, gamma: Tensor, eps: float = DEFAULT_EPS) -> Tensor:
    """RMSNorm over the last dimension through the Triton kernels; differentiable in x and gamma.

    Raises ``ContractError`` for inputs the kernels cannot handle (see ``contract.py``), before any
    kernel runs. Under ``torch.compile`` it calls the custom op ``torch.ops.rmsnorm_kernel.rmsnorm``
    (one opaque node, no graph break), which checks again for its direct callers; checking here first
    also catches arguments the dispatcher would convert or refuse in its own words (``eps=True``).

    An x with no rows (shape (0, N), (2, 0, N), ...) gives an empty y of x's shape and dtype and, in
    backward, an empty dx and a dgamma of zeros, as ``F.rms_norm`` and the reference do, eager and
    compiled, without launching a kernel (and so without counting the call, see ``call_counts``).
    Rows of zero elements (N = 0) are refused.
    """
    check_forward(x, gamma, eps)
    if torch.compiler.is_compiling() or type(x) is not Tensor or type(gamma) not in _PLAIN:
        # Tracing, fake tensors and tensor subclasses go through the registered op.
        return torch.ops.rmsnorm_kernel.rmsnorm(x, gamma, eps)
    if torch.is_grad_enabled() and (x.requires_grad or gamma.requires_grad):
        return _RMSNormFunction.apply(x, gamma, eps)
    return _forward(x, gamma, eps)
