"""The registered ops, one per direction and form, and the two functions every route runs them through.

Three ops, none writing anything but its outputs: ``torch.ops.rmsnorm_kernel.rmsnorm(x, gamma, eps,
activation=None, mode="torch")``, ``rmsnorm_kernel::rmsnorm_backward`` (dx and dgamma) and
``rmsnorm_kernel::add_rmsnorm`` (the norm with a fused residual add). ``rmsnorm`` and ``add_rmsnorm`` carry
their autograd formula, so the ops are differentiable when called directly, and ``torch.export`` keeps
them as single nodes of a saved program.

On a GPU they are registered with ``torch.library.triton_op``: under ``torch.compile`` the op's Python runs
once, at trace time, with fake tensors, and puts its kernel launches (``wrap_triton``) and its launch plan
into the graph; the code Inductor generates then launches the kernels itself, and a step under
``mode="reduce-overhead"`` is captured whole in a CUDA graph. Under Triton's interpreter (no GPU) they are
``torch.library.custom_op``s with fake implementations: torch.compile cannot trace interpreted kernels
(``wrap_triton`` hands them back unwrapped), so there each op stays one opaque node of the graph.

``_forward`` and ``_backward`` launch the kernels directly in eager code, where the ops' dispatch would
cost more host time than a small norm's kernels, and call the ops while a tracer runs (torch.compile,
torch.export, torch.jit.trace: a tracer records ops, not kernel launches) and for tensor subclasses.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.library import triton_op, wrap_triton

from . import counters, launchers
from .backend import CUDA, backend
from .contract import check_forward, check_residual
from .reference import output_dtype, residual_dtype


def _register(name: str, fn, fake):
    """``fn`` as the op ``name``: a ``triton_op`` on a GPU (``fn``, traced with fake tensors, is its own
    fake implementation), a ``custom_op`` with ``fake`` under the interpreter (see the module's doc).
    ``fn`` launches through ``wrap_triton``, which outside tracing hands back the kernel itself."""
    if backend() == CUDA:
        return triton_op(name, fn, mutates_args=())
    op = torch.library.custom_op(name, fn, mutates_args=())
    op.register_fake(fake)
    return op


def _rmsnorm_impl(x: Tensor, gamma: Tensor, eps: float, activation: str | None = None, mode: str = "torch") -> Tensor:
    check_forward(x, gamma, eps, activation, mode)
    return launchers.rmsnorm_forward(x, gamma, eps, launch=wrap_triton, activation=activation, mode=mode)


def _rmsnorm_fake(x: Tensor, gamma: Tensor, eps: float, activation: str | None = None, mode: str = "torch") -> Tensor:
    check_forward(x, gamma, eps, activation, mode)
    # contiguous, as the kernel writes it
    return torch.empty(x.shape, dtype=output_dtype(x.dtype, gamma.dtype, mode), device=x.device)


def _rmsnorm_backward_impl(
    dy: Tensor,
    x: Tensor,
    gamma: Tensor,
    eps: float,
    activation: str | None = None,
    mode: str = "torch",
    dh: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    return launchers.rmsnorm_backward(dy, x, gamma, eps, launch=wrap_triton, activation=activation, mode=mode, dh=dh)


def _rmsnorm_backward_fake(
    dy: Tensor,
    x: Tensor,
    gamma: Tensor,
    eps: float,
    activation: str | None = None,
    mode: str = "torch",
    dh: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty_like(gamma)


def _add_rmsnorm_impl(
    x: Tensor,
    residual: Tensor,
    gamma: Tensor,
    eps: float,
    activation: str | None = None,
    mode: str = "torch",
    residual_in_fp32: bool = False,
) -> tuple[Tensor, Tensor]:
    check_forward(x, gamma, eps, activation, mode)
    check_residual(x, residual, residual_in_fp32)
    return launchers.rmsnorm_forward(
        x,
        gamma,
        eps,
        launch=wrap_triton,
        activation=activation,
        mode=mode,
        residual=residual,
        residual_in_fp32=residual_in_fp32,
    )


def _add_rmsnorm_fake(
    x: Tensor,
    residual: Tensor,
    gamma: Tensor,
    eps: float,
    activation: str | None = None,
    mode: str = "torch",
    residual_in_fp32: bool = False,
) -> tuple[Tensor, Tensor]:
    check_forward(x, gamma, eps, activation, mode)
    check_residual(x, residual, residual_in_fp32)
    h_dtype = residual_dtype(x.dtype, residual.dtype, residual_in_fp32)
    y = torch.empty(x.shape, dtype=output_dtype(x.dtype, gamma.dtype, mode), device=x.device)
    return y, torch.empty(x.shape, dtype=h_dtype, device=x.device)


_rmsnorm_op = _register("rmsnorm_kernel::rmsnorm", _rmsnorm_impl, _rmsnorm_fake)
_rmsnorm_backward_op = _register("rmsnorm_kernel::rmsnorm_backward", _rmsnorm_backward_impl, _rmsnorm_backward_fake)
_add_rmsnorm_op = _register("rmsnorm_kernel::add_rmsnorm", _add_rmsnorm_impl, _add_rmsnorm_fake)


_PLAIN = (Tensor, torch.nn.Parameter)


def _through_op(*tensors: Tensor) -> bool:
    """Whether a call goes through the registered ops rather than straight to the launchers: while
    torch.compile, torch.export or torch.jit.trace traces (a tracer records ops, not kernel launches), and
    for tensor subclasses (fake tensors among them), which the ops' dispatch handles."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True
    return any(type(t) not in _PLAIN for t in tensors if t is not None)


def _forward(x, gamma, eps, activation, mode, plan=None, residual=None, residual_in_fp32=False):
    """The forward kernels: y, or (y, h) with a residual."""
    if _through_op(x, gamma, residual):
        if residual is None:
            return torch.ops.rmsnorm_kernel.rmsnorm(x, gamma, eps, activation, mode)
        return torch.ops.rmsnorm_kernel.add_rmsnorm(x, residual, gamma, eps, activation, mode, residual_in_fp32)
    return launchers.rmsnorm_forward(
        x, gamma, eps, plan, activation=activation, mode=mode, residual=residual, residual_in_fp32=residual_in_fp32
    )


def _backward(dy, x, gamma, eps, activation, mode, plan=None, dh=None) -> tuple[Tensor, Tensor]:
    """The backward kernels: (dx, dgamma); with ``dh``, dx is the whole gradient of h."""
    if torch.is_grad_enabled() or _through_op(dy, x, gamma, dh):
        # Through the op also under create_graph=True: its own autograd refuses double backward with a
        # message, where the launchers would return silently detached gradients.
        return torch.ops.rmsnorm_kernel.rmsnorm_backward(dy, x, gamma, eps, activation, mode, dh)
    return launchers.rmsnorm_backward(dy, x, gamma, eps, plan, activation=activation, mode=mode, dh=dh)


def _count(counts: Tensor | None, direction: int) -> None:
    if counts is not None:
        counters.count_call(counts, direction)


# The ops' own autograd formulas, for callers of the ops themselves (``rmsnorm()`` goes through the
# Functions below, which add counting): the same ``_backward``.


def _setup_context(ctx, inputs, output) -> None:
    x, gamma, eps, activation, mode = inputs
    ctx.save_for_backward(x, gamma)
    ctx.eps, ctx.activation, ctx.mode = eps, activation, mode


def _op_backward(ctx, dy: Tensor):
    x, gamma = ctx.saved_tensors
    dx, dgamma = _backward(dy, x, gamma, ctx.eps, ctx.activation, ctx.mode)
    return dx, dgamma, None, None, None


_rmsnorm_op.register_autograd(_op_backward, setup_context=_setup_context)


def _add_setup_context(ctx, inputs, output) -> None:
    x, residual, gamma, eps, activation, mode, _ = inputs
    ctx.save_for_backward(output[1], gamma)  # h, the norm's input
    ctx.eps, ctx.activation, ctx.mode = eps, activation, mode
    ctx.x_dtype, ctx.residual_dtype = x.dtype, residual.dtype


def _add_op_backward(ctx, dy: Tensor | None, dh: Tensor | None):
    h, gamma = ctx.saved_tensors
    return _add_grads(ctx, h, gamma, dy, dh) + (None,) * 4


_add_rmsnorm_op.register_autograd(_add_op_backward, setup_context=_add_setup_context)


def _add_grads(ctx, h: Tensor, gamma: Tensor, dy: Tensor | None, dh: Tensor | None) -> tuple:
    """(dx, dresidual, dgamma) of the norm with a residual, from the gradients of y and h."""
    if dy is None:  # only h went on: an add's gradient, and none for gamma, as unfused code gives
        if dh is None:
            return None, None, None
        return dh.to(ctx.x_dtype), dh.to(ctx.residual_dtype), None
    dh_total, dgamma = _backward(dy, h, gamma, ctx.eps, ctx.activation, ctx.mode, dh=dh)
    # an add passes h's gradient to both of its inputs
    return dh_total.to(ctx.x_dtype), dh_total.to(ctx.residual_dtype), dgamma


def _refuse_double_backward(ctx, ddx, ddgamma):
    raise NotImplementedError(
        "rmsnorm (triton): gradients of gradients (double backward) are not implemented; accepted: "
        "first-order gradients, or RMSNorm(impl='reference') / rmsnorm_reference for higher orders"
    )


# Without a formula here, a gradient computed with create_graph=True would come back silently
# detached, and a penalty built on it would add nothing to the next backward. Registering one that
# refuses makes that second backward fail with a message instead.
_rmsnorm_backward_op.register_autograd(_refuse_double_backward, setup_context=lambda ctx, inputs, output: None)
